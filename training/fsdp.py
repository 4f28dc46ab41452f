"""The learner on several processes: FSDP2 under torchrun, one process per GPU (gloo processes on CPU).

    # a job does it for you: train_sft or train_grpo with ``nproc_per_node: 8``; by hand:
    torchrun --standalone --nproc_per_node 8 -m posttrain.training.fsdp --kind sft --config sft.yaml

There is no second trainer here: every rank runs the one-process loops
(:func:`posttrain.training.sft.train_sft`, :func:`posttrain.training.loop.train_grpo`) with the
:class:`~posttrain.training.learner.DistContext` that :func:`process_group` yields, and the
:class:`~posttrain.training.learner.Learner` shards itself. This module holds what sharding needs:

- joining the job (nccl on a GPU, gloo on CPU) and the mixed-precision policy: FSDP's bf16 (bf16
  parameters, fp32 gradient reduction) on a GPU that has bf16; elsewhere the single-process rule
  (``TrainConfig.bf16``, default off on CPU);
- ``fully_shard`` of each decoder layer, then the root;
- full state dicts gathered from the shards, and the optimizer state converted between the name-keyed
  form of ``torch.distributed.checkpoint`` and the index-keyed form one process writes, so any number
  of processes, one included, resumes from any checkpoint;
- :func:`launch`, which starts torchrun as a child process (in the caller's process group, so a job's
  cancel or kill stops it; the ranks die with torchrun), follows rank 0's metrics file and raises
  :class:`DistributedRunError` with the tail of the output when the run fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO, cast

import torch
import torch.distributed as dist
import yaml
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.elastic.multiprocessing.errors import record as record_errors
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from posttrain.platform.settings import get_settings
from posttrain.platform.supervise import Supervised, die_with_parent
from posttrain.training.checkpoint import load_model_weights
from posttrain.training.config import GRPOConfig, SFTConfig, TrainConfig
from posttrain.training.jobs import TrajectoryWriter
from posttrain.training.learner import DistContext, TrainResult
from posttrain.training.loop import train_grpo
from posttrain.training.modeling import load_policy, resolve_device
from posttrain.training.optim import apply_lora
from posttrain.training.sft import train_sft

log = logging.getLogger(__name__)

MetricsFn = Callable[[int, dict[str, float]], None]
StopFn = Callable[[], bool]
_TRAJECTORY_URL_ENV = "POSTTRAIN_FSDP_TRAJECTORY_DB"  # the database rank 0 writes GRPO trajectories to


class DistributedRunError(RuntimeError):
    """The multi-process learner failed; the message holds torchrun's exit status and last output."""


# --- inside each rank ----------------------------------------------------------------
def _optimizer_state_by_index(named: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter names (torch.distributed.checkpoint) in the form
    ``optimizer.state_dict()`` has in one process: parameters numbered in param-group order."""
    index: dict[str, int] = {}
    groups = []
    for group in named["param_groups"]:
        groups.append({**group, "params": [index.setdefault(name, len(index)) for name in group["params"]]})
    return {"state": {index[name]: value for name, value in named["state"].items()}, "param_groups": groups}


def _optimizer_state_by_name(indexed: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The inverse of :func:`_optimizer_state_by_index` for a model whose trainable parameters are ``names``."""
    ids = [i for group in indexed["param_groups"] for i in group["params"]]
    if sorted(ids) != list(range(len(names))):
        raise ValueError(
            f"the checkpoint's optimizer holds {len(ids)} parameters, the model trains {len(names)}: "
            "it was written for another model or LoRA setting"
        )
    groups = [{**group, "params": [names[i] for i in group["params"]]} for group in indexed["param_groups"]]
    return {"state": {names[int(i)]: value for i, value in indexed["state"].items()}, "param_groups": groups}


def shard(model: torch.nn.Module, ctx: DistContext) -> None:
    """``fully_shard`` each decoder layer (the model's ``_no_split_modules``), then the root."""
    # a peft model's base model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
    layer_types = set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in layer_types]
    if not layers:
        log.warning(
            "no decoder layers found (_no_split_modules=%s): the whole model is one FSDP unit", sorted(layer_types)
        )
    for layer in layers:
        fully_shard(layer, mesh=ctx.mesh, mp_policy=ctx.mp_policy)
    fully_shard(model, mesh=ctx.mesh, mp_policy=ctx.mp_policy)


def aliases(model: torch.nn.Module) -> set[str]:
    """Names of parameters that are another name's parameter (tied embeddings): a single process's
    ``save_pretrained`` writes each once, and so do we (a gathered state dict holds them twice)."""
    first: dict[int, str] = {}
    return {name for name, p in model.named_parameters(remove_duplicate=False) if first.setdefault(id(p), name) != name}


@contextlib.contextmanager
def process_group(config: TrainConfig) -> Iterator[DistContext]:
    """Join the torchrun job (nccl on a GPU, gloo on CPU) for the duration of the block."""
    if config.model is None:
        raise ValueError(f"no model: set {type(config).__name__}.model to a model directory")
    if "RANK" not in os.environ:
        raise RuntimeError(
            "run this under torchrun: torchrun --nproc_per_node N -m posttrain.training.fsdp --config FILE"
        )
    requested = resolve_device(config.device)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if requested.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    try:
        world = dist.get_world_size()
        bf16 = config.bf16 if config.bf16 is not None else device.type == "cuda" and torch.cuda.is_bf16_supported()
        fsdp_bf16 = bool(bf16) and device.type == "cuda"  # bf16 compute and all-gathers, fp32 gradient reduction
        mp_policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if fsdp_bf16
            else MixedPrecisionPolicy()
        )
        amp = False if fsdp_bf16 else config.bf16  # else as in one process: fp32, or bf16 autocast where asked for
        yield DistContext(dist.get_rank(), world, device, amp, init_device_mesh(device.type, (world,)), mp_policy)
    finally:
        dist.destroy_process_group()


def agree_on_start(ctx: DistContext, start: int, ckpt_root: Path | None) -> None:
    """Every rank must have found the same checkpoint to resume from."""
    agreed = torch.tensor([start, -start], dtype=torch.int64, device=ctx.device)  # nccl reduces device tensors only
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    if int(agreed[0]) != -int(agreed[1]):
        raise RuntimeError(f"the ranks found different checkpoints under {ckpt_root} (rank {ctx.rank}: step {start})")


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, indexed: dict[str, Any]) -> None:
    """Load a one-process (index-keyed) optimizer state into a sharded model's optimizer."""
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    by_name = _optimizer_state_by_name(indexed, trainable)
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on rank 0's CPU (a collective: every rank calls it; the others get nothing)."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return cast("dict[str, torch.Tensor]", state)  # full_state_dict: plain tensors, no shards


def full_states(model: torch.nn.Module, optimizer: torch.optim.Optimizer, tied: set[str]) -> dict[str, Any]:
    """``save_checkpoint``'s ``model_state`` and ``optimizer_state``, gathered from the shards (a collective:
    every rank calls it; only rank 0's are filled)."""
    model_state = {k: v for k, v in full_state(model).items() if k not in tied}
    optimizer_state = get_optimizer_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if not optimizer_state:  # not rank 0
        return {}
    return {"model_state": model_state, "optimizer_state": _optimizer_state_by_index(optimizer_state)}


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
