"""The learner on several processes: FSDP2 under torchrun, one process per GPU (gloo processes on CPU).

    # a job does it for you: train_sft or train_grpo with ``nproc_per_node: 8``; by hand:
    torchrun --standalone --nproc_per_node 8 -m posttrain.training.fsdp --kind sft --config sft.yaml

There is no second trainer here: every rank runs the one-process loops
(:func:`posttrain.training.sft.train_sft`, :func:`posttrain.training.loop.train_grpo`) with the
:class:`~posttrain.training.sharding.DistContext` that :func:`~posttrain.training.sharding.process_group` yields,
and the :class:`~posttrain.training.learner.Learner` shards itself (:mod:`posttrain.training.sharding`). This module
launches the job:

- :func:`launch`, which starts torchrun as a child process (in the caller's process group, so a job's
  cancel or kill stops it; the ranks die with torchrun), follows rank 0's metrics file and raises
  :class:`DistributedRunError` with the tail of the output when the run fails.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch
import yaml
from torch.distributed.elastic.multiprocessing.errors import record as record_errors

from posttrain.platform.settings import get_settings
from posttrain.platform.supervise import Supervised, die_with_parent
from posttrain.training.checkpoint import load_model_weights
from posttrain.training.config import GRPOConfig, SFTConfig
from posttrain.training.learner import TrainResult
from posttrain.training.loop import train_grpo
from posttrain.training.modeling import load_policy, resolve_device
from posttrain.training.optim import apply_lora
from posttrain.training.sft import train_sft
from posttrain.training.sharding import process_group
from posttrain.training.trajectories import TrajectoryWriter

log = logging.getLogger(__name__)

MetricsFn = Callable[[int, dict[str, float]], None]
StopFn = Callable[[], bool]
_TRAJECTORY_URL_ENV = "POSTTRAIN_FSDP_TRAJECTORY_DB"  # the database rank 0 writes GRPO trajectories to


class DistributedRunError(RuntimeError):
    """The multi-process learner failed; the message holds torchrun's exit status and last output."""


# --- in the launching process -----------------------------------------------------------
def check_launch(config: SFTConfig | GRPOConfig) -> None:
    """Raise ``ValueError`` naming the fix when ``config`` cannot run on ``nproc_per_node`` processes here."""
    n = config.nproc_per_node
    if config.output_dir is None:
        raise ValueError(
            f"a multi-process {_kind(config).upper()} run needs output_dir: its final model is read back "
            "from the last checkpoint"
        )
    if config.model is None:
        raise ValueError("no model: set SFTConfig.model to a model directory")
    if resolve_device(config.device).type == "cuda" and torch.cuda.device_count() < n:
        raise ValueError(
            f"nproc_per_node={n} needs {n} GPUs, this machine has {torch.cuda.device_count()}; "
            "lower nproc_per_node or set device: cpu"
        )


class _Follower:
    """Complete JSON lines appended to a file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial = path, 0, b""

    def new_records(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


def _kind(config: SFTConfig | GRPOConfig) -> str:
    return "grpo" if isinstance(config, GRPOConfig) else "sft"


def launch(
    config: SFTConfig | GRPOConfig,
    *,
    on_metrics: MetricsFn | None = None,
    should_stop: StopFn | None = None,
    output: TextIO | None = None,
    poll_s: float = 0.2,
    stop_grace_s: float = 15.0,
    trajectories: tuple[str, int, int] | None = None,
) -> Any:
    """Train ``config`` (SFT or GRPO) on ``config.nproc_per_node`` FSDP processes under torchrun and wait for it.

    ``on_metrics(step, metrics)`` is called once per step, in order, as rank 0 reports it;
    ``should_stop()`` true ends the run (SIGTERM to torchrun, which stops its ranks; SIGKILL after
    ``stop_grace_s``) and returns what was done. The returned result has no model: the trained
    weights are the last checkpoint's (:func:`trained_model`). torchrun's output goes to
    ``output`` (default: stderr). ``trajectories=(database_url, job_id, limit)`` (GRPO in a job): rank 0
    writes up to ``limit`` trajectories of each step to the job's rows (the URL reaches the ranks in
    their environment, not on a command line). Returns a ``TrainResult``.
    """
    check_launch(config)
    assert config.output_dir is not None
    run_dir = Path(config.output_dir) / "fsdp"
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in run_dir.glob("metrics-*.jsonl"):
        old.unlink(missing_ok=True)
    tag = uuid.uuid4().hex[:8]
    config_file, metrics_file = run_dir / f"config-{tag}.json", run_dir / f"metrics-{tag}.jsonl"
    tmp = run_dir / f".{config_file.name}.tmp"
    tmp.write_text(config.model_dump_json(indent=1))
    os.replace(tmp, config_file)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(config.nproc_per_node),
        "-m",
        "posttrain.training.fsdp",
        "--kind",
        _kind(config),
        "--config",
        str(config_file),
        "--metrics-file",
        str(metrics_file),
    ]
    env = dict(os.environ)
    if trajectories is not None:
        env[_TRAJECTORY_URL_ENV] = trajectories[0]
        command += ["--trajectories-job", str(trajectories[1]), "--trajectories-limit", str(trajectories[2])]
    sink = output if output is not None else sys.stderr

    def forward(line: str) -> None:  # torchrun's and the ranks' output into ours
        sink.write(line + "\n")
        sink.flush()

    child = Supervised(
        command, env=env, on_line=forward, tail_lines=40
    )  # in our process group: a job's kill reaches it
    follower = _Follower(metrics_file)
    result = TrainResult(steps=0, checkpoint=None, metrics=[], model=None)
    ended = stopped = False

    def consume() -> None:
        nonlocal ended
        for record in follower.new_records():
            if record.get("event") == "start":
                result.resumed_from = result.steps = int(record["resumed_from"])
            elif record.get("event") == "end":
                ended = True
                result.steps = int(record["steps"])
                result.checkpoint = Path(record["checkpoint"]) if record.get("checkpoint") else None
            elif "step" in record:
                result.steps = int(record["step"])
                result.metrics.append(record["metrics"])
                if on_metrics is not None:
                    on_metrics(result.steps, record["metrics"])

    try:
        while child.poll() is None:
            consume()
            if not stopped and should_stop is not None and should_stop():
                stopped = True
                child.stop(stop_grace_s)
            time.sleep(poll_s)
    finally:  # our caller may be unwinding (an exception, an interrupt): take the run down with it
        child.stop(stop_grace_s)
    consume()
    config_file.unlink(missing_ok=True)
    if stopped:
        return result
    if child.proc.returncode != 0 or not ended:
        raise DistributedRunError(
            f"the {config.nproc_per_node}-process FSDP learner failed (torchrun exit status {child.proc.returncode}) "
            f"after step {result.steps}; the end of its output:\n{child.last_lines(40)}"
        )
    return result


def trained_model(config: SFTConfig | GRPOConfig, checkpoint: str | Path) -> torch.nn.Module:
    """The model a finished run trained: ``config.model`` (with LoRA, if set) and the checkpoint's weights."""
    assert config.model is not None
    model: torch.nn.Module  # a peft model under LoRA
    model, _ = load_policy(config.model)
    if config.lora is not None:
        model = apply_lora(model, config.lora)
    load_model_weights(model, Path(checkpoint) / "model")
    return model


# --- torchrun entry point -------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="torchrun ... -m posttrain.training.fsdp", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--kind", choices=["sft", "grpo"], default="sft", help="the trainer")
    parser.add_argument("--config", required=True, help="an SFTConfig or GRPOConfig as a YAML or JSON file")
    parser.add_argument("--metrics-file", help="rank 0 appends one JSON line per step here")
    parser.add_argument("--trajectories-job", type=int, help="GRPO: write each step's trajectories to this job's rows")
    parser.add_argument("--trajectories-limit", type=int, default=64, help="at most this many trajectories a step")
    args = parser.parse_args(argv)
    if "TORCHELASTIC_RUN_ID" in os.environ and not die_with_parent(signal.SIGKILL):
        os._exit(1)  # torchrun starts each rank in its own session: end with it, however it ends; it is gone
    rank = os.environ.get("RANK", "?")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s")
    raw = yaml.safe_load(Path(args.config).read_text())
    config = (GRPOConfig if args.kind == "grpo" else SFTConfig).model_validate(raw)
    record_errors(_run_rank)(config, args)
    return 0


def _run_rank(config: SFTConfig | GRPOConfig, args: argparse.Namespace) -> TrainResult:
    """This rank's share of the run: the one-process loop with this rank's context; rank 0 appends a
    ``start`` record, one record per step and an ``end`` record to the metrics file."""
    with process_group(config) as ctx:
        out = open(args.metrics_file, "a", buffering=1) if ctx.main and args.metrics_file else None  # noqa: SIM115

        def emit(record: dict[str, Any]) -> None:
            if out is not None:
                out.write(json.dumps(record) + "\n")
                out.flush()

        def on_metrics(step: int, metrics: dict[str, float]) -> None:
            emit({"step": step, "metrics": metrics})
            if ctx.main:
                log.info("step %d/%d loss %.4f", step, config.max_steps, metrics.get("train/loss", float("nan")))

        def on_start(resumed_from: int) -> None:
            emit({"event": "start", "resumed_from": resumed_from, "world_size": ctx.world, "device": str(ctx.device)})

        try:
            if isinstance(config, GRPOConfig):
                on_groups = None
                if args.trajectories_job is not None and ctx.main:
                    url = os.environ.get(_TRAJECTORY_URL_ENV) or get_settings().resolved_database_url
                    on_groups = TrajectoryWriter(url, args.trajectories_job, args.trajectories_limit)
                result = train_grpo(config, ctx=ctx, on_start=on_start, on_metrics=on_metrics, on_groups=on_groups)
            else:
                result = train_sft(config, ctx=ctx, on_start=on_start, on_metrics=on_metrics)
            emit(
                {
                    "event": "end",
                    "steps": result.steps,
                    "checkpoint": str(result.checkpoint) if result.checkpoint else None,
                }
            )
        finally:
            if out is not None:
                out.close()
    return result


if __name__ == "__main__":
    sys.exit(main())
