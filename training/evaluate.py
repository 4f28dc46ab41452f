"""Evaluation: per-domain pass@1 and pass@k of a policy on held-out tasks, and model comparisons.

    report = evaluate_policy(EvalConfig(model="runs/grpo1/checkpoints/step_00000100/model",
                                        domains=["compare.larger.int"], tasks_per_domain=64))
    report["eval/compare.larger.int/pass@1"], report["eval/pass@1"]

    report = evaluate_policy(EvalConfig(model=..., domains=[...], samples=8, ks=[1, 4, 8]))
    report["eval/compare.larger.int/pass@4"]   # unbiased estimator over 8 samples per task

    table = compare_reports({"before": report_a, "after": report_b}, domains)
    table["compare.larger.int"] == {"before": 0.41, "after": 0.78, "delta": 0.37}

    out = evaluate_models(EvalConfig(models=["base", "tuned"], task_set="manuals"), resolve)
    out["arena"]["domains"]["all"]   # {"a": .., "b": .., "delta": .., "ci_low": .., "wins": .., ...}
    out["arena"]["disagreements"]    # tasks where one passed and the other did not, both answers
    out["records"]["tuned"]          # each task's domain, id, source, answer and verdict: pair two later

Tasks come from the ``eval`` split of each domain (held out from training, which draws
``train``), generated procedurally or read from a stored task set (``task_set``). ``samples == 1`` decodes greedily; ``samples = n > 1`` samples ``n`` completions
per task at ``temperature`` and reports ``pass@k = 1 - C(n - c, k) / C(n, k)`` (Chen et al.
2021) averaged over tasks, for every ``k`` in ``ks``. ``pass_rate`` is ``pass@1``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from posttrain.platform.stats import paired_difference
from posttrain.platform.tasks.domains import generate
from posttrain.platform.tasks.heldout import task_source
from posttrain.platform.tasks.prompt_format import apply_format
from posttrain.platform.tasks.store import domain_stats, load_tasks
from posttrain.platform.verifiers import TaskSpec, Verdict, VerifierService, default_service
from posttrain.training.config import EvalConfig, SamplingConfig
from posttrain.training.environments import load_environment
from posttrain.training.environments.runner import EpisodeRunner
from posttrain.training.inference import EmbeddedRolloutEngine, rollout_groups
from posttrain.training.modeling import PolicySource, load_policy, resolve_device

if TYPE_CHECKING:
    from posttrain.training.environments.base import Episode
    from posttrain.training.environments.runner import EpisodeRunner

GENERAL = "general/"  # the general check's figures and per-task records are named under it


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` passed: ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # product form, numerically stable: prod_{i=n-c+1}^{n} (1 - k / i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def eval_sampling(config: EvalConfig) -> SamplingConfig:
    """Greedy for one sample per task, else sampled at ``config.temperature``."""
    return SamplingConfig(
        max_new_tokens=config.max_new_tokens, temperature=config.temperature if config.samples > 1 else 0.0
    )


def open_eval_episodes(
    config: EvalConfig, engine: EmbeddedRolloutEngine, service: VerifierService, source: PolicySource
) -> EpisodeRunner | None:
    """The episode runner of ``config.environment`` (None: one completion per task), its episodes through
    ``engine``, or through vLLM loaded from ``source``'s directory with ``config.vllm`` (closed with the runner)."""
    if config.environment is None or not config.environment.multi_turn:
        return None
    environment = load_environment(config.environment, engine.tokenizer, eval_sampling(config))
    if config.vllm is None:
        return EpisodeRunner(
            environment, engine, config.environment, service, group_size=config.samples, seed=config.seed
        )
    if not isinstance(source, (str, Path)):
        raise ValueError(
            "an evaluation through vLLM (vllm: ...) loads the model from its directory: give a model directory, "
            "or leave vllm unset for the embedded engine"
        )
    from posttrain.training.rollouts.vllm import open_vllm_engine

    served = open_vllm_engine(source, config.vllm, device=engine.model.device.type, seed=config.seed)
    try:
        runner = EpisodeRunner(
            environment, served, config.environment, service, group_size=config.samples, seed=config.seed
        )
    except BaseException:
        served.close()
        raise
    runner.on_close.append(served.close)
    return runner


def episode_figures(episode: Episode) -> dict[str, float]:
    """What an episode did: its policy turns, tool calls and failed calls, and whether it ran a test file (a
    ``bash`` command that names one) before it replied."""
    calls = episode.tool_calls
    tested = any(c.name == "bash" and "test" in str(c.arguments.get("command", "")) for c in calls)
    return {
        "turns": float(episode.policy_turns),
        "tool_calls": float(len(calls)),
        "tool_errors": float(sum(c.failed for c in calls)),
        "tested_before_reply": float(tested and episode.finished),
    }


def answers(
    engine: EmbeddedRolloutEngine,
    episodes: EpisodeRunner | None,
    service: VerifierService,
    tasks: list[TaskSpec],
    config: EvalConfig,
    figures: list[dict[str, float]] | None = None,
) -> tuple[list[list[str]], list[Verdict]]:
    """``config.samples`` answers to each task and their verdicts (task by task): completions through the
    inference engine, or whole episodes of the environment, which scored them where they ran (an episode
    whose sandbox failed counts as not passed). ``figures`` receives each episode's :func:`episode_figures`."""
    n = config.samples
    if episodes is not None:
        groups = episodes.groups(tasks)
        if figures is not None:
            figures += [episode_figures(t.episode) for g in groups for t in g.trajectories if t.episode is not None]
        verdicts = [
            t.verdict
            if t.verdict is not None and t.reward is not None
            else Verdict.infra(t.episode.error if t.episode is not None and t.episode.error else "not scored")
            for g in groups
            for t in g.trajectories
        ]
        return [[t.text for t in g.trajectories] for g in groups], verdicts
    # a base model's answer (the completion format) is cut where it goes on to a question of its own, as in training
    per_task = [
        [t.text for t in g.trajectories]
        for g in rollout_groups(engine, engine.tokenizer, tasks, n, eval_sampling(config))
    ]
    return per_task, service.verify_batch(
        [t for t, outs in zip(tasks, per_task) for _ in outs], [c for outs in per_task for c in outs]
    )


def eval_domains(config: EvalConfig) -> list[str]:
    """The domains ``config`` evaluates: as named, else every domain of its task set with tasks in its split."""
    if config.domains or config.task_set is None:
        return list(config.domains)

    stats = domain_stats(task_set=config.task_set)
    if not stats:
        raise ValueError(
            f"no task set named {config.task_set!r} holds tasks; `posttrain tasks list` shows the task sets"
        )
    domains = [d.name for d in stats if (d.eval if config.split == "eval" else d.train)]
    if not domains:
        raise ValueError(
            f"task set {config.task_set!r} has no {config.split} tasks; rebuild it with an eval fraction above 0"
        )
    return domains


def eval_tasks(config: EvalConfig, domain: str) -> list[TaskSpec]:
    """The tasks ``config`` evaluates ``domain`` on: from its task set (its ``split``), else generated
    procedurally in the ``eval`` split unless set otherwise."""
    if (task_set := config.task_set_of(domain)) is not None:
        stored = load_tasks(task_set=task_set, domains=[domain], split=config.split, limit=config.tasks_per_domain)
        if not stored:
            raise ValueError(f"task set {task_set!r} has no {config.split} tasks in domain {domain!r}")
        return apply_format([t.spec for t in stored], config.prompt_format)

    tasks = generate(
        domain, config.tasks_per_domain, seed=config.seed, difficulty=config.difficulty_of(domain), split=config.split
    )
    return apply_format(tasks, config.prompt_format)


def all_eval_tasks(config: EvalConfig) -> list[TaskSpec]:
    """Every task ``config`` evaluates, domain after domain."""
    return [task for domain in eval_domains(config) for task in eval_tasks(config, domain)]


def general_config(config: EvalConfig) -> EvalConfig | None:
    """The fixed general check beside ``config`` (:class:`GeneralCheck`): its domains less those ``config``
    evaluates, put as generated, greedy, in ``config``'s split (an evaluation's: eval; an interpolation's validation:
    train); None when off or nothing is left."""
    check = config.general
    domains = [d for d in check.domains if d not in config.domains] if check is not None else []
    if check is None or not domains:
        return None
    return EvalConfig(
        domains=domains,
        difficulty=check.difficulty,
        tasks_per_domain=check.tasks_per_domain,
        max_new_tokens=check.max_new_tokens,
        split=config.split,
        seed=config.seed,
        batch_size=config.batch_size,
        device=config.device,
    )


def evaluate_policy(
    config: EvalConfig,
    policy: PolicySource | None = None,
    *,
    service: VerifierService | None = None,
    records: list[dict[str, Any]] | None = None,
) -> dict[str, float]:
    """Per-domain and overall ``pass@k``, ``pass_rate`` (= pass@1) and mean ``score`` of one policy
    (``eval/<domain>/pass@1``, ``eval/pass@1``, ...); in the domains that hold out more than prompts, pass@1
    and the task count by why each task is held out, per domain and over them all
    (``eval/held_out_by/function/pass@1``: code repairs of functions no training task shows;
    ``eval/repair.off_by_one/held_out_by/prompt/pass@1``: unseen modules of seen functions); for episodes, their
    means (``eval/episodes/turns``, ``tool_calls``, ``tool_errors``, ``tested_before_reply``); and with ``config.general`` the general check's
    figures under ``general/`` (``general/pass@1``, ``general/<domain>/pass@1``).

    ``records``, when given, receives one row per task (its first completion and verdict), the
    material of a head-to-head comparison (:func:`head_to_head`); the general check's rows name their domain
    ``general/<domain>``."""
    sources = config.model_list
    source = policy if policy is not None else (sources[0] if sources else None)
    if source is None:
        raise ValueError("no model: set EvalConfig.model or pass a (model, tokenizer) pair")
    model, tokenizer = load_policy(
        source, device=resolve_device(config.device)
    )  # a base model in the completion format
    engine = EmbeddedRolloutEngine(model, tokenizer)
    service = service or default_service()
    episodes = open_eval_episodes(config, engine, service, source)
    try:
        report = _domains_report(engine, episodes, service, config, eval_domains(config), records)
    finally:
        if episodes is not None:
            episodes.close()
    if (general := general_config(config)) is not None:
        kept: list[dict[str, Any]] | None = [] if records is not None else None
        found = _domains_report(engine, None, service, general, general.domains, kept)
        report |= {GENERAL + key.removeprefix("eval/"): value for key, value in found.items()}
        if kept is not None and records is not None:  # its flips explain a general-check loss
            records += [row | {"domain": GENERAL + row["domain"]} for row in kept]
    return report


def _domains_report(
    engine: EmbeddedRolloutEngine,
    episodes: EpisodeRunner | None,
    service: VerifierService,
    config: EvalConfig,
    domains: list[str],
    records: list[dict[str, Any]] | None,
) -> dict[str, float]:
    generator = torch.Generator().manual_seed(config.seed)
    n = config.samples
    report: dict[str, float] = {}
    totals: dict[str, list[float]] = {}
    held_out: dict[str, list[float]] = {}  # why a task is held out -> pass@1 of each such task
    episode_rows: list[dict[str, float]] = []
    for domain in domains:
        tasks = eval_tasks(config, domain)
        per_task: list[list[str]] = []
        verdicts: list[Verdict] = []
        for i in range(0, len(tasks), config.batch_size):
            if n > 1:
                torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
            texts, found = answers(engine, episodes, service, tasks[i : i + config.batch_size], config, episode_rows)
            per_task += texts
            verdicts += found
        passes = [sum(v.passed for v in verdicts[j * n : (j + 1) * n]) for j in range(len(tasks))]
        if records is not None:
            records += [
                {"domain": domain, "task_id": t.task_id or f"{domain}#{j}", "source": task_source(t),
                 "held_out_by": t.metadata.get("held_out_by") or "prompt", "prompt": t.prompt_text, "reference": t.reference,
                 "completion": outs[0], "passed": verdicts[j * n].passed, "score": verdicts[j * n].score,
                 "details": verdicts[j * n].details[:300]}
                for j, (t, outs) in enumerate(zip(tasks, per_task))
            ]  # fmt: skip
        figures: dict[str, float] = {}
        for k in sorted(set(config.ks) | {1}):
            figures[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in passes) / len(tasks)
        figures["pass_rate"] = figures["pass@1"]
        figures["score"] = sum(v.score for v in verdicts) / len(verdicts)
        for name, value in figures.items():
            report[f"eval/{domain}/{name}"] = value
            totals.setdefault(name, []).append(value * len(tasks))
        totals.setdefault("_tasks", []).append(float(len(tasks)))
        reasons = [t.metadata.get("held_out_by") for t in tasks]
        if any(reasons):  # a domain that holds out more than prompts (code repair: whole functions)
            mine: dict[str, list[float]] = {}
            for j, reason in enumerate(reasons):
                mine.setdefault(reason or "prompt", []).append(pass_at_k(n, passes[j], 1))
            for reason, rates in mine.items():
                report[f"eval/{domain}/held_out_by/{reason}/pass@1"] = sum(rates) / len(rates)
                report[f"eval/{domain}/held_out_by/{reason}/tasks"] = float(len(rates))
                held_out.setdefault(reason, []).extend(rates)
    count = sum(totals.pop("_tasks"))
    for name, weighted in totals.items():
        report[f"eval/{name}"] = sum(weighted) / count
    for name in episode_rows[0] if episode_rows else ():  # per episode, over every domain
        report[f"eval/episodes/{name}"] = sum(row[name] for row in episode_rows) / len(episode_rows)
    for reason, rates in sorted(held_out.items()):
        report[f"eval/held_out_by/{reason}/pass@1"] = sum(rates) / len(rates)
        report[f"eval/held_out_by/{reason}/tasks"] = float(len(rates))
    return report


def compare_reports(
    reports: Mapping[str, Mapping[str, float]], domains: Sequence[str], metric: str = "pass@1"
) -> dict[str, dict[str, float]]:
    """Per domain (and ``"all"``): each model's ``metric`` and ``delta`` = last model minus first."""
    names = list(reports)
    table: dict[str, dict[str, float]] = {}
    for domain in [*domains, "all"]:
        key = f"eval/{metric}" if domain == "all" else f"eval/{domain}/{metric}"
        row = {name: float(reports[name][key]) for name in names}
        if len(names) >= 2:
            row["delta"] = row[names[-1]] - row[names[0]]
        table[domain] = row
    return table


MAX_DISAGREEMENTS = 200  # kept in a stored comparison, newest job results stay small


def paired_records(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """pass@1 of A and B on the same tasks and ``delta`` = B - A with its paired SE, clustered by each task's source
    (:func:`~posttrain.platform.tasks.heldout.task_source`; a record stored before sources were kept is its own), the
    95% interval, and B's wins, ties and losses (:class:`~posttrain.platform.stats.Difference`)."""
    sources = [x.get("source") or x["task_id"] for x in a]
    return paired_difference([x["passed"] for x in a], [y["passed"] for y in b], sources).as_dict()


def head_to_head(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Two models' per-task records on the same tasks (:func:`evaluate_policy`'s ``records``): per
    domain (the general check's too), over the evaluation's own tasks (``all``) and over the general check's
    (``general``, beside ``domains``: what training cost elsewhere; absent without a general check) the paired
    figures of :func:`paired_records`, and the tasks where their verdicts differ (up to ``MAX_DISAGREEMENTS``, those of
    the domains where B lost beyond noise first)."""
    if [r["task_id"] for r in a] != [r["task_id"] for r in b]:
        raise ValueError("head_to_head needs both models' records on the same tasks in the same order")
    pairs = list(zip(a, b))

    def paired(keep: Any) -> dict[str, Any]:
        chosen = [(x, y) for x, y in pairs if keep(x["domain"])]
        return paired_records([x for x, _ in chosen], [y for _, y in chosen])

    domains = list(dict.fromkeys(r["domain"] for r in a))
    table = {d: paired(d.__eq__) for d in domains}
    table["all"] = paired(lambda d: not d.startswith(GENERAL))  # the evaluation's own tasks, as eval/pass@1
    general = paired(lambda d: d.startswith(GENERAL)) if any(d.startswith(GENERAL) for d in domains) else None
    differ = [
        {"domain": x["domain"], "task_id": x["task_id"], "prompt": x["prompt"], "reference": x["reference"],
         "a": x["completion"], "a_passed": x["passed"], "b": y["completion"], "b_passed": y["passed"]}
        for x, y in pairs if x["passed"] != y["passed"]
    ]  # fmt: skip
    # what the flips of a domain that lost beyond noise show is the interference: those are kept before the rest
    lost = {d for d, row in table.items() if d != "all" and row["ci_high"] < 0}
    differ = [x for x in differ if x["domain"] in lost] + [x for x in differ if x["domain"] not in lost]
    return {
        "domains": table,
        **({"general": general} if general else {}),
        "disagreements": differ[:MAX_DISAGREEMENTS],
        "disagreements_total": len(differ),
    }


def evaluate_models(
    config: EvalConfig, resolve: Any = None, *, service: VerifierService | None = None, on_model: Any = None
) -> dict[str, Any]:
    """Evaluate every model of ``config`` (``resolve(name) -> path`` maps registered names) on the
    same tasks and compare them; two models greedily also get a :func:`head_to_head` (``arena``).
    ``on_model(index, name)`` is called as each model finishes."""
    domains = eval_domains(config)  # once: every model answers the same domains
    each = config.model_copy(update={"model": None, "models": [], "domains": domains})
    reports: dict[str, dict[str, float]] = {}
    records: dict[str, list[dict[str, Any]]] = {}
    for index, name in enumerate(config.model_list):
        source = resolve(name) if resolve is not None else name
        records[name] = []
        reports[name] = evaluate_policy(each, source, service=service, records=records[name])
        if on_model is not None:
            on_model(index, name)
    metrics = sorted({key.rsplit("/", 1)[-1] for r in reports.values() for key in r if key.startswith("eval/")})
    comparison = {m: compare_reports(reports, domains, m) for m in metrics if m.startswith("pass@")}
    out: dict[str, Any] = {"models": reports, "comparison": comparison, "domains": domains, "records": records}
    names = config.model_list
    if len(names) == 2 and config.samples == 1:
        out["arena"] = {"a": names[0], "b": names[1], **head_to_head(records[names[0]], records[names[1]])}
    return out
