"""Evaluation: per-domain pass@1 and pass@k of a policy on held-out tasks, and model comparisons.

    report = evaluate_policy(EvalConfig(model="runs/grpo1/checkpoints/step_00000100/model",
                                        domains=["compare.larger.int"], tasks_per_domain=64))
    report["eval/compare.larger.int/pass@1"], report["eval/pass@1"]

    report = evaluate_policy(EvalConfig(model=..., domains=[...], samples=8, ks=[1, 4, 8]))
    report["eval/compare.larger.int/pass@4"]   # unbiased estimator over 8 samples per task

    table = compare_reports({"before": report_a, "after": report_b}, domains)
    table["compare.larger.int"] == {"before": 0.41, "after": 0.78, "delta": 0.37}

Tasks come from the ``eval`` split of each domain (held out from training, which draws
``train``). ``samples == 1`` decodes greedily; ``samples = n > 1`` samples ``n`` completions
per task at ``temperature`` and reports ``pass@k = 1 - C(n - c, k) / C(n, k)`` (Chen et al.
2021) averaged over tasks, for every ``k`` in ``ks``. ``pass_rate`` is ``pass@1``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from posttrain.platform.verifiers import TaskSpec, VerifierService, default_service
from posttrain.training.config import EvalConfig
from posttrain.training.modeling import PolicySource, eval_mode, load_policy, resolve_device
from posttrain.training.rollout import SamplingConfig, generate_groups, prompt_ids


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` passed: ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # product form, numerically stable: prod_{i=n-c+1}^{n} (1 - k / i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@torch.no_grad()
def greedy_completions(model: torch.nn.Module, tokenizer, tasks: list[TaskSpec], max_new_tokens: int) -> list[str]:  # type: ignore[no-untyped-def]
    device = next(model.parameters()).device
    prompts = [prompt_ids(tokenizer, t) for t in tasks]
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    with eval_mode(model):
        out = model.generate(input_ids=ids, attention_mask=attention, do_sample=False, max_new_tokens=max_new_tokens,  # type: ignore[operator]
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=pad)
    return [tokenizer.decode(row[width:], skip_special_tokens=True) for row in out]


def sampled_completions(model: torch.nn.Module, tokenizer, tasks: list[TaskSpec], n: int, config: EvalConfig) -> list[list[str]]:  # type: ignore[no-untyped-def]
    groups = generate_groups(model, tokenizer, tasks, n, SamplingConfig(max_new_tokens=config.max_new_tokens, temperature=config.temperature))
    return [[t.text for t in g.trajectories] for g in groups]


def eval_tasks(config: EvalConfig, domain: str) -> list[TaskSpec]:
    """The tasks ``config`` evaluates ``domain`` on (its ``split``, ``eval`` unless set otherwise)."""
    from posttrain.platform.tasks.domains import generate

    return generate(domain, config.tasks_per_domain, seed=config.seed, difficulty=config.difficulty, split=config.split)


def all_eval_tasks(config: EvalConfig) -> list[TaskSpec]:
    """Every task ``config`` evaluates, domain after domain."""
    return [task for domain in config.domains for task in eval_tasks(config, domain)]


def evaluate_policy(config: EvalConfig, policy: PolicySource | None = None, *, service: VerifierService | None = None) -> dict[str, float]:
    """Per-domain and overall ``pass@k``, ``pass_rate`` (= pass@1) and mean ``score`` of one policy."""
    sources = config.model_list
    source = policy if policy is not None else (sources[0] if sources else None)
    if source is None:
        raise ValueError("no model: set EvalConfig.model or pass a (model, tokenizer) pair")
    model, tokenizer = load_policy(source, device=resolve_device(config.device))
    service = service or default_service()
    generator = torch.Generator().manual_seed(config.seed)
    n = config.samples
    report: dict[str, float] = {}
    totals: dict[str, list[float]] = {}
    for domain in config.domains:
        tasks = eval_tasks(config, domain)
        per_task: list[list[str]] = []
        for i in range(0, len(tasks), config.batch_size):
            chunk = tasks[i : i + config.batch_size]
            if n == 1:
                per_task += [[c] for c in greedy_completions(model, tokenizer, chunk, config.max_new_tokens)]
            else:
                torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
                per_task += sampled_completions(model, tokenizer, chunk, n, config)
        flat_tasks = [t for t, outs in zip(tasks, per_task) for _ in outs]
        verdicts = service.verify_batch(flat_tasks, [c for outs in per_task for c in outs])
        passes = [sum(v.passed for v in verdicts[j * n : (j + 1) * n]) for j in range(len(tasks))]
        figures: dict[str, float] = {}
        for k in sorted(set(config.ks) | {1}):
            figures[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in passes) / len(tasks)
        figures["pass_rate"] = figures["pass@1"]
        figures["score"] = sum(v.score for v in verdicts) / len(verdicts)
        for name, value in figures.items():
            report[f"eval/{domain}/{name}"] = value
            totals.setdefault(name, []).append(value * len(tasks))
        totals.setdefault("_tasks", []).append(float(len(tasks)))
    count = sum(totals.pop("_tasks"))
    for name, weighted in totals.items():
        report[f"eval/{name}"] = sum(weighted) / count
    return report


def compare_reports(reports: Mapping[str, Mapping[str, float]], domains: Sequence[str], metric: str = "pass@1") -> dict[str, dict[str, float]]:
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


def evaluate_models(config: EvalConfig, resolve: Any = None, *, service: VerifierService | None = None) -> dict[str, Any]:
    """Evaluate every model of ``config`` (``resolve(name) -> path`` maps registered names) and compare them."""
    reports: dict[str, dict[str, float]] = {}
    for name in config.model_list:
        source = resolve(name) if resolve is not None else name
        reports[name] = evaluate_policy(config.model_copy(update={"model": None, "models": []}), source, service=service)
    metrics = sorted({key.rsplit("/", 1)[-1] for r in reports.values() for key in r if key.startswith("eval/")})
    comparison = {m: compare_reports(reports, config.domains, m) for m in metrics if m.startswith("pass@")}
    return {"models": reports, "comparison": comparison}
