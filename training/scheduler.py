"""Which tasks to train on next: weights, priorities and a pass-rate curriculum over many domains.

    sched = Scheduler(SchedulerConfig(batch_size=8, seed=0))
    for tasks in sched.stream(["arith.add.int", DomainSpec(name="str.copy.letters", priority=1)]):
        ...                                    # roll out, verify
        sched.record(task.domain, passed=[...])  # feed results back; sampling shifts

Each draw picks a domain with probability proportional to

    weight * priority_factor ** priority * factor

where the curriculum's ``factor`` is, by ``weigh_by``:

- ``"pass_rate"``: ``learnability(p) = max(min_factor, 4 p (1 - p))``, which peaks at 1 for a pass rate of
  0.5 and falls toward ``min_factor`` for domains the policy always or never solves;
- ``"signal"``: ``max(min_factor, s)``, where ``s`` is the domain's learning-signal rate: the share of its
  rollout groups whose rewards differ (a group all right or all wrong gives GRPO nothing to learn from),
  estimated online from the run's own rollouts.

An unseen domain counts as p = 0.5 and s = 1, so everything gets explored, and ``min_factor`` is the floor
that keeps any domain from being starved. Pass and signal rates are exponential moving averages over
recorded results. With ``revisit_after``, the weight a domain is drawn by ages while it goes unrecorded: its
estimates count as relaxed toward an unseen domain's (63% of the way in ``revisit_after`` batches; the
estimates themselves stay what was measured), so a domain the curriculum let fall to the floor (solved, or
never solved) is drawn again to check it, and one the policy has forgotten since, or begun to answer, shows
signal again. Each further group in a row without a signal doubles that time (a domain found all wrong or all
right at every check is checked ever less often: with many domains out of the policy's reach, fixed-interval
checks would spend a steady share of every batch on them), and a group with a signal resets it. With
``adapt_difficulty``, a generated domain steps its difficulty up once its pass rate reaches ``step_up_at``
and down once it falls to ``step_down_at`` (after ``min_results`` results since its last step, a step back too); each difficulty
is a domain of its own to the policy, so the estimates at the one it leaves are kept and those at the one it steps to
come back as last measured (aged since; afresh where never measured): a domain solved at one difficulty and never
solved at the next is weighed at the floor on both, not as unseen at each step.

The cost of a batch is O(D + batch_size log D) for D domains (one pass over the weights, a bisection per
draw), a recorded group O(1) and the per-domain figures logged a step O(D) (``bench/scheduler.py`` measures
it against 4 domains). Tasks come from the procedural generators
(``posttrain.platform.tasks.domains.generate``) in seeded chunks, or from a fixed list on the
``DomainSpec`` (a stored task set's split: :func:`resolve_domains`); the position in each domain is part of the state, so ``state_dict()`` (plain
JSON) and ``load_state_dict()`` resume the same stream.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from posttrain.platform.tasks.domains import MIN_DIFFICULTY, generate, get_domain
from posttrain.platform.tasks.prompt_format import PromptFormat, apply_format
from posttrain.platform.tasks.store import load_tasks
from posttrain.platform.verifiers.models import Split, TaskSpec

CHUNK = 32
UNSEEN_PASS_RATE, UNSEEN_SIGNAL_RATE = 0.5, 1.0  # what a domain not yet recorded counts as


class DomainSpec(BaseModel):
    """One domain in the mix: generated procedurally, or a fixed task list (``tasks``) instead of the generator,
    which :func:`resolve_domains` fills from a stored task set (``task_set``: that set's domain of this name)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    weight: float = Field(default=1.0, gt=0)
    priority: int = Field(default=0, ge=-10, le=10)
    difficulty: int = Field(default=1, ge=1)
    min_difficulty: int | None = Field(
        default=None,
        ge=1,
        description="the lowest difficulty adapt_difficulty steps it down to (None: its generator's lowest)",
    )
    task_set: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="a stored task set whose "
        "domain of this name the tasks come from (its train split), beside generated domains",
    )
    tasks: list[TaskSpec] | None = None


class SchedulerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(default=8, ge=1, description="prompts per batch")
    seed: int = 0
    split: Split = "train"
    ema_alpha: float = Field(default=0.1, gt=0, le=1, description="weight of a new result in the pass-rate EMA")
    priority_factor: float = Field(default=2.0, ge=1.0, description="each priority level multiplies the weight by this")
    min_factor: float = Field(default=0.05, gt=0, le=1, description="floor of the learnability factor")
    curriculum: bool = Field(default=True, description="False: sample by weight and priority only")
    weigh_by: Literal["pass_rate", "signal"] = Field(
        default="pass_rate",
        description="what the curriculum weighs a domain by: its pass rate's learnability, "
        "or its learning-signal rate (the share of its groups whose rewards differ)",
    )
    adapt_difficulty: bool = Field(
        default=False, description="step each generated domain's difficulty by its pass rate"
    )
    step_up_at: float = Field(default=0.8, gt=0, le=1, description="pass rate at which a domain's difficulty steps up")
    step_down_at: float = Field(default=0.1, ge=0, lt=1, description="pass rate at which it steps down")
    min_results: int = Field(
        default=16, ge=1, description="results since a domain's last step before it may step again"
    )
    revisit_after: float | None = Field(
        default=None,
        gt=0,
        description="batches in which the estimates a domain is "
        "weighed by, while it goes unrecorded, relax 63% of the way back to an unseen "
        "domain's, so one held at the floor is drawn again (None: they keep); doubled "
        "for each further group in a row without a learning signal",
    )
    skip_quiet_prompts: int | None = Field(
        default=2,
        ge=1,
        description="skip a task before rollout once its last this-many groups in a row had no learning signal "
        "(all passed or all failed): skipped once, then twice as often for each further quiet group, so a task the "
        "policy may since have learned or unlearned is tried again (None: never skip)",
    )

    @model_validator(mode="after")
    def _thresholds(self) -> SchedulerConfig:
        if self.step_down_at >= self.step_up_at:
            raise ValueError(f"step_down_at ({self.step_down_at}) must be below step_up_at ({self.step_up_at})")
        return self


class LevelEstimates(BaseModel):
    """A domain's estimates at one difficulty: those at the difficulty it has now are its :class:`DomainStats`'
    own, those at a difficulty it has left are kept in ``levels`` and restored when it steps back there."""

    pass_rate: float | None = None
    signal_rate: float | None = None  # share of groups whose rewards differ (EMA)
    at_difficulty: int = (
        0  # results since the difficulty last changed (kept in ``levels``: those of the last stay there)
    )
    seen_at: int = 0  # the batch its estimates were last updated at
    quiet: int = 0  # its groups in a row whose rewards all agreed (each after the first doubles its revisit time)


class DomainStats(LevelEstimates):
    """Exported per-domain figures (and the domain's place in its task stream)."""

    name: str
    results: int = 0
    groups: int = 0
    difficulty: int | None = None  # where adapt_difficulty moved it (None: the spec's)
    levels: dict[int, LevelEstimates] = Field(default_factory=dict)  # the estimates at the difficulties it has left
    drawn: int = 0
    chunk: int = 0
    offset: int = 0


def learnability(pass_rate: float | None, min_factor: float) -> float:
    """4 p (1 - p), floored at ``min_factor``; unseen domains count as p = 0.5."""
    p = UNSEEN_PASS_RATE if pass_rate is None else pass_rate
    return max(min_factor, 4.0 * p * (1.0 - p))


def aged(value: float | None, prior: float, age: float, revisit_after: float | None) -> float | None:
    """An estimate ``age`` batches old, relaxed toward ``prior`` (an unseen domain's) with time constant
    ``revisit_after`` (None: kept as it is)."""
    if value is None or revisit_after is None or age <= 0:
        return value
    return value + (prior - value) * (1.0 - math.exp(-age / revisit_after))


def signal_factor(signal_rate: float | None, min_factor: float) -> float:
    """The learning-signal rate, floored at ``min_factor``; an unseen domain counts as all signal."""
    return max(min_factor, UNSEEN_SIGNAL_RATE if signal_rate is None else signal_rate)


def stored_domains(
    task_set: str, domains: Sequence[str | DomainSpec] = (), *, split: Split = "train", url: str | None = None
) -> list[DomainSpec]:
    """The domains of stored task set ``task_set`` (those named in ``domains``, keeping their weight and
    priority; empty: every domain it holds in ``split``), each with its ``split`` tasks as a fixed list."""
    named = [d if isinstance(d, DomainSpec) else DomainSpec(name=d) for d in domains]
    stored = load_tasks(task_set=task_set, domains=[d.name for d in named] if named else None, split=split, url=url)
    by_domain: dict[str, list[TaskSpec]] = {}
    for task in stored:
        by_domain.setdefault(task.spec.domain, []).append(task.spec)
    if not by_domain:
        raise ValueError(
            f"task set {task_set!r} holds no {split} tasks"
            + (f" in domains {[d.name for d in named]}" if named else "")
            + "; `posttrain tasks list` shows the task sets and their splits"
        )
    if missing := [d.name for d in named if d.name not in by_domain]:
        raise ValueError(
            f"task set {task_set!r} has no {split} tasks in domains {missing}; it holds {sorted(by_domain)}"
        )
    specs = named or [DomainSpec(name=name) for name in by_domain]
    return [spec.model_copy(update={"tasks": by_domain[spec.name]}) for spec in specs]


def resolve_domains(
    domains: Sequence[str | DomainSpec], task_set: str | None = None, *, split: Split = "train", url: str | None = None
) -> list[str | DomainSpec]:
    """``domains`` with the tasks of every stored one filled in (:func:`stored_domains`): a domain naming its own
    ``task_set``, and with ``task_set`` (the run's) every other domain, or all of that set's when none is named."""
    if task_set is not None and not domains:
        return list(stored_domains(task_set, split=split, url=url))
    specs = [d if isinstance(d, DomainSpec) else DomainSpec(name=d) for d in domains]
    sources = [spec.task_set or task_set for spec in specs]
    by_set: dict[str, list[DomainSpec]] = {}
    for source, spec in zip(sources, specs):
        if source is not None:
            by_set.setdefault(source, []).append(spec)
    if not by_set:
        return list(domains)
    found = {
        (source, d.name): d
        for source, named in by_set.items()
        for d in stored_domains(source, named, split=split, url=url)
    }
    return [found[(source, spec.name)] if source else domain for source, spec, domain in zip(sources, specs, domains)]


def replayed_before(step: int, per_step: int, share: float) -> int:
    """How many of the first ``step`` batches' ``per_step`` items each are replay at ``share``: the share held
    exactly over the steps (0.1 of 4 items: 2 in 5 batches), so the step number alone says where each stream is."""
    return math.floor(step * per_step * share + 1e-9)


def _chunk_seed(seed: int, name: str, chunk: int) -> int:
    # a stable per-(run, domain, chunk) seed; Python's hash() is salted per process, so no hash()
    return (seed * 1_000_003 + sum((i + 1) * ord(c) for i, c in enumerate(name)) * 7919 + chunk) % (2**31)


class Scheduler:
    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self._rng = random.Random(self.config.seed)
        self._specs: dict[str, DomainSpec] = {}
        self._stats: dict[str, DomainStats] = {}
        self._buffers: dict[str, list[TaskSpec]] = {}
        self._format: PromptFormat | None = None
        self._replay: dict[str, DomainSpec] = {}  # general domains rehearsed in a share of each batch (train split)
        self._replay_share = 0.0
        self._batch = 0  # batches drawn: the clock estimates age by
        self._quiet_tasks: dict[str, list[int]] = {}  # a listed task's id -> [its quiet groups in a row, skips since]
        self.skipped = 0  # draws of a quiet task skipped before rollout
        self._lock = threading.Lock()

    # --- domains --------------------------------------------------------------
    def set_domains(self, domains: Sequence[str | DomainSpec], prompt_format: PromptFormat | None = None) -> None:
        """The mix to draw from, each task put as ``prompt_format`` says (None: as generated or listed)."""
        if not domains:
            raise ValueError("the scheduler needs at least one domain")
        specs = [d if isinstance(d, DomainSpec) else DomainSpec(name=d) for d in domains]
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"domains listed twice: {sorted({n for n in names if names.count(n) > 1})}")
        with self._lock:
            self._specs = {s.name: s for s in specs}
            self._format = prompt_format
            for spec in specs:
                self._stats.setdefault(spec.name, DomainStats(name=spec.name))
                if spec.tasks is not None and not spec.tasks:
                    raise ValueError(f"domain {spec.name!r} has an empty task list")

    def set_replay(self, domains: Sequence[str], difficulty: int, share: float) -> None:
        """Draw ``share`` of every batch from ``domains`` at ``difficulty``, uniformly, from their ``train`` split
        whatever the scheduler's split, put as generated (not in the run's prompt format), and outside the
        curriculum: a replayed domain is rehearsed at its share, not weighed by what the policy learns from it."""
        if overlap := sorted(set(domains) & set(self._specs)):
            raise ValueError(
                f"replay domains {overlap} are trained on already: replay rehearses domains the run does not train on"
            )
        if not 0 < share < 1:
            raise ValueError(f"the replay share must be between 0 and 1, got {share}")
        with self._lock:
            self._replay = {d: DomainSpec(name=d, difficulty=difficulty) for d in domains}
            self._replay_share = share
            for name in domains:
                self._stats.setdefault(name, DomainStats(name=name))

    def is_replay(self, name: str) -> bool:
        return name in self._replay

    def weights(self) -> dict[str, float]:
        """The current (unnormalised) sampling weight of every domain."""
        cfg = self.config
        out = {}
        for name, spec in self._specs.items():
            w = spec.weight * cfg.priority_factor**spec.priority
            if cfg.curriculum:
                stats, age = self._stats[name], self._batch - self._stats[name].seen_at
                revisit = (
                    None if cfg.revisit_after is None else cfg.revisit_after * 2.0 ** min(max(0, stats.quiet - 1), 32)
                )
                w *= (
                    signal_factor(aged(stats.signal_rate, UNSEEN_SIGNAL_RATE, age, revisit), cfg.min_factor)
                    if cfg.weigh_by == "signal"
                    else learnability(aged(stats.pass_rate, UNSEEN_PASS_RATE, age, revisit), cfg.min_factor)
                )
            out[name] = w
        return out

    def probabilities(self) -> dict[str, float]:
        with self._lock:
            w = self.weights()
        total = sum(w.values())
        return {k: v / total for k, v in w.items()}

    # --- drawing --------------------------------------------------------------
    def stream(self, domains: Sequence[str | DomainSpec] | None = None) -> Iterator[list[TaskSpec]]:
        """An endless stream of batches of ``batch_size`` tasks (``domains`` replaces the mix)."""
        if domains is not None:
            self.set_domains(domains)
        if not self._specs:
            raise ValueError("no domains: pass them to stream() or set_domains()")
        while True:
            yield self.next_batch()

    def next_batch(self, size: int | None = None) -> list[TaskSpec]:
        """``size`` tasks (default: ``batch_size``), each domain drawn by its weight now."""
        size = self.config.batch_size if size is None else size
        with self._lock:
            weights = self.weights()
            names = list(weights)
            replays = 0
            if self._replay:
                share = self._replay_share
                replays = replayed_before(self._batch + 1, size, share) - replayed_before(self._batch, size, share)
            picks = self._rng.choices(names, weights=[weights[n] for n in names], k=size - replays)
            tasks = apply_format([self._take(name) for name in picks], self._format)
            tasks += [self._take(name) for name in self._rng.choices(sorted(self._replay), k=replays)]
            self._batch += 1
        return tasks

    def _take(self, name: str) -> TaskSpec:
        """The next task of ``name`` whose last groups gave a signal (:meth:`_quiet`); after a chunk's worth of quiet
        ones in a row, the next task whatever it gave, so a domain whose tasks all go quiet is still drawn."""
        for _ in range(CHUNK):
            task = self._next(name)
            if not self._quiet(task):
                break
        else:
            task = self._next(name)
        self._stats[name].drawn += 1
        return task

    def _quiet(self, task: TaskSpec) -> bool:
        """Whether to skip ``task`` now: its last ``skip_quiet_prompts`` groups had no signal, and it has been
        skipped fewer than 2**(quiet groups beyond that) times since (each skip counted)."""
        limit, entry = self.config.skip_quiet_prompts, self._quiet_tasks.get(task.task_id or "")
        if limit is None or entry is None or entry[0] < limit or entry[1] >= 2 ** (entry[0] - limit):
            return False
        entry[1] += 1
        self.skipped += 1
        return True

    def _next(self, name: str) -> TaskSpec:
        spec, stats = self._specs.get(name) or self._replay[name], self._stats[name]
        if spec.tasks is not None:
            task = spec.tasks[stats.offset % len(spec.tasks)]
            stats.offset += 1
            return task
        buffer = self._buffers.get(name)
        if buffer is None:
            buffer = self._buffers[name] = self._generate(spec, stats.chunk)
        if stats.offset >= len(buffer):
            stats.chunk, stats.offset = stats.chunk + 1, 0
            buffer = self._buffers[name] = self._generate(spec, stats.chunk)
        task = buffer[stats.offset]
        stats.offset += 1
        return task

    def _generate(self, spec: DomainSpec, chunk: int) -> list[TaskSpec]:
        seed = _chunk_seed(self.config.seed, spec.name, chunk)
        difficulty = self.difficulty(spec.name)
        split = "train" if spec.name in self._replay else self.config.split  # replay never draws a held-out prompt
        tasks = generate(spec.name, CHUNK, seed=seed, difficulty=difficulty, split=split)
        if not tasks:
            raise ValueError(f"domain {spec.name!r} generated no tasks at difficulty {difficulty}")
        return tasks

    def difficulty(self, name: str) -> int:
        """The difficulty ``name``'s tasks are drawn at now."""
        stats = self._stats.get(name)
        if stats is not None and stats.difficulty is not None:
            return stats.difficulty
        return (self._specs.get(name) or self._replay[name]).difficulty

    # --- feedback -------------------------------------------------------------
    def record(
        self,
        domain: str,
        passed: Sequence[bool | float],
        rewards: Sequence[float] | None = None,
        task_id: str | None = None,
    ) -> None:
        """Fold one group of results of ``domain`` (pass flags or scores in [0, 1]) into its pass rate, and
        whether the group's ``rewards`` (default: ``passed``) differ into its signal rate and into task
        ``task_id``'s run of quiet groups; then step its difficulty where ``adapt_difficulty`` says."""
        if not passed:
            return
        cfg, a = self.config, self.config.ema_alpha
        with self._lock:
            stats = self._stats.get(domain)
            if stats is None:
                stats = self._stats[domain] = DomainStats(name=domain)
            stats.seen_at = self._batch
            rate = sum(float(p) for p in passed) / len(passed)
            stats.pass_rate = rate if stats.pass_rate is None else (1 - a) * stats.pass_rate + a * rate
            stats.results += len(passed)
            stats.at_difficulty += len(passed)
            scores = [float(r) for r in (passed if rewards is None else rewards)]
            spec = self._specs.get(domain)
            if len(scores) > 1:  # one result on its own is no group
                signal = float(max(scores) - min(scores) > 1e-6)
                stats.signal_rate = signal if stats.signal_rate is None else (1 - a) * stats.signal_rate + a * signal
                stats.groups += 1
                stats.quiet = 0 if signal else stats.quiet + 1
                # only a listed task is drawn again: a generated one's id names its chunk, which is never redrawn
                if task_id is not None and spec is not None and spec.tasks is not None:
                    if signal:
                        self._quiet_tasks.pop(task_id, None)
                    else:
                        entry = self._quiet_tasks.setdefault(task_id, [0, 0])
                        entry[0], entry[1] = entry[0] + 1, 0
            if (
                cfg.adapt_difficulty
                and spec is not None
                and spec.tasks is None
                and stats.at_difficulty >= cfg.min_results
            ):
                self._step_difficulty(spec, stats)

    def _step_difficulty(self, spec: DomainSpec, stats: DomainStats) -> None:
        now = stats.difficulty if stats.difficulty is not None else spec.difficulty
        assert stats.pass_rate is not None
        if stats.pass_rate >= self.config.step_up_at:
            to = min(now + 1, get_domain(spec.name).max_difficulty)
        elif stats.pass_rate <= self.config.step_down_at:
            to = max(now - 1, spec.min_difficulty or MIN_DIFFICULTY)
        else:
            return
        if to == now:
            return
        # each difficulty is a domain of its own to the policy: the estimates at the one it leaves are kept, those at
        # the one it steps to come back as they were last measured (aged since, as any estimate), or start afresh;
        # the count the min_results gate reads starts again at 0 on every step, back or on (were it restored with the
        # estimates, the gate would already be met on a step back and the domain could switch on every group)
        stats.levels[now] = LevelEstimates.model_validate(stats.model_dump(include=set(LevelEstimates.model_fields)))
        back = stats.levels.pop(to, None) or LevelEstimates(seen_at=self._batch)
        for field, value in back:
            setattr(stats, field, value)
        stats.at_difficulty = 0
        stats.difficulty = to
        stats.chunk, stats.offset = stats.chunk + 1, 0
        self._buffers.pop(spec.name, None)

    # --- export and checkpoints -------------------------------------------------
    def stats(self) -> dict[str, DomainStats]:
        with self._lock:
            return {k: v.model_copy() for k, v in self._stats.items()}

    def metrics(self, prefix: str = "sched/") -> dict[str, float]:
        """Per-domain figures for ``log_metrics``: ``sched/<domain>/pass_rate``, ``/signal_rate``, ``/prob`` (its
        draw share now), ``/drawn``, and ``/difficulty`` where ``adapt_difficulty`` steps it."""
        probs = self.probabilities()
        out: dict[str, float] = {}
        for name, stats in self.stats().items():
            if stats.pass_rate is not None:
                out[f"{prefix}{name}/pass_rate"] = stats.pass_rate
            if stats.signal_rate is not None:
                out[f"{prefix}{name}/signal_rate"] = stats.signal_rate
            out[f"{prefix}{name}/drawn"] = float(stats.drawn)
            if name in probs:
                out[f"{prefix}{name}/prob"] = probs[name]
            if self.config.adapt_difficulty and name in self._specs:
                out[f"{prefix}{name}/difficulty"] = float(self.difficulty(name))
        return out

    def state_dict(self) -> dict[str, Any]:
        """JSON-safe state: the RNG, every domain's statistics and stream position."""
        with self._lock:
            version, internal, gauss = self._rng.getstate()
            return {
                "rng": [version, list(internal), gauss],
                "stats": {k: v.model_dump() for k, v in self._stats.items()},
                "batch": self._batch,
                "quiet_tasks": self._quiet_tasks,
                "skipped": self.skipped,
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["rng"]
        with self._lock:
            self._rng.setstate((version, tuple(internal), gauss))
            self._stats = {k: DomainStats.model_validate(v) for k, v in state["stats"].items()}
            self._batch = int(state.get("batch", 0))  # checkpoints before revisit_after kept no clock
            self._quiet_tasks = {k: list(v) for k, v in state.get("quiet_tasks", {}).items()}
            self.skipped = int(state.get("skipped", 0))
            self._buffers = {}  # regenerated from (seed, chunk) on next use; offsets are kept
