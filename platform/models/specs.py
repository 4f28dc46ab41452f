"""What the local model factory builds: plain pydantic specs, importable without torch
(run configs and presets validate against them in the job worker and the console)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator


class TinyModelSpec(BaseModel):
    """Shape of a locally built causal LM. Defaults: a few layers, fast on CPU."""

    architecture: Literal["qwen2", "llama"] = "qwen2"
    vocab_size: int = Field(1024, ge=300)
    hidden_size: int = Field(256, ge=16)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(768, ge=16)
    max_position_embeddings: int = Field(4096, ge=64)
    seed: int = 0

    @model_validator(mode="after")
    def _check_heads(self) -> TinyModelSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} must be divisible by num_heads={self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be divisible by num_kv_heads={self.num_kv_heads}")
        return self


class TinyVisionModelSpec(BaseModel):
    """Shape of a locally built Qwen2-VL model and its image processor."""

    vocab_size: int = Field(1024, ge=300)
    hidden_size: int = Field(128, ge=32)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(256, ge=16)
    max_position_embeddings: int = Field(4096, ge=64)
    vision_depth: int = Field(2, ge=1)
    vision_embed_dim: int = Field(64, ge=16)
    vision_heads: int = Field(4, ge=1)
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 64  # at most 64 visual tokens per image
    seed: int = 0

    @model_validator(mode="after")
    def _check_heads(self) -> TinyVisionModelSpec:
        head_dim, rem = divmod(self.hidden_size, self.num_heads)
        if rem or head_dim % 4:
            raise ValueError(
                f"hidden_size/num_heads must be an integer divisible by 4 for multimodal rope; "
                f"got hidden_size={self.hidden_size}, num_heads={self.num_heads}"
            )
        return self

    @property
    def mrope_section(self) -> list[int]:
        half = self.hidden_size // self.num_heads // 2
        t = half // 4
        h = (half - t) // 2
        return [t, h, half - t - h]
