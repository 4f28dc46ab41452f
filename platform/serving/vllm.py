"""A typed vLLM deployment profile turned into ``vllm serve`` arguments."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from posttrain.platform.serving.profiles import TierProfile


class VllmProfile(BaseModel):
    """Everything a GPU deployment needs; defaults suit one GPU and a long-context text model."""

    model_path: str
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    max_model_len: int = Field(32768, ge=256)
    gpu_memory_utilization: float = Field(0.90, gt=0.0, le=1.0)
    enable_prefix_caching: bool = True
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    enable_chunked_prefill: bool = True
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    tensor_parallel_size: int = Field(1, ge=1)
    limit_mm_per_prompt: dict[str, int] | None = None
    speculative_ngram_tokens: int = Field(0, ge=0, description="n-gram speculation; 0 disables")
    prompt_lookup_max: int = Field(4, ge=1)
    prompt_lookup_min: int = Field(2, ge=1)
    tool_call_parser: str | None = "hermes"
    dtype: str = "auto"
    seed: int = 0
    extra_args: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> VllmProfile:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min={self.prompt_lookup_min} > prompt_lookup_max={self.prompt_lookup_max}")
        if self.max_num_batched_tokens is not None and not self.enable_chunked_prefill \
                and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} < max_model_len={self.max_model_len} "
                "needs enable_chunked_prefill=True, or a long prompt can never be scheduled")
        return self

    @classmethod
    def for_tier(cls, model_path: str, tier: TierProfile, **overrides: object) -> VllmProfile:
        """The profile for a speed tier: same weights, the tier's batching and speculation."""
        fields: dict[str, object] = {
            "model_path": model_path,
            "speculative_ngram_tokens": tier.vllm_speculative_ngram_tokens,
            "max_num_seqs": tier.vllm_max_num_seqs,
            "max_num_batched_tokens": tier.vllm_max_num_batched_tokens,
        }
        fields.update(overrides)
        return cls.model_validate(fields)

    def long_context(self, max_model_len: int) -> VllmProfile:
        """Same profile for long prompts: fp8 KV cache, chunked prefill, prefix caching."""
        return self.model_copy(update={"max_model_len": max_model_len, "kv_cache_dtype": "fp8",
                                       "enable_chunked_prefill": True, "enable_prefix_caching": True})

    def to_args(self, executable: str = "vllm") -> list[str]:
        args = [executable, "serve", self.model_path, "--host", self.host, "--port", str(self.port),
                "--max-model-len", str(self.max_model_len),
                "--gpu-memory-utilization", str(self.gpu_memory_utilization),
                "--tensor-parallel-size", str(self.tensor_parallel_size),
                "--dtype", self.dtype, "--seed", str(self.seed),
                "--kv-cache-dtype", self.kv_cache_dtype,
                "--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching",
                "--enable-chunked-prefill" if self.enable_chunked_prefill else "--no-enable-chunked-prefill"]
        if self.served_model_name:
            args += ["--served-model-name", self.served_model_name]
        if self.max_num_batched_tokens is not None:
            args += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.max_num_seqs is not None:
            args += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.limit_mm_per_prompt:
            args += ["--limit-mm-per-prompt", json.dumps(self.limit_mm_per_prompt)]
        if self.speculative_ngram_tokens:
            args += ["--speculative-config", json.dumps({
                "method": "ngram", "num_speculative_tokens": self.speculative_ngram_tokens,
                "prompt_lookup_max": self.prompt_lookup_max, "prompt_lookup_min": self.prompt_lookup_min})]
        if self.tool_call_parser:
            args += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
        return args + list(self.extra_args)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"
