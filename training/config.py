"""Trainer configurations: one pydantic model per trainer, fields grouped by purpose, validated at the edge.

    SFTConfig(model="var/models/tiny", domains=["str.copy.letters"], max_steps=50, optim={"lr": 1e-4})
    GRPOConfig(model=..., domains=[...], optim={"lr": 1e-6}, algorithm={"group_size": 8, "clip_high": 0.28},
               sampling={"max_new_tokens": 256, "temperature": 1.0}, rollout={"backend": "process", "workers": 2},
               checkpoint={"every": 50})

The groups: ``optim`` (optimizer and LR schedule), ``checkpoint`` (when to write, how many to keep,
whether to resume), and for GRPO ``algorithm`` (the objective and its batching), ``sampling`` (how
completions are drawn), ``rollout`` (which backend samples), ``scheduler`` (which tasks, in what
mix) and ``logprob_check``. The run's own fields (model, output_dir, device, seed, max_steps, ...)
stay at the top. A group's field may also be given by its flat name at the top (``lr: 1e-4``,
``group_size: 8``, ``checkpoint_every: 50``: the form configs stored by earlier versions have), and
the older rollout keys (``pipeline``, ``rollout_processes``, ...) map to ``rollout``.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from posttrain.platform.engines.chat_template import resolve_template
from posttrain.platform.jobs.registry import JOB_PATH
from posttrain.platform.sandbox.tools import TOOL_SCHEMAS
from posttrain.platform.tasks.domains import get_domain, prompt_space
from posttrain.platform.tasks.prompt_format import PromptFormat
from posttrain.training.environment_names import environment_names
from posttrain.training.preset_recipes import preset_names, recipe_section
from posttrain.training.scheduler import DomainSpec, SchedulerConfig

# The fixed general check: domains away from the arithmetic presets that SmolLM2-135M-Instruct answers in part
# zero-shot at difficulty 2 (greedy, 16 eval tasks each: 38%, 19%, 25%, 13%), so that a loss shows
GENERAL_DOMAINS = ["compare.is_greater.int", "list.int.max", "list.int.min", "list.word.count"]
GENERAL_DIFFICULTY = 2


class ReplayConfig(BaseModel):
    """Rehearsal against forgetting: a set share of every step's batch drawn from the ``train`` split of general
    domains (by default the general check's), each task put as generated, as the general check puts them. Their
    ``eval`` split, which the general check measures on, is never drawn: a prompt's split is a function of the
    prompt alone, so no difficulty or seed brings an eval prompt into replay.

    SFT: that share of each step's rows (packed by tokens) holds the replay tasks' references; GRPO: that share of
    each batch's prompts are replay tasks, rolled out and rewarded by their verifiers like the rest."""

    model_config = ConfigDict(extra="forbid")
    share: float = Field(
        default=0.1,
        gt=0,
        lt=1,
        description="the share of each step's batch drawn from replay "
        "(SFT: rows; GRPO: prompts), exact over the steps: 0.1 with 4 rows a step is 2 rows in 5 steps",
    )
    domains: list[str] = Field(
        default_factory=lambda: list(GENERAL_DOMAINS),
        min_length=1,
        description="the general domains replayed (their train split only)",
    )
    difficulty: int = Field(default=GENERAL_DIFFICULTY, ge=1)
    tasks_per_domain: int = Field(default=256, ge=1, description="SFT: the replay tasks generated per domain")
    seed: int = 0

    @model_validator(mode="after")
    def _known(self) -> Self:
        for domain in self.domains:
            try:
                spec = get_domain(domain)
            except LookupError as exc:
                raise ValueError(f"replay: {exc}") from None
            if self.difficulty > spec.max_difficulty:
                raise ValueError(
                    f"replay: difficulty {self.difficulty} is out of range for domain {domain!r}; use "
                    f"1..{spec.max_difficulty}"
                )
        if len(set(self.domains)) != len(self.domains):
            raise ValueError(f"replay: a domain is listed twice: {self.domains}")
        return self


class LoRAConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    r: int = Field(default=8, ge=1)
    alpha: int = Field(default=16, ge=1)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class OptimConfig(BaseModel):
    """AdamW and its learning-rate schedule."""

    model_config = ConfigDict(extra="forbid")
    lr: float = Field(default=1e-5, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = Field(default=0, ge=0, description="linear warm-up steps")
    lr_schedule: Literal["constant", "linear", "cosine", "wsd"] = Field(
        default="constant",
        description="after the warm-up: constant; linear or cosine decay to min_lr_ratio * lr; "
        "wsd: constant, then a cosine decay over the last quarter",
    )
    min_lr_ratio: float = Field(
        default=0.0, ge=0, le=1, description="where a decaying schedule ends, as a fraction of lr"
    )
    max_grad_norm: float | None = Field(
        default=1.0, gt=0, description="clip the gradient norm to this (None: no clipping)"
    )


class CheckpointConfig(BaseModel):
    """When a run writes checkpoints under ``<output_dir>/checkpoints``, and whether it resumes from them."""

    model_config = ConfigDict(extra="forbid")
    every: int = Field(default=0, ge=0, description="steps between checkpoints (0: only at the end)")
    keep: int = Field(default=2, ge=1, description="checkpoints kept (older ones are removed)")
    resume: bool = Field(default=True, description="continue from the latest checkpoint in output_dir")


class AlgorithmConfig(BaseModel):
    """The GRPO objective and how an update is batched (:mod:`posttrain.training.grpo`)."""

    model_config = ConfigDict(extra="forbid")
    group_size: int = Field(default=8, ge=2, description="completions sampled per prompt")
    clip_low: float = Field(default=0.2, ge=0, lt=1)
    clip_high: float = Field(default=0.28, ge=0)
    kl_coef: float = Field(default=0.0, ge=0, description="k3 KL to the initial policy; 0: no reference model")
    scale_by_std: bool = Field(default=True, description="False: Dr. GRPO advantages (no std division)")
    aggregation: Literal["token", "sequence"] = "token"
    micro_batch_size: int = Field(default=8, ge=1, description="completions per forward/backward in the update")
    updates_per_batch: int = Field(default=1, ge=1, description="optimizer steps per rollout batch (mini-batches)")
    max_rollout_batches_per_step: int = Field(
        default=4, ge=1, description="dynamic sampling: extra draws to replace zero-variance groups"
    )
    skip_zero_signal: bool = Field(
        default=True,
        description="groups whose rewards all agree skip the update (their "
        "gradient is exactly zero without a KL term); False: they run forward and backward "
        "too, as a plain implementation does (to measure the saving)",
    )
    shared_prompt: bool = Field(
        default=True,
        description="the update runs each group's prompt once and repeats its KV "
        "cache for the group's completions (one learner process); False: every completion with "
        "its whole prompt (to measure the saving)",
    )


class SamplingConfig(BaseModel):
    """How completions are drawn, by every inference engine: rollouts, evaluation, the bench."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_new_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=1.0, ge=0, description="0: greedy")
    top_p: float = Field(default=1.0, gt=0, le=1)


# group -> its model and the flat names its fields had at the top of a config (name in the group: flat name)
_GROUPS: dict[str, tuple[type[BaseModel], dict[str, str]]] = {
    "optim": (OptimConfig, {k: k for k in OptimConfig.model_fields}),
    "checkpoint": (CheckpointConfig, {"every": "checkpoint_every", "keep": "keep_checkpoints", "resume": "resume"}),
    "algorithm": (AlgorithmConfig, {k: k for k in AlgorithmConfig.model_fields}),
    "sampling": (SamplingConfig, {k: k for k in SamplingConfig.model_fields}),
}


def _as_dict(value: Any) -> dict[str, Any]:
    return value.model_dump(exclude_unset=True) if isinstance(value, BaseModel) else dict(value)


def _nest(values: dict[str, Any], groups: tuple[str, ...]) -> dict[str, Any]:
    """``values`` with each group's flat names moved into the group (the group's own entries win)."""
    out = dict(values)
    for group in groups:
        flat = {inner: out.pop(outer) for inner, outer in _GROUPS[group][1].items() if outer in out}
        if flat:
            out[group] = flat | (_as_dict(out[group]) if out.get(group) is not None else {})
    return out


def _with_preset(values: dict[str, Any], section: str, groups: tuple[str, ...]) -> dict[str, Any]:
    """``values`` over the ``section`` fields of the preset their ``preset`` key names; a group in ``groups``
    (``optim``, ...) merges field by field, anything else given replaces the preset's."""
    values = dict(values)
    name = values.pop("preset")
    if name is None:
        return values
    if not isinstance(name, str):
        raise ValueError(f"preset must be a name ({', '.join(preset_names())}), got {name!r}")
    base = _nest(recipe_section(name, section), groups)
    merged = {**base, **values}
    for group in groups:
        if base.get(group) is not None and values.get(group) is not None:
            merged[group] = _as_dict(base[group]) | _as_dict(values[group])
    return merged


class Difficulties(BaseModel):
    """The difficulty a run's procedural domains are put at: one for all, or a domain's own (an SFT run's
    tasks and the evaluation that holds out prompts of the same domains set them alike)."""

    domains: list[str] = Field(default_factory=list)  # each config says what its domains are for
    difficulty: int = Field(default=1, ge=1)
    difficulties: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict, description="a domain's own difficulty, where it differs from difficulty"
    )

    @model_validator(mode="after")
    def _check_difficulties(self) -> Self:
        if unknown := sorted(set(self.difficulties) - set(self.domains)):
            raise ValueError(f"difficulties names {unknown}, which domains does not list")
        return self

    def difficulty_of(self, domain: str) -> int:
        return self.difficulties.get(domain, self.difficulty)


class TrainConfig(BaseModel):
    """What every trainer shares: the model, the optimiser, precision, checkpoints.

    ``preset: <name>`` in the input fills every field it leaves out from that preset
    (:mod:`posttrain.training.presets`).
    """

    model_config = ConfigDict(extra="forbid")
    preset_section: ClassVar[str] = ""

    model: str | None = Field(
        default=None, description="a model directory or, in a job, a registered model name", json_schema_extra=JOB_PATH
    )
    register_as: str | None = Field(
        default=None,
        max_length=200,
        pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$",
        description="in a job: register the final model under this name "
        "(default '<kind>-job<id>'); a plain name, it is a directory under models/",
    )
    output_dir: str | None = Field(
        default=None, description="checkpoints go to <output_dir>/checkpoints", json_schema_extra=JOB_PATH
    )
    device: str = Field(default="auto", description="'auto' (cuda if present), 'cpu', 'cuda', 'cuda:1'")
    bf16: bool | None = Field(default=None, description="bf16 autocast; None: on a bf16-capable GPU only")
    seed: int = 0
    max_steps: int = Field(default=100, ge=1)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    lora: LoRAConfig | None = Field(
        default=None,
        description="train LoRA adapters only (merged into the model the "
        "run registers); the base weights stay the starting policy's",
    )
    replay: ReplayConfig | None = Field(
        default=None,
        description="rehearse general domains' train split in a share of every batch, against forgetting (None: off)",
    )
    chat_template: str | None = Field(
        default=None,
        min_length=1,
        max_length=100_000,
        description="how prompts and answers are rendered: a chat template (a family: "
        "chatml, gemma; or a Jinja template), or completion: the plain completion "
        "format, prompt and answer as text (Question: ... Answer: ..., the answer "
        "ended by EOS), as evaluation puts a base model's tasks; stored with the model "
        "the run makes. None: the model's own chat template, or for a base model "
        "(none) the completion format",
    )
    activation_checkpointing: bool = Field(
        default=False,
        description="recompute each layer's activations in the "
        "backward pass instead of keeping them: a long sequence's memory for about "
        "a third more update compute (GRPO then runs each completion with its "
        "prompt: a group's prompt is not run once for all)",
    )
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    nproc_per_node: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="learner processes (one per GPU) under torchrun "
        "with FSDP; 1: train in the job's own process. A step's global batch is the one "
        "process's, split across the processes",
    )

    groups: ClassVar[tuple[str, ...]] = ("optim", "checkpoint")
    optim_defaults: ClassVar[dict[str, Any]] = {}  # this trainer's own defaults within optim

    @model_validator(mode="before")
    @classmethod
    def _prepare(cls, values: Any) -> Any:
        """Flat names into their groups, then the preset under what is given, then this trainer's defaults."""
        if not isinstance(values, dict):
            return values
        values = _nest(cls._map_older_keys(values), cls.groups)
        if cls.preset_section and "preset" in values:
            values = _with_preset(values, cls.preset_section, cls.groups)
        if cls.optim_defaults:
            values["optim"] = cls.optim_defaults | (
                _as_dict(values["optim"]) if values.get("optim") is not None else {}
            )
        return values

    @classmethod
    def _map_older_keys(cls, values: dict[str, Any]) -> dict[str, Any]:
        return values

    @field_validator("chat_template")
    @classmethod
    def _template(cls, spec: str | None) -> str | None:
        if spec is not None:
            try:
                resolve_template(spec)
            except ValueError as exc:
                raise ValueError(f"chat_template: {exc}") from None
        return spec

    def updated(self, **changes: Any) -> Self:
        """A validated copy with ``changes`` (flat names allowed: ``lr=1e-3`` changes ``optim.lr`` only)."""
        base = self.model_dump(exclude_unset=True)
        changes = _nest(type(self)._map_older_keys(changes), self.groups)
        for group in self.groups:
            if isinstance(changes.get(group), dict) and isinstance(base.get(group), dict):
                changes[group] = base[group] | changes[group]
        return type(self).model_validate(base | changes)


class EnvironmentConfig(BaseModel):
    """What each rollout is: an environment (:mod:`posttrain.training.environments`) run per episode.

    ``single_turn``: one completion per task (every domain; today's rollouts). ``tool_use``: the policy
    may call the sandbox tools over several turns before it answers; ``code_repair``: it fixes a small
    project in a sandbox. Others come from plugins (the ``posttrain.environments`` entry-point group)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(
        default="single_turn",
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="single_turn, tool_use, code_repair, or a plugin's name",
    )
    max_turns: int = Field(default=4, ge=1, le=64, description="policy turns per episode, at most")
    max_episode_tokens: int = Field(
        default=2048, ge=16, description="prompt, policy and tool tokens of one episode, at most"
    )
    episode_timeout_s: float = Field(default=120.0, gt=0, description="wall clock of one episode, tools included")
    tool_timeout_s: float = Field(default=10.0, gt=0, description="wall clock of one tool call")
    tool_output_chars: int = Field(default=2000, ge=64, description="what the policy sees of one tool result, at most")
    tools: list[str] | None = Field(default=None, description="the tools offered (None: the environment's own)")
    concurrency: int = Field(default=8, ge=1, le=256, description="episodes run at once (and sandboxes kept warm)")
    infra_retries: int = Field(default=2, ge=0, le=10, description="times an episode whose sandbox failed is redone")
    options: dict[str, Any] = Field(default_factory=dict, description="the environment's own settings")

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in (known := environment_names()):
            raise ValueError(
                f"no environment {name!r}; known: {', '.join(known)} (a plugin publishes one under "
                "the entry-point group 'posttrain.environments')"
            )
        return name

    @field_validator("tools")
    @classmethod
    def _tools(cls, tools: list[str] | None) -> list[str] | None:
        if tools is not None and (unknown := [t for t in tools if t not in TOOL_SCHEMAS]):
            raise ValueError(f"unknown tools {unknown}; the sandbox has {', '.join(TOOL_SCHEMAS)}")
        return tools

    @property
    def multi_turn(self) -> bool:
        return self.name != "single_turn"


class DemonstrationsConfig(BaseModel):
    """Expert episodes an SFT run makes before it trains (:mod:`posttrain.training.demonstrations`): a scripted
    agent repairs each ``train``-split task of ``domains`` through the real ``code_repair`` environment in real
    sandboxes; the episodes whose final module passes every hidden test are the SFT data, trained on the policy's
    tokens only. They are written to ``<output_dir>/demonstrations.jsonl`` once; a resumed run reads them back."""

    model_config = ConfigDict(extra="forbid")
    domains: list[DomainSpec] = Field(
        min_length=1, description="repair.* domains (with their difficulty) to demonstrate"
    )
    tasks_per_domain: int = Field(default=32, ge=1, le=4096)
    seed: int = 0
    environment: EnvironmentConfig = Field(
        default_factory=lambda: EnvironmentConfig(name="code_repair", max_turns=8, max_episode_tokens=4096),
        description="the environment the episodes run in: the GRPO run's, so the "
        "tools offered and the prompt are the ones it will see",
    )

    @field_validator("domains")
    @classmethod
    def _repair(cls, domains: list[DomainSpec]) -> list[DomainSpec]:
        if not_repair := [d.name for d in domains if not d.name.startswith("repair.")]:
            raise ValueError(f"demonstrations are of code repair: {not_repair} are not repair.* domains")
        return domains

    @field_validator("environment")
    @classmethod
    def _environment(cls, environment: EnvironmentConfig) -> EnvironmentConfig:
        if environment.name != "code_repair":
            raise ValueError(f"demonstrations run in the code_repair environment, not {environment.name!r}")
        return environment


class SelfGeneratedConfig(BaseModel):
    """Rejection sampling, SFT on the model's own successes ("Retaining by Doing": on-policy data forgets less than an
    expert's text): before the first step the starting model answers each procedural ``train``-split task of the run
    ``samples`` times, the task's verifier grades every answer, and the first ``keep_per_task`` that reach
    ``min_reward`` are trained on, token for token as sampled, in place of the tasks' references (beside them with
    ``with_references``) and beside any demonstrations or chat data. With ``demonstrations`` the model also plays
    ``samples`` whole episodes of each demonstrated task in their environment (real sandboxes), and the episodes its
    rubric passes are trained on beside the expert's, the policy's tokens only. Written once to
    ``<output_dir>/self-generated.jsonl`` (episodes with their rewards) and read back on resume. A model that passes
    nothing fails the run only where nothing else is left to train on."""

    model_config = ConfigDict(extra="forbid")
    samples: int = Field(default=4, ge=1, le=64, description="answers sampled per task")
    keep_per_task: int = Field(default=1, ge=1, le=64, description="passing answers kept per task, at most")
    min_reward: float = Field(default=1.0, description="an answer is kept from this reward on")
    temperature: float = Field(default=0.8, gt=0)
    max_new_tokens: int = Field(default=256, ge=1)
    with_references: bool = Field(
        default=False, description="train on the tasks' references too (False: only on the model's own passing answers)"
    )


class SFTConfig(TrainConfig, Difficulties):
    preset_section: ClassVar[str] = "sft"
    optim_defaults: ClassVar[dict[str, Any]] = {"lr": 1e-4}
    domains: list[str] = Field(default_factory=list, description="procedural domains whose references are the targets")
    tasks_per_domain: int = Field(default=256, ge=1)
    prompt_format: PromptFormat | None = Field(
        default=None, description="how the domains' tasks are put (None: as generated)"
    )
    jsonl_path: str | None = Field(
        default=None, description='chat JSONL, one {"messages": [...]} per line', json_schema_extra=JOB_PATH
    )
    episodes_path: str | None = Field(
        default=None,
        description="episodes as JSON lines (demonstrations, or stored rollouts), trained on the policy's tokens only",
        json_schema_extra=JOB_PATH,
    )
    episodes_min_reward: float | None = Field(
        default=None, description="train only on the episodes with at least this reward (None: every one)"
    )
    demonstrations: DemonstrationsConfig | None = Field(
        default=None,
        description="make expert code-repair episodes "
        "first and train on them (written to <output_dir>/demonstrations.jsonl)",
    )
    self_generated: SelfGeneratedConfig | None = Field(
        default=None,
        description="rejection sampling: train on the "
        "starting model's own answers that pass the verifier (written "
        "to <output_dir>/self-generated.jsonl)",
    )
    max_seq_len: int = Field(default=1024, ge=8)
    packing: bool = True
    micro_batch_size: int = Field(default=4, ge=1, description="rows per forward pass")
    grad_accum_steps: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _self_generated(self) -> Self:
        if self.self_generated is not None and not self.domains and self.demonstrations is None:
            raise ValueError(
                "self_generated samples answers to the run's procedural tasks or episodes of its demonstrated "
                "ones: name them in domains or demonstrations"
            )
        if self.self_generated is not None and self.output_dir is None:
            raise ValueError("self_generated writes the answers it keeps under output_dir: set output_dir")
        return self


class SyncRollout(BaseModel):
    """Sample with the learner's own model, verify, update: on-policy, one thing at a time."""

    model_config = ConfigDict(extra="forbid")
    backend: Literal["sync"] = "sync"


class PipelinedRollout(BaseModel):
    """What every pipelined backend shares: rollouts and verification overlap the update, within a staleness
    bound that also caps the work in flight (nothing is sampled that the learner would have to drop)."""

    model_config = ConfigDict(extra="forbid")
    max_off_policy_steps: int = Field(
        default=1,
        ge=0,
        description="train on rollouts at most this many policy "
        "versions old; no more batches are out than can be taken within it",
    )
    queue_size: int = Field(default=4, ge=1, description="verified rollout batches waiting for the learner, at most")


class ThreadRollout(PipelinedRollout):
    """A rollout thread in the learner's process, with its own copy of the policy."""

    backend: Literal["thread"] = "thread"


class ProcessRollout(PipelinedRollout):
    """Local rollout worker processes, each with its own copy of the policy and torch threads
    (:mod:`posttrain.training.rollouts.process`)."""

    backend: Literal["process"] = "process"
    workers: int = Field(default=1, ge=1, le=256, description="rollout worker processes")
    threads: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="torch threads of each rollout process "
        "(None: the cores split evenly between the rollout processes and the learner)",
    )
    learner_threads: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="the learner's torch threads (None: the cores the rollout processes leave, at least 1)",
    )


class RayRollout(PipelinedRollout):
    """Rollout workers and verifiers as Ray actors (:mod:`posttrain.training.rollouts.ray`)."""

    backend: Literal["ray"] = "ray"
    workers: int = Field(
        default=1, ge=1, description="Ray actors that generate rollouts, each with a copy of the policy"
    )
    verifier_actors: int = Field(
        default=1,
        ge=1,
        description="Ray actors that verify, each running a verifier pool of verifier_workers processes",
    )
    worker_gpus: float = Field(default=0, ge=0, description="GPUs each rollout actor claims (0: it samples on CPU)")
    address: str | None = Field(
        default=None,
        description="the Ray cluster (default: POSTTRAIN_RAY_ADDRESS; neither set: a local Ray started for the run)",
    )


class VLLMRollout(BaseModel):
    """Rollouts through vLLM, sampling on-policy; the learner's weights are pushed into it after every update
    (:mod:`posttrain.training.rollouts.vllm`): in the learner's process when its environment has vLLM (a GPU
    host's ``gpu`` extra), else in a process of its own from vLLM's environment (``make vllm``)."""

    model_config = ConfigDict(extra="forbid")
    backend: Literal["vllm"] = "vllm"
    engine: Literal["auto", "colocated", "server"] = Field(
        default="auto",
        description="colocated: vllm.LLM in the learner's process; server: in a process of its own "
        "from vLLM's environment (.venv-vllm); auto: colocated when this environment has vLLM, else server",
    )
    gpu_memory_utilization: float = Field(
        default=0.5, gt=0, le=1, description="the share of the GPU vLLM takes (the learner needs the rest)"
    )
    kv_cache_memory_bytes: int | None = Field(
        default=None, ge=2**20, description="the KV cache in bytes; a CPU host's default is 1 GiB"
    )
    dtype: str = Field(
        default="auto",
        description="vLLM's weight dtype ('auto': the model's on a GPU, float32 on a "
        "CPU host; bf16 drifts from an fp32 learner by about 0.01 in log-prob, which the log-prob check allows)",
    )
    max_model_len: int | None = Field(default=None, ge=16, description="None: the model's own")
    enforce_eager: bool | None = Field(
        default=None,
        description="no compiled graphs (slower decoding, start-up in seconds); None: on a CPU, not on a GPU",
    )
    cpu_threads: int | None = Field(
        default=None,
        ge=1,
        description="a CPU host's vLLM process: compute threads "
        "(None: the learner's torch threads, its share of the cores)",
    )


RolloutConfig = Annotated[
    SyncRollout | ThreadRollout | ProcessRollout | RayRollout | VLLMRollout, Field(discriminator="backend")
]
# the flat keys earlier versions named the rollout side with (GRPOConfig maps them to ``rollout``)
LEGACY_ROLLOUT_KEYS = (
    "pipeline",
    "rollout_processes",
    "rollout_threads",
    "learner_threads",
    "max_off_policy_steps",
    "queue_size",
    "rollout_workers",
    "verifier_actors",
    "rollout_worker_gpus",
    "ray_address",
)


class MismatchTolerance(BaseModel):
    """How far behaviour log-probs (recorded by the inference engine) may drift from the learner's before
    training stops (:func:`posttrain.training.logprob_check.check_logprob_mismatch`).

    The defaults let a bf16 engine through (about 0.01 mean absolute difference is usual) and stop
    one sampling from other weights (a missed weight push, another temperature); an fp32 engine on
    the same device agrees to about 1e-6. ``max_abs_diff`` is off by default: single tokens of a
    bf16 engine can differ by more than 1.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    mean_abs_diff: float = Field(default=0.05, description="fail above this mean |learner - behaviour| log-prob")
    kl_k3: float = Field(default=0.01, description="fail above this k3 estimate of KL(behaviour || learner)")
    max_abs_diff: float | None = Field(default=None, description="fail above this largest |difference| (None: off)")

    @field_validator("mean_abs_diff", "kl_k3", "max_abs_diff")
    @classmethod
    def _positive(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and not value > 0:
            raise ValueError(f"MismatchTolerance.{info.field_name} must be > 0, got {value}")
        return value


class LogprobCheck(MismatchTolerance):
    """Every ``every`` steps, the learner rescores up to ``trajectories`` completions sampled with its current
    weights and compares with the log-probs the inference engine recorded; a drift past the tolerance fails
    the run (train/inference log-prob mismatch: an engine sampling from other weights than the learner's)."""

    every: int = Field(default=1, ge=0, description="steps between checks (0: off)")
    trajectories: int = Field(default=16, ge=1, description="completions rescored per check, at most")


MULTI_TURN_BACKENDS = ("sync", "thread", "vllm")  # where multi-turn episodes run today


class GRPOConfig(TrainConfig):
    preset_section: ClassVar[str] = "grpo"
    groups: ClassVar[tuple[str, ...]] = ("optim", "checkpoint", "algorithm", "sampling")
    optim_defaults: ClassVar[dict[str, Any]] = {"lr": 1e-6}
    domains: list[str | DomainSpec] = Field(
        default_factory=list,
        description="the domains to train on (procedural, or "
        "with task_set: which of its domains; empty there means all of them)",
    )
    task_set: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="a stored task set (built from "
        "documents, JSONL, ...) to train on: its train split, never its eval split",
    )
    prompt_format: PromptFormat | None = Field(
        default=None,
        description="how every task is put to the policy: system "
        "prompt, instruction, worked examples, boxed answers (None: as generated)",
    )
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig, description="batch_size = prompts per step")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    rollout: RolloutConfig = Field(
        default_factory=lambda: SyncRollout(),
        description="where rollouts are sampled: rollout: {backend: sync | thread | process | ray, ...}",
    )
    logprob_check: LogprobCheck = Field(default_factory=LogprobCheck)
    environment: EnvironmentConfig = Field(
        default_factory=EnvironmentConfig,
        description="what one rollout is: environment: {name: single_turn | tool_use | code_repair | <plugin>, ...}",
    )
    verifier_workers: int | None = Field(default=None, ge=1)
    verifier_timeout_s: float | None = Field(default=None, gt=0)
    trajectories_per_step: int = Field(
        default=64,
        ge=0,
        description="in a job: at most this many trajectories of each step go to the database (0: none)",
    )

    @classmethod
    def _map_older_keys(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Stored configs name the rollout side with the flat keys of earlier versions: map them."""
        if not (old := {k: values[k] for k in LEGACY_ROLLOUT_KEYS if k in values}):
            return values
        if "rollout" in values:
            raise ValueError(
                f"set the rollout side either as rollout: {{backend: ...}} or with the older flat keys "
                f"{sorted(old)}, not both"
            )
        given = {k: v for k, v in old.items() if v is not None}
        bound: dict[str, Any] = {k: given[k] for k in ("max_off_policy_steps", "queue_size") if k in given}
        renamed = {
            "rollout_threads": "threads",
            "learner_threads": "learner_threads",
            "verifier_actors": "verifier_actors",
            "rollout_worker_gpus": "worker_gpus",
            "ray_address": "address",
        }
        extra = {renamed[k]: v for k, v in given.items() if k in renamed}
        rollout: dict[str, Any]
        if given.get("rollout_workers"):
            rollout = {
                "backend": "ray",
                "workers": given["rollout_workers"],
                **bound,
                **{k: v for k, v in extra.items() if k in RayRollout.model_fields},
            }
        elif given.get("pipeline") and given.get("rollout_processes", 1):
            rollout = {
                "backend": "process",
                "workers": given.get("rollout_processes", 1),
                **bound,
                **{k: v for k, v in extra.items() if k in ProcessRollout.model_fields},
            }
        elif given.get("pipeline"):
            rollout = {"backend": "thread", **bound}
        else:
            rollout = {"backend": "sync"}  # the pipelined knobs meant nothing without pipeline
        return {k: v for k, v in values.items() if k not in old} | {"rollout": rollout}

    @model_validator(mode="after")
    def _check(self) -> GRPOConfig:
        if not self.domains and self.task_set is None:
            raise ValueError("GRPOConfig.domains is empty: name at least one task domain to train on, or a task_set")
        if listed := [
            d.name for d in self.domains if isinstance(d, DomainSpec) and d.tasks and (d.task_set or self.task_set)
        ]:
            raise ValueError(f"domains {listed} list their own tasks; with a task_set the tasks come from the set")
        if self.sampling.temperature <= 0:
            raise ValueError(
                "GRPO samples its rollouts: sampling.temperature must be above 0 (1.0 samples the policy as it is)"
            )
        if self.replay is not None and self.environment.name == "code_repair":
            raise ValueError(
                "replay rehearses general tasks, which have no project to repair: the code_repair "
                "environment cannot run them; replay in the SFT stage, or train in single_turn"
            )
        if self.replay is not None and (
            trained := sorted({d if isinstance(d, str) else d.name for d in self.domains} & set(self.replay.domains))
        ):
            raise ValueError(
                f"replay domains {trained} are trained on already: replay rehearses domains the run does "
                "not train on (remove them from replay.domains)"
            )
        if self.environment.multi_turn and self.rollout.backend not in MULTI_TURN_BACKENDS:
            raise ValueError(
                f"environment {self.environment.name!r} runs episodes on the rollout backends "
                f"{', '.join(MULTI_TURN_BACKENDS)}; set rollout: {{backend: thread}} (pipelined) or sync"
            )
        return self


class GeneralCheck(BaseModel):
    """A fixed check beside an evaluation, on domains the run did not train on, each put as generated: what
    training may have cost elsewhere (forgetting), reported as ``general/pass@1`` beside the gain."""

    model_config = ConfigDict(extra="forbid")
    domains: list[str] = Field(default_factory=lambda: list(GENERAL_DOMAINS), min_length=1)
    difficulty: int = Field(default=GENERAL_DIFFICULTY, ge=1)
    tasks_per_domain: int = Field(default=32, ge=1)
    max_new_tokens: int = Field(default=48, ge=1)


class EvalConfig(Difficulties):
    """Held-out evaluation of one model, or a before/after comparison of several.

    ``samples == 1``: greedy decoding, ``pass@1`` is the greedy pass rate.
    ``samples = n > 1``: ``n`` completions per task at ``temperature``; ``pass@k`` for each
    ``k`` in ``ks`` (``k <= n``) with the unbiased estimator ``1 - C(n - c, k) / C(n, k)``.
    """

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(
        default=None, description="a registered model name or a model directory", json_schema_extra=JOB_PATH
    )
    models: list[str] = Field(
        default_factory=list,
        description="several models to compare (the first is the baseline)",
        json_schema_extra=JOB_PATH,
    )
    task_set: str | None = Field(
        default=None,
        description="a stored task set to draw tasks from (its eval split); "
        "unset: the procedural domains generate them",
    )
    domains: list[str] = Field(
        default_factory=list, description="domains to evaluate; with a task_set, empty means all of its"
    )
    task_sets: dict[str, str] = Field(
        default_factory=dict,
        description="a domain's own stored task set (its split's tasks), beside generated domains or another set's",
    )
    tasks_per_domain: int = Field(default=32, ge=1)
    prompt_format: PromptFormat | None = Field(default=None, description="how the tasks are put (the training run's)")
    general: GeneralCheck | None = Field(
        default=None, description="also the fixed general check on domains not evaluated here (None: off)"
    )
    environment: EnvironmentConfig | None = Field(
        default=None,
        description="run each task as an episode of this "
        "environment (the training run's: tool_use, ...), greedy; None: one "
        "completion per task",
    )
    vllm: VLLMRollout | None = Field(
        default=None,
        description="run the environment's episodes through vLLM loaded from the model's directory (vLLM's "
        "environment: .venv-vllm or the gpu extra), as GRPO's vllm rollouts do; None: the embedded engine",
    )
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
        return _with_preset(values, "eval", ()) if isinstance(values, dict) and "preset" in values else values

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
        if unknown := sorted(set(self.task_sets) - set(self.domains)):
            raise ValueError(f"task_sets names {unknown}, which domains does not list")
        if self.split == "eval":
            for domain in self.domains:
                if self.task_set_of(domain) is None:
                    _check_held_out([domain], self.difficulty_of(domain))
        if self.general is not None:
            _check_held_out(self.general.domains, self.general.difficulty)
        return self

    def task_set_of(self, domain: str) -> str | None:
        """The stored task set ``domain``'s tasks come from (None: generated)."""
        return self.task_sets.get(domain, self.task_set)

    @property
    def model_list(self) -> list[str]:
        return list(self.models) if self.models else ([self.model] if self.model is not None else [])


def _check_held_out(domains: list[str], difficulty: int) -> None:
    """Every domain must hold out an eval split at ``difficulty``: refused here, at submit, not mid-job."""
    for domain in domains:
        try:
            spec = get_domain(domain)
        except LookupError as exc:
            raise ValueError(str(exc)) from None
        if difficulty > spec.max_difficulty:
            raise ValueError(
                f"difficulty {difficulty} is out of range for domain {domain!r}; use 1..{spec.max_difficulty}"
            )
        space = prompt_space(domain, difficulty)
        if not space.has_held_out_split:
            raise ValueError(space.refusal())
