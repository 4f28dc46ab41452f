"""Trainer configurations: one pydantic model per trainer (TRL style), validated at the edge.

    SFTConfig(model="var/models/tiny", domains=["str.copy.letters"], max_steps=50)
    GRPOConfig(model=..., domains=[...], group_size=8, clip_low=0.2, clip_high=0.28, pipeline=True)
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from posttrain.training.scheduler import DomainSpec, SchedulerConfig


class LoRAConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    r: int = Field(default=8, ge=1)
    alpha: int = Field(default=16, ge=1)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class TrainConfig(BaseModel):
    """What every trainer shares: the model, the optimiser, precision, checkpoints."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, description="a Hugging Face model directory (or pass a (model, tokenizer) pair)")
    output_dir: str | None = Field(default=None, description="checkpoints go to <output_dir>/checkpoints")
    device: str = Field(default="auto", description="'auto' (cuda if present), 'cpu', 'cuda', 'cuda:1'")
    bf16: bool | None = Field(default=None, description="bf16 autocast; None: on a bf16-capable GPU only")
    seed: int = 0
    max_steps: int = Field(default=100, ge=1)
    lr: float = Field(default=1e-5, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = Field(default=0, ge=0)
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    lora: LoRAConfig | None = None
    checkpoint_every: int = Field(default=0, ge=0, description="steps between checkpoints (0: only at the end)")
    keep_checkpoints: int = Field(default=2, ge=1)
    resume: bool = Field(default=True, description="continue from the latest checkpoint in output_dir")


class SFTConfig(TrainConfig):
    lr: float = Field(default=1e-4, gt=0)
    domains: list[str] = Field(default_factory=list, description="procedural domains whose references are the targets")
    tasks_per_domain: int = Field(default=256, ge=1)
    difficulty: int = Field(default=1, ge=1)
    jsonl_path: str | None = Field(default=None, description='chat JSONL, one {"messages": [...]} per line')
    max_seq_len: int = Field(default=1024, ge=8)
    packing: bool = True
    micro_batch_size: int = Field(default=4, ge=1, description="rows per forward pass")
    grad_accum_steps: int = Field(default=1, ge=1)


class GRPOConfig(TrainConfig):
    lr: float = Field(default=1e-6, gt=0)
    domains: list[str | DomainSpec] = Field(default_factory=list)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig, description="batch_size = prompts per step")
    group_size: int = Field(default=8, ge=2, description="completions sampled per prompt")
    max_new_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    clip_low: float = Field(default=0.2, ge=0, lt=1)
    clip_high: float = Field(default=0.28, ge=0)
    kl_coef: float = Field(default=0.0, ge=0, description="k3 KL to the initial policy; 0: no reference model")
    scale_by_std: bool = Field(default=True, description="False: Dr. GRPO advantages (no std division)")
    aggregation: Literal["token", "sequence"] = "token"
    micro_batch_size: int = Field(default=8, ge=1, description="completions per forward/backward in the update")
    updates_per_batch: int = Field(default=1, ge=1, description="optimizer steps per rollout batch (mini-batches)")
    max_rollout_batches_per_step: int = Field(default=4, ge=1, description="dynamic sampling: extra draws to replace zero-variance groups")
    pipeline: bool = Field(default=False, description="rollout and verification in background threads")
    max_off_policy_steps: int = Field(default=1, ge=0, description="drop trajectories from policies older than this")
    queue_size: int = Field(default=4, ge=1, description="verified rollout batches waiting for the learner")
    verifier_workers: int | None = Field(default=None, ge=1)
    verifier_timeout_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> GRPOConfig:
        if not self.domains:
            raise ValueError("GRPOConfig.domains is empty: name at least one task domain to train on")
        return self


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    domains: list[str] = Field(min_length=1)
    tasks_per_domain: int = Field(default=32, ge=1)
    difficulty: int = Field(default=1, ge=1)
    seed: int = 0
    max_new_tokens: int = Field(default=256, ge=1)
    batch_size: int = Field(default=16, ge=1)
    device: str = "auto"
