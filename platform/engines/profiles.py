"""Typed deployment settings for the embedded engine, and the named speed tiers.

A tier is an operator-editable profile: which engine serves it, which weights, how it batches and
speculates. Tiers on the same engine and weights give identical greedy output (speculation only changes
speed); a tier with 8-bit weights (``q8``) or on another engine (``llamacpp``) gives output close to, not
equal to, the model's own, and the serving benchmark reports how often greedy outputs agree.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from posttrain.platform.failures import BadInput

Engine = Literal["embedded", "llamacpp", "vllm"]
Weights = Literal["model", "q8_0"]


class EmbeddedTier(BaseModel):
    """The embedded engine's settings of a tier (llama.cpp takes ``max_num_seqs`` as its parallel slots)."""

    model_config = ConfigDict(extra="forbid")
    prompt_lookup_num_tokens: int = Field(0, ge=0, le=64, description="n-gram draft tokens per step; 0 disables")
    prompt_lookup_max_ngram: int = Field(4, ge=1, le=8)
    prompt_lookup_min_ngram: int = Field(
        3,
        ge=1,
        le=8,
        description="draft only after a match this long: on a CPU, verifying drafts costs a real "
        "model about twice a plain step, so a one-token match's guesses lose time",
    )
    max_num_seqs: int = Field(8, ge=1, description="largest batch decoded together")
    batch_wait_ms: float = Field(2.0, ge=0, description="how long the scheduler waits to fill a batch")


class VllmTier(BaseModel):
    """vLLM's settings of a tier (:class:`~posttrain.platform.engines.vllm.VllmProfile` takes them as its
    defaults; a deployment's ``vllm_overrides`` override them)."""

    model_config = ConfigDict(extra="forbid")
    speculative_ngram_tokens: int = Field(0, ge=0, description="vLLM n-gram speculative tokens; 0 disables")
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)


class TierProfile(BaseModel):
    """How a deployment trades latency for throughput: the engine and weights, and each engine's own settings."""

    name: str
    description: str = ""
    engine: Engine = Field(
        "embedded",
        description="embedded (transformers, any host), llamacpp (llama-server on a "
        "CPU host; `make llamacpp` builds it) or vllm (vLLM: the gpu extra on a GPU host, `make vllm` on a CPU); "
        "a deployment may name another",
    )
    weights: Weights | None = Field(
        None,
        description="model: the model's own weights (a llamacpp tier: its F16 GGUF); "
        "q8_0: 8-bit blocks, about a quarter of fp32's bytes, several times faster decode "
        "on a CPU, output close to the model's own. Default: model, for llamacpp q8_0",
    )
    embedded: EmbeddedTier = Field(default_factory=EmbeddedTier)
    vllm: VllmTier = Field(default_factory=VllmTier)

    def weights_for(self, engine: Engine) -> Weights:
        """The weights ``engine`` serves this tier with: the tier's, else q8_0 on llamacpp and the model's own elsewhere
        (a deployment may run a tier on another engine than the tier names)."""
        return self.weights or ("q8_0" if engine == "llamacpp" else "model")

    @model_validator(mode="before")
    @classmethod
    def _flat_fields(cls, data: Any) -> Any:
        """A tier written before each engine had its own section (its fields side by side, vLLM's prefixed
        ``vllm_``) reads as the same tier: an operator's saved ``tiers.json`` keeps working."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for key in [k for k in data if k in EmbeddedTier.model_fields]:
            data["embedded"] = {**dict(data.get("embedded") or {}), key: data.pop(key)}
        for key in [k for k in data if k.startswith("vllm_") and k[5:] in VllmTier.model_fields]:
            data["vllm"] = {**dict(data.get("vllm") or {}), key[5:]: data.pop(key)}
        return data

    @model_validator(mode="after")
    def _ngram_range(self) -> TierProfile:
        lookup = self.embedded
        if lookup.prompt_lookup_min_ngram > lookup.prompt_lookup_max_ngram:
            raise ValueError(f"tier {self.name!r}: prompt_lookup_min_ngram={lookup.prompt_lookup_min_ngram} is above "
                             f"prompt_lookup_max_ngram={lookup.prompt_lookup_max_ngram}")  # fmt: skip
        return self


DEFAULT_TIERS: dict[str, TierProfile] = {
    "fast": TierProfile(
        name="fast",
        description="low latency per request: prompt-lookup speculation, small batches",
        embedded=EmbeddedTier(prompt_lookup_num_tokens=10, max_num_seqs=4, batch_wait_ms=0.0),
        vllm=VllmTier(speculative_ngram_tokens=5, max_num_seqs=64, max_num_batched_tokens=8192),
    ),
    "standard": TierProfile(
        name="standard",
        description="throughput: plain decoding, larger batches",
        embedded=EmbeddedTier(prompt_lookup_num_tokens=0, max_num_seqs=16, batch_wait_ms=5.0),
        vllm=VllmTier(max_num_seqs=256, max_num_batched_tokens=16384),
    ),
    "q8": TierProfile(
        name="q8",
        description="CPU decoding with 8-bit weights (Q8_0) in the embedded engine: several times the standard tier's "
        "tokens/s for one stream; greedy output close to, not identical with, the model's own",
        weights="q8_0",
        embedded=EmbeddedTier(max_num_seqs=4, batch_wait_ms=0.0),
    ),
    "llamacpp": TierProfile(
        name="llamacpp",
        description="llama.cpp's llama-server on the model's Q8_0 GGUF: the fastest CPU serving (build it once with "
        "`make llamacpp`); greedy output close to, not identical with, the model's own",
        engine="llamacpp",
        embedded=EmbeddedTier(max_num_seqs=4),
    ),
}


MAX_TIERS_FILE_BYTES = 1 << 20


class TiersFileError(BadInput):
    """A tiers file is not a tier catalog; the message says where and how, never what the file holds."""


class TierCatalog(BaseModel):
    """The named tiers, editable as a JSON file."""

    tiers: dict[str, TierProfile] = Field(
        default_factory=lambda: {k: v.model_copy(deep=True) for k, v in DEFAULT_TIERS.items()}
    )

    def get(self, name: str) -> TierProfile:
        if name not in self.tiers:
            raise KeyError(f"unknown tier {name!r}; known tiers: {', '.join(sorted(self.tiers))}")
        return self.tiers[name]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TierCatalog:
        """The catalog saved at ``path``. A deploy job may name any file in the data directory as its tiers
        file, so :class:`TiersFileError` names the file and where and how it is wrong, never what it holds."""
        source = Path(path)
        if source.stat().st_size > MAX_TIERS_FILE_BYTES:
            raise TiersFileError(f"tiers file {source} is over {MAX_TIERS_FILE_BYTES // 1024} KiB: not a tier catalog")
        try:
            return cls.model_validate_json(source.read_bytes())
        except ValidationError as exc:
            problems = "; ".join(_tiers_problem(e) for e in exc.errors())
            raise TiersFileError(f"tiers file {source} is not a tier catalog ({problems}); save one from the Models "
                                 "page, or write it as that page shows it") from None  # fmt: skip

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
    tier: TierProfile = Field(default_factory=lambda: DEFAULT_TIERS["standard"].model_copy(deep=True))
    max_model_len: int | None = Field(None, ge=16, description="prompt + completion tokens; default: the model's")
    max_images_per_prompt: int = Field(4, ge=0)
    max_image_bytes: int = Field(20 * 1024 * 1024, ge=1024)
    max_image_pixels: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="width x height of one image, checked "
        "from its header before it is decoded (a small file can decode to gigabytes)",
    )
    max_request_bytes: int | None = Field(
        None,
        ge=1024,
        description="larger request bodies get a 413; default: "
        "1 MiB of text plus room for the images a vision model accepts",
    )
    seed: int = 0

    @property
    def name(self) -> str:
        return self.served_model_name or Path(self.model_path).name


def _tiers_problem(error: Any) -> str:
    """Where a tiers file is wrong, as the schema names it (a tier's own name, from the file, reads ``<tier>``),
    and pydantic's kind of problem; its message is left out, since a check may quote the file."""
    names = (
        set(TierCatalog.model_fields)
        | set(TierProfile.model_fields)
        | set(EmbeddedTier.model_fields)
        | set(VllmTier.model_fields)
    )
    where = ".".join(str(p) if isinstance(p, int) or p in names else "<tier>" for p in error["loc"])
    return f"{where or '(file)'}: {error['type']}"
