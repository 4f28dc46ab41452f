"""Trainer configurations: one pydantic model per trainer (TRL style), validated at the edge.

    SFTConfig(model="var/models/tiny", domains=["str.copy.letters"], max_steps=50)
    GRPOConfig(model=..., domains=[...], group_size=8, clip_low=0.2, clip_high=0.28,
               rollout={"backend": "process", "workers": 2})
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from posttrain.platform.jobs.registry import JOB_PATH
from posttrain.training.scheduler import DomainSpec, SchedulerConfig


class LoRAConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    r: int = Field(default=8, ge=1)
    alpha: int = Field(default=16, ge=1)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


def _with_preset(values: Any, section: str) -> Any:
    from posttrain.training.presets import apply_preset  # presets import this module

    return apply_preset(values, section)


class TrainConfig(BaseModel):
    """What every trainer shares: the model, the optimiser, precision, checkpoints.

    ``preset: <name>`` in the input fills every field it leaves out from that preset
    (:mod:`posttrain.training.presets`).
    """

    model_config = ConfigDict(extra="forbid")
    preset_section: ClassVar[str] = ""

    model: str | None = Field(default=None, description="a model directory or, in a job, a registered model name",
                              json_schema_extra=JOB_PATH)
    register_as: str | None = Field(default=None, max_length=200, pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$",
                                    description="in a job: register the final model under this name "
                                    "(default '<kind>-job<id>'); a plain name, it is a directory under models/")
    output_dir: str | None = Field(default=None, description="checkpoints go to <output_dir>/checkpoints",
                                   json_schema_extra=JOB_PATH)
    device: str = Field(default="auto", description="'auto' (cuda if present), 'cpu', 'cuda', 'cuda:1'")
    bf16: bool | None = Field(default=None, description="bf16 autocast; None: on a bf16-capable GPU only")
    seed: int = 0
    max_steps: int = Field(default=100, ge=1)
    lr: float = Field(default=1e-5, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = Field(default=0, ge=0)
    lr_schedule: Literal["constant", "linear", "cosine", "wsd"] = Field(default="constant", description="after the "
                                                                       "warm-up: constant; linear or cosine decay to min_lr_ratio * lr; wsd: constant, then "
                                                                       "a cosine decay over the last quarter")
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1, description="where a decaying schedule ends, as a fraction of lr")
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    lora: LoRAConfig | None = None
    checkpoint_every: int = Field(default=0, ge=0, description="steps between checkpoints (0: only at the end)")
    keep_checkpoints: int = Field(default=2, ge=1)
    resume: bool = Field(default=True, description="continue from the latest checkpoint in output_dir")
    nproc_per_node: int = Field(default=1, ge=1, le=1024, description="learner processes (one per GPU) under torchrun "
                                "with FSDP; 1: train in the job's own process. A step's global batch is the one "
                                "process's, split across the processes")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, values: Any) -> Any:
        return _with_preset(values, cls.preset_section) if cls.preset_section else values


class SFTConfig(TrainConfig):
    preset_section: ClassVar[str] = "sft"
    lr: float = Field(default=1e-4, gt=0)
    domains: list[str] = Field(default_factory=list, description="procedural domains whose references are the targets")
    tasks_per_domain: int = Field(default=256, ge=1)
    difficulty: int = Field(default=1, ge=1)
    jsonl_path: str | None = Field(default=None, description='chat JSONL, one {"messages": [...]} per line',
                                   json_schema_extra=JOB_PATH)
    max_seq_len: int = Field(default=1024, ge=8)
    packing: bool = True
    micro_batch_size: int = Field(default=4, ge=1, description="rows per forward pass")
    grad_accum_steps: int = Field(default=1, ge=1)


class SyncRollout(BaseModel):
    """Sample with the learner's own model, verify, update: on-policy, one thing at a time."""

    model_config = ConfigDict(extra="forbid")
    backend: Literal["sync"] = "sync"


class PipelinedRollout(BaseModel):
    """What every pipelined backend shares: rollouts and verification overlap the update, within a staleness
    bound that also caps the work in flight (nothing is sampled that the learner would have to drop)."""

    model_config = ConfigDict(extra="forbid")
    max_off_policy_steps: int = Field(default=1, ge=0, description="train on rollouts at most this many policy "
                                      "versions old; no more batches are out than can be taken within it")
    queue_size: int = Field(default=4, ge=1, description="verified rollout batches waiting for the learner, at most")


class ThreadRollout(PipelinedRollout):
    """A rollout thread in the learner's process, with its own copy of the policy."""

    backend: Literal["thread"] = "thread"


class ProcessRollout(PipelinedRollout):
    """Local rollout worker processes, each with its own copy of the policy and torch threads
    (:mod:`posttrain.training.rollouts.process`)."""

    backend: Literal["process"] = "process"
    workers: int = Field(default=1, ge=1, le=256, description="rollout worker processes")
    threads: int | None = Field(default=None, ge=1, le=1024, description="torch threads of each rollout process "
                                "(None: the cores split evenly between the rollout processes and the learner)")
    learner_threads: int | None = Field(default=None, ge=1, le=1024, description="the learner's torch threads "
                                        "(None: the cores the rollout processes leave, at least 1)")


class RayRollout(PipelinedRollout):
    """Rollout workers and verifiers as Ray actors (:mod:`posttrain.training.rollouts.ray`)."""

    backend: Literal["ray"] = "ray"
    workers: int = Field(default=1, ge=1, description="Ray actors that generate rollouts, each with a copy of the policy")
    verifier_actors: int = Field(default=1, ge=1, description="Ray actors that verify, each running a verifier pool "
                                 "of verifier_workers processes")
    worker_gpus: float = Field(default=0, ge=0, description="GPUs each rollout actor claims (0: it samples on CPU)")
    address: str | None = Field(default=None, description="the Ray cluster (default: POSTTRAIN_RAY_ADDRESS; "
                                "neither set: a local Ray started for the run)")


class VLLMRollout(BaseModel):
    """A vLLM engine in the learner's process, on its GPU, sampling on-policy; the learner's weights are
    pushed into it after every update (:mod:`posttrain.training.rollouts.vllm`)."""

    model_config = ConfigDict(extra="forbid")
    backend: Literal["vllm"] = "vllm"
    gpu_memory_utilization: float = Field(default=0.5, gt=0, le=1, description="the share of the GPU vLLM takes "
                                          "(the learner needs the rest)")
    dtype: str = Field(default="auto", description="vLLM's weight dtype ('auto': the model's; bf16 drifts from an "
                       "fp32 learner by about 0.01 in log-prob, which the log-prob check allows)")
    max_model_len: int | None = Field(default=None, ge=16, description="None: the model's own")
    enforce_eager: bool = Field(default=False, description="no CUDA graphs (slower decoding, faster start)")


RolloutConfig = Annotated[SyncRollout | ThreadRollout | ProcessRollout | RayRollout | VLLMRollout,
                          Field(discriminator="backend")]
# the flat keys earlier versions named the rollout side with (GRPOConfig maps them to ``rollout``)
LEGACY_ROLLOUT_KEYS = ("pipeline", "rollout_processes", "rollout_threads", "learner_threads", "max_off_policy_steps",
                       "queue_size", "rollout_workers", "verifier_actors", "rollout_worker_gpus", "ray_address")


class LogprobCheck(BaseModel):
    """Every ``every`` steps, the learner rescores up to ``trajectories`` completions sampled with its current
    weights and compares with the log-probs the inference engine recorded; a drift past a tolerance fails
    the run (train/inference log-prob mismatch: an engine sampling from other weights than the learner's)."""

    model_config = ConfigDict(extra="forbid")
    every: int = Field(default=1, ge=0, description="steps between checks (0: off)")
    trajectories: int = Field(default=16, ge=1, description="completions rescored per check, at most")
    mean_abs_diff: float = Field(default=0.05, gt=0, description="fail above this mean |learner - behaviour| log-prob")
    kl_k3: float = Field(default=0.01, gt=0, description="fail above this k3 estimate of KL(behaviour || learner)")
    max_abs_diff: float | None = Field(default=None, gt=0, description="fail above this largest |difference| (None: off)")


class GRPOConfig(TrainConfig):
    preset_section: ClassVar[str] = "grpo"
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
    rollout: RolloutConfig = Field(default_factory=lambda: SyncRollout(), description="where rollouts are sampled: "
                                   "rollout: {backend: sync | thread | process | ray, ...}")
    logprob_check: LogprobCheck = Field(default_factory=LogprobCheck)
    verifier_workers: int | None = Field(default=None, ge=1)
    verifier_timeout_s: float | None = Field(default=None, gt=0)
    trajectories_per_step: int = Field(default=64, ge=0, description="in a job: at most this many trajectories "
                                       "of each step go to the database (0: none)")

    @model_validator(mode="before")
    @classmethod
    def _flat_rollout_keys(cls, values: Any) -> Any:
        """Stored configs name the rollout side with the flat keys of earlier versions: map them."""
        if not isinstance(values, dict) or not (old := {k: values[k] for k in LEGACY_ROLLOUT_KEYS if k in values}):
            return values
        if "rollout" in values:
            raise ValueError(f"set the rollout side either as rollout: {{backend: ...}} or with the older flat keys "
                             f"{sorted(old)}, not both")
        given = {k: v for k, v in old.items() if v is not None}
        bound = {k: given[k] for k in ("max_off_policy_steps", "queue_size") if k in given}
        renamed = {"rollout_threads": "threads", "learner_threads": "learner_threads", "verifier_actors": "verifier_actors",
                   "rollout_worker_gpus": "worker_gpus", "ray_address": "address"}
        extra = {renamed[k]: v for k, v in given.items() if k in renamed}
        rollout: dict[str, Any]
        if given.get("rollout_workers"):
            rollout = {"backend": "ray", "workers": given["rollout_workers"], **bound,
                       **{k: v for k, v in extra.items() if k in RayRollout.model_fields}}
        elif given.get("pipeline") and given.get("rollout_processes", 1):
            rollout = {"backend": "process", "workers": given.get("rollout_processes", 1), **bound,
                       **{k: v for k, v in extra.items() if k in ProcessRollout.model_fields}}
        elif given.get("pipeline"):
            rollout = {"backend": "thread", **bound}
        else:
            rollout = {"backend": "sync"}  # the pipelined knobs meant nothing without pipeline
        return {k: v for k, v in values.items() if k not in old} | {"rollout": rollout}

    @model_validator(mode="after")
    def _check(self) -> GRPOConfig:
        if not self.domains:
            raise ValueError("GRPOConfig.domains is empty: name at least one task domain to train on")
        return self


class EvalConfig(BaseModel):
    """Held-out evaluation of one model, or a before/after comparison of several.

    ``samples == 1``: greedy decoding, ``pass@1`` is the greedy pass rate.
    ``samples = n > 1``: ``n`` completions per task at ``temperature``; ``pass@k`` for each
    ``k`` in ``ks`` (``k <= n``) with the unbiased estimator ``1 - C(n - c, k) / C(n, k)``.
    """

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, description="a registered model name or a model directory", json_schema_extra=JOB_PATH)
    models: list[str] = Field(default_factory=list, description="several models to compare (the first is the baseline)",
                              json_schema_extra=JOB_PATH)
    task_set: str | None = Field(default=None, description="a stored task set to draw tasks from (its eval split); "
                                 "unset: the procedural domains generate them")
    domains: list[str] = Field(default_factory=list, description="domains to evaluate; with a task_set, empty means all of its")
    tasks_per_domain: int = Field(default=32, ge=1)
    difficulty: int = Field(default=1, ge=1)
    seed: int = 0
    split: Literal["train", "eval"] = "eval"
    samples: int = Field(default=1, ge=1, description="completions per task (1: greedy)")
    ks: list[int] = Field(default_factory=lambda: [1], description="report pass@k for these k (each <= samples)")
    temperature: float = Field(default=1.0, gt=0, description="sampling temperature when samples > 1")
    max_new_tokens: int = Field(default=256, ge=1)
    batch_size: int = Field(default=16, ge=1)
    device: str = "auto"

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, values: Any) -> Any:
        return _with_preset(values, "eval")

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        bad = [k for k in self.ks if k < 1 or k > self.samples]
        if bad:
            raise ValueError(f"ks {bad} must be between 1 and samples={self.samples}; raise samples to report pass@k")
        if self.model is not None and self.models:
            raise ValueError("set either model (one model) or models (a comparison), not both")
        if len(set(self.models)) != len(self.models):
            raise ValueError(f"models lists a model twice: {self.models}")
        if not self.domains and self.task_set is None:
            raise ValueError("name the domains to evaluate, or a task_set to take them from")
        if self.split == "eval" and self.task_set is None:
            self._check_held_out()
        return self

    def _check_held_out(self) -> None:
        """Every domain must hold out an eval split at ``difficulty``: refused here, at submit, not mid-job."""
        from posttrain.platform.tasks.domains import get_domain, prompt_space

        for domain in self.domains:
            try:
                spec = get_domain(domain)
            except LookupError as exc:
                raise ValueError(str(exc)) from None
            if self.difficulty > spec.max_difficulty:
                raise ValueError(f"difficulty {self.difficulty} is out of range for domain {domain!r}; use 1..{spec.max_difficulty}")
            space = prompt_space(domain, self.difficulty)
            if not space.has_held_out_split:
                raise ValueError(space.refusal())

    @property
    def model_list(self) -> list[str]:
        return list(self.models) if self.models else ([self.model] if self.model is not None else [])
