"""Evaluation: pass rate and mean score of a policy on held-out tasks, per domain.

    report = evaluate_policy(EvalConfig(model="runs/grpo1/checkpoints/step_00000100/model",
                                        domains=["str.copy.letters"], tasks_per_domain=32))
    report["eval/str.copy.letters/pass_rate"], report["eval/pass_rate"]

Greedy decoding (one completion per task) on the ``eval`` split of each domain.
"""

from __future__ import annotations

import torch

from posttrain.platform.verifiers import TaskSpec, VerifierService, default_service
from posttrain.training.config import EvalConfig
from posttrain.training.modeling import PolicySource, eval_mode, load_policy, resolve_device
from posttrain.training.rollout import prompt_ids


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


def evaluate_policy(config: EvalConfig, policy: PolicySource | None = None, *, service: VerifierService | None = None) -> dict[str, float]:
    from posttrain.platform.tasks.domains import generate

    source = policy if policy is not None else config.model
    if source is None:
        raise ValueError("no model: set EvalConfig.model or pass a (model, tokenizer) pair")
    model, tokenizer = load_policy(source, device=resolve_device(config.device))
    service = service or default_service()
    report: dict[str, float] = {}
    passed_all: list[bool] = []
    for domain in config.domains:
        tasks = generate(domain, config.tasks_per_domain, seed=config.seed, difficulty=config.difficulty, split="eval")
        completions: list[str] = []
        for i in range(0, len(tasks), config.batch_size):
            completions += greedy_completions(model, tokenizer, tasks[i : i + config.batch_size], config.max_new_tokens)
        verdicts = service.verify_batch(tasks, completions)
        passed = [v.passed for v in verdicts]
        report[f"eval/{domain}/pass_rate"] = sum(passed) / len(passed)
        report[f"eval/{domain}/score"] = sum(v.score for v in verdicts) / len(verdicts)
        passed_all += passed
    report["eval/pass_rate"] = sum(passed_all) / max(1, len(passed_all))
    return report
