"""Job kinds for the worker: ``train_sft``, ``train_grpo``, ``evaluate``.

Not yet listed in ``posttrain.platform.jobs.registry.KIND_MODULES`` (the lead wires it).
Checkpoints go under the job's ``workdir`` unless the config names an ``output_dir``;
a resumed attempt continues from the latest one. Metrics go to ``ctx.log_metrics``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from posttrain.platform.jobs.registry import JobKind, register
from posttrain.training.config import EvalConfig, GRPOConfig, SFTConfig

if TYPE_CHECKING:
    from posttrain.platform.jobs.context import JobContext


def _with_output_dir(ctx: JobContext, config: Any) -> Any:
    if config.output_dir is None:
        config = config.model_copy(update={"output_dir": str(ctx.workdir / "run")})
    return config


def _reporter(ctx: JobContext, total: int):  # type: ignore[no-untyped-def]
    def on_metrics(step: int, metrics: dict[str, float]) -> None:
        ctx.log_metrics(step, metrics)
        ctx.progress(step / total, f"step {step}/{total} loss {metrics.get('train/loss', float('nan')):.4f}")

    return on_metrics


def run_sft(ctx: JobContext, config: SFTConfig) -> dict[str, Any]:
    from posttrain.training.sft import train_sft

    config = _with_output_dir(ctx, config)
    result = train_sft(config, on_metrics=_reporter(ctx, config.max_steps), should_stop=lambda: ctx.should_stop)
    ctx.check_stop()
    return {"steps": result.steps, "checkpoint": str(result.checkpoint) if result.checkpoint else None}


def run_grpo(ctx: JobContext, config: GRPOConfig) -> dict[str, Any]:
    from posttrain.training.loop import train_grpo

    config = _with_output_dir(ctx, config)
    result = train_grpo(config, on_metrics=_reporter(ctx, config.max_steps), should_stop=lambda: ctx.should_stop)
    ctx.check_stop()
    return {"steps": result.steps, "checkpoint": str(result.checkpoint) if result.checkpoint else None}


def run_evaluate(ctx: JobContext, config: EvalConfig) -> dict[str, Any]:
    from posttrain.training.evaluate import evaluate_policy

    report = evaluate_policy(config)
    ctx.log_metrics(0, report)
    return report


TRAIN_SFT = register(JobKind("train_sft", SFTConfig, run_sft, "supervised fine-tuning", resumable=True, retryable=True))
TRAIN_GRPO = register(JobKind("train_grpo", GRPOConfig, run_grpo, "GRPO reinforcement learning", resumable=True, retryable=True))
EVALUATE = register(JobKind("evaluate", EvalConfig, run_evaluate, "pass rate on held-out tasks", retryable=True))
