"""Typed deployment settings for the embedded engine, and the named speed tiers.

A tier is an operator-editable profile; the same weights serve every tier and
greedy output is identical across them (speculation only changes speed).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, Field, model_validator


class TierProfile(BaseModel):
    """How a deployment trades latency for throughput. Used by both engines."""

    name: str
    description: str = ""
    # embedded engine
    prompt_lookup_num_tokens: int = Field(0, ge=0, le=64, description="n-gram draft tokens per step; 0 disables")
    prompt_lookup_max_ngram: int = Field(4, ge=1, le=8)
    prompt_lookup_min_ngram: int = Field(
        3, ge=1, le=8, description="draft only after a match this long: on a CPU, verifying drafts costs a real "
        "model about twice a plain step, so a one-token match's guesses lose time")
    max_num_seqs: int = Field(8, ge=1, description="largest batch decoded together")
    batch_wait_ms: float = Field(2.0, ge=0, description="how long the scheduler waits to fill a batch")
    # vLLM
    vllm_speculative_ngram_tokens: int = Field(0, ge=0, description="vLLM n-gram speculative tokens; 0 disables")
    vllm_max_num_seqs: int | None = None
    vllm_max_num_batched_tokens: int | None = None

    @model_validator(mode="after")
    def _ngram_range(self) -> TierProfile:
        if self.prompt_lookup_min_ngram > self.prompt_lookup_max_ngram:
            raise ValueError(f"tier {self.name!r}: prompt_lookup_min_ngram={self.prompt_lookup_min_ngram} is above "
                             f"prompt_lookup_max_ngram={self.prompt_lookup_max_ngram}")  # fmt: skip
        return self


DEFAULT_TIERS: dict[str, TierProfile] = {
    "fast": TierProfile(
        name="fast",
        description="low latency per request: prompt-lookup speculation, small batches",
        prompt_lookup_num_tokens=10,
        max_num_seqs=4,
        batch_wait_ms=0.0,
        vllm_speculative_ngram_tokens=5,
        vllm_max_num_seqs=64,
        vllm_max_num_batched_tokens=8192,
    ),
    "standard": TierProfile(
        name="standard",
        description="throughput: plain decoding, larger batches",
        prompt_lookup_num_tokens=0,
        max_num_seqs=16,
        batch_wait_ms=5.0,
        vllm_max_num_seqs=256,
        vllm_max_num_batched_tokens=16384,
    ),
}


class TierCatalog(BaseModel):
    """The named tiers, editable as a JSON file."""

    tiers: dict[str, TierProfile] = Field(default_factory=lambda: {k: v.model_copy() for k, v in DEFAULT_TIERS.items()})

    def get(self, name: str) -> TierProfile:
        if name not in self.tiers:
            raise KeyError(f"unknown tier {name!r}; known tiers: {', '.join(sorted(self.tiers))}")
        return self.tiers[name]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TierCatalog:
        return cls.model_validate_json(Path(path).read_text())

    def save(self, path: str | os.PathLike[str]) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(json.dumps(self.model_dump(), indent=2))
        tmp.replace(target)


class EngineConfig(BaseModel):
    """One embedded deployment: a model directory served under a name with a tier profile."""

    model_path: str
    served_model_name: str | None = None
    tier: TierProfile = Field(default_factory=lambda: DEFAULT_TIERS["standard"].model_copy())
    max_model_len: int | None = Field(None, ge=16, description="prompt + completion tokens; default: the model's")
    max_images_per_prompt: int = Field(4, ge=0)
    max_image_bytes: int = Field(20 * 1024 * 1024, ge=1024)
    max_image_pixels: int = Field(16 * 1024 * 1024, ge=1024, description="width x height of one image, checked "
                                  "from its header before it is decoded (a small file can decode to gigabytes)")
    max_request_bytes: int | None = Field(None, ge=1024, description="larger request bodies get a 413; default: "
                                          "1 MiB of text plus room for the images a vision model accepts")
    seed: int = 0

    @property
    def name(self) -> str:
        return self.served_model_name or Path(self.model_path).name
