"""The learner on several processes: FSDP2 under torchrun, one process per GPU (gloo processes on CPU).

    # a job does it for you: train_sft or train_grpo with ``nproc_per_node: 8``; by hand:
    torchrun --standalone --nproc_per_node 8 -m posttrain.training.fsdp --kind sft --config sft.yaml

Everything but the sharding is the one-process trainers' (:func:`posttrain.training.sft.train_sft`,
:func:`posttrain.training.loop.train_grpo`): the same data, losses, optimizer, LR schedule and
checkpoints. Read top to bottom:

- every rank loads the model (and, resuming, the latest checkpoint's weights) on the CPU, then
  shards it with ``fully_shard``: each decoder layer, then the root; the shards go to the rank's
  GPU (nccl) or stay on the CPU (gloo);
- SFT: a step's global batch is the ``micro_batch_size * grad_accum_steps`` rows a single process
  would train on; rank ``r`` takes rows ``r, r + N, ...`` and runs them in micro-batches of
  ``micro_batch_size`` (every rank the same number of passes: one short of rows runs a pass
  with weight 0), gradients are synchronised on the last micro-batch only; each rank's loss is
  its rows' summed NLL divided by the step's trained tokens (all ranks), times N because FSDP
  averages gradients over the ranks: the update is the single-process one;
- GRPO: rank 0 runs the rollout side exactly as one process does (sync, pipelined, local
  rollout processes or Ray actors, with the task scheduler and the verifiers) from an unsharded
  copy of the policy; each step it broadcasts the chosen trajectories and advantages, every rank
  trains on its share in ``grpo_update`` (same split and weight-0 rule), and rank 0 refreshes its
  rollout copy from the gathered weights and publishes them to the rollout side; a KL reference
  model is sharded like the policy;
- the gradient norm is clipped over the sharded gradients (DTensors: the norm is global);
- bf16: FSDP mixed precision (bf16 parameters, fp32 gradient reduction) on a GPU that has
  bf16; elsewhere the single-process rule (``TrainConfig.bf16``, default off on CPU);
- rank 0 appends each step's metrics (the one-process trainers' names) to a JSON-lines file and
  writes the checkpoints: full state dicts gathered from the shards, in
  :mod:`~posttrain.training.checkpoint`'s format (the optimizer state indexed as a single process
  indexes it), so any number of processes, one included, resumes from them.

:func:`launch` starts torchrun as a child process (in the caller's process group, so a job's
cancel or kill stops it; the ranks die with torchrun), follows rank 0's metrics file and
raises :class:`DistributedRunError` with the tail of the output when the run fails.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import torch

from posttrain.training.checkpoint import (
    checkpoint_due,
    latest_checkpoint,
    load_latest_checkpoint,
    load_model_weights,
    read_trainer_state,
    save_checkpoint,
)
from posttrain.training.config import GRPOConfig, SFTConfig, TrainConfig
from posttrain.training.data import IGNORE, collate
from posttrain.training.modeling import autocast, frozen_copy, load_policy, resolve_device
from posttrain.training.optim import apply_lora, make_lr_scheduler, make_optimizer
from posttrain.training.sft import SFTResult, build_examples, sft_loss_sum, step_metrics, step_rows, training_rows

if TYPE_CHECKING:
    from posttrain.training.loop import GroupsFn, GRPOResult

log = logging.getLogger(__name__)

MetricsFn = Callable[[int, dict[str, float]], None]
StopFn = Callable[[], bool]
PR_SET_PDEATHSIG = 1
_TRAJECTORY_URL_ENV = "POSTTRAIN_FSDP_TRAJECTORY_DB"  # the database rank 0 writes GRPO trajectories to


class DistributedRunError(RuntimeError):
    """The multi-process learner failed; the message holds torchrun's exit status and last output."""


# --- inside each rank ----------------------------------------------------------------
def _die_with_parent(sig: int = signal.SIGKILL) -> None:
    """torchrun starts each rank in its own session: make it end when torchrun ends, however it ends."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent or parent == 1:
        os._exit(1)  # the launcher is already gone


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
        raise ValueError(f"the checkpoint's optimizer holds {len(ids)} parameters, the model trains {len(names)}: "
                         "it was written for another model or LoRA setting")
    groups = [{**group, "params": [names[i] for i in group["params"]]} for group in indexed["param_groups"]]
    return {"state": {names[int(i)]: value for i, value in indexed["state"].items()}, "param_groups": groups}


def _shard(model: torch.nn.Module, mesh: Any, mp_policy: Any) -> None:
    """``fully_shard`` each decoder layer (the model's ``_no_split_modules``), then the root."""
    from torch.distributed.fsdp import fully_shard

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model
    layer_types = set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in layer_types]
    if not layers:
        log.warning("no decoder layers found (_no_split_modules=%s): the whole model is one FSDP unit", sorted(layer_types))
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)


def _aliases(model: torch.nn.Module) -> set[str]:
    """Names of parameters that are another name's parameter (tied embeddings): a single process's
    ``save_pretrained`` writes each once, and so do we (a gathered state dict holds them twice)."""
    first: dict[int, str] = {}
    return {name for name, p in model.named_parameters(remove_duplicate=False) if first.setdefault(id(p), name) != name}


def _full_tensor(value: torch.Tensor) -> torch.Tensor:
    return value.full_tensor() if hasattr(value, "full_tensor") else value


@dataclass
class _Ranks:
    """This process's place in the torchrun job and how it computes."""

    rank: int
    world: int
    device: torch.device
    mesh: Any
    mp_policy: Any
    amp: bool | None  # autocast inside the ranks (FSDP's own bf16 replaces it on a GPU)


@contextlib.contextmanager
def _process_group(config: TrainConfig) -> Iterator[_Ranks]:
    """Join the torchrun job (nccl on a GPU, gloo on CPU) for the duration of the block."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if config.model is None:
        raise ValueError(f"no model: set {type(config).__name__}.model to a model directory")
    if "RANK" not in os.environ:
        raise RuntimeError("run this under torchrun: torchrun --nproc_per_node N -m posttrain.training.fsdp --config FILE")
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
        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if fsdp_bf16 else MixedPrecisionPolicy()
        amp = False if fsdp_bf16 else config.bf16  # else as in one process: fp32, or bf16 autocast where asked for
        yield _Ranks(dist.get_rank(), world, device, init_device_mesh(device.type, (world,)), mp_policy, amp)
    finally:
        dist.destroy_process_group()


@dataclass
class _Learner:
    """A sharded model with its optimizer and schedule, resumed from the latest checkpoint when there is one."""

    model: torch.nn.Module
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any
    start: int  # the step the run continues from
    state: dict[str, Any]  # the checkpoint's state.json ({} on a fresh start)
    ckpt_root: Path | None
    tied: set[str]
    initial: torch.nn.Module | None = None  # with_initial: a frozen unsharded copy of the policy before any resume
    current: torch.nn.Module | None = None  # with_current: a frozen unsharded copy of the weights the run starts from


def _sharded_learner(config: TrainConfig, r: _Ranks, *, with_initial: bool = False, with_current: bool = False) -> _Learner:
    """Every rank loads the model (and, resuming, the latest checkpoint's weights) on the CPU, then shards it."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    assert config.model is not None
    torch.manual_seed(config.seed)
    model, tokenizer = load_policy(config.model, device="cpu")
    if config.lora is not None:
        model = apply_lora(model, config.lora)
    model.train()
    initial = frozen_copy(model) if with_initial else None
    ckpt_root = Path(config.output_dir) / "checkpoints" if config.output_dir else None
    # every rank reads the same checkpoint: full weights (and RNG) into the unsharded model
    loaded = load_latest_checkpoint(ckpt_root, model) if ckpt_root is not None and config.resume else None
    start = int(loaded[1]["step"]) if loaded else 0
    agreed = torch.tensor([start, -start], dtype=torch.int64, device=r.device)  # nccl reduces device tensors only
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    if int(agreed[0]) != -int(agreed[1]):
        raise RuntimeError(f"the ranks found different checkpoints under {ckpt_root} (rank {r.rank}: step {start})")
    current = frozen_copy(model) if with_current else None
    _shard(model, r.mesh, r.mp_policy)
    optimizer = make_optimizer(model, config)
    lr_scheduler = make_lr_scheduler(optimizer, config)
    if loaded:
        trainable = [name for name, p in model.named_parameters() if p.requires_grad]
        trainer = read_trainer_state(loaded[0])
        by_name = _optimizer_state_by_name(trainer["optimizer"], trainable)
        set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))
        if trainer["lr_scheduler"] is not None:
            lr_scheduler.load_state_dict(trainer["lr_scheduler"])
    return _Learner(model, tokenizer, optimizer, lr_scheduler, start, loaded[1] if loaded else {}, ckpt_root,
                    _aliases(model), initial, current)


def _full_state(learner: _Learner) -> dict[str, torch.Tensor]:
    """The whole model's weights on rank 0's CPU (a collective: every rank calls it; the others get nothing)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(learner.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _save(config: TrainConfig, r: _Ranks, learner: _Learner, step: int, state: dict[str, Any]) -> Path | None:
    """A checkpoint of full state dicts gathered from the shards, written by rank 0 (every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    assert learner.ckpt_root is not None
    model_state = {k: v for k, v in _full_state(learner).items() if k not in learner.tied}
    optimizer_state = get_optimizer_state_dict(learner.model, learner.optimizer,
                                               options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if r.rank != 0:
        return None
    return save_checkpoint(learner.ckpt_root, step, learner.model, learner.tokenizer, learner.optimizer, learner.lr_scheduler,
                           state, keep=config.keep_checkpoints, model_state=model_state,
                           optimizer_state=_optimizer_state_by_index(optimizer_state))


class _Emitter:
    """Rank 0's JSON-lines record of the run for the launcher (other ranks write nothing)."""

    def __init__(self, r: _Ranks, metrics_file: str | Path | None) -> None:
        self.out: TextIO | None = open(metrics_file, "a", buffering=1) if r.rank == 0 and metrics_file else None  # noqa: SIM115

    def __call__(self, record: dict[str, Any]) -> None:
        if self.out is not None:
            self.out.write(json.dumps(record) + "\n")
            self.out.flush()

    def close(self) -> None:
        if self.out is not None:
            self.out.close()


def train_sft_fsdp(config: SFTConfig, *, metrics_file: str | Path | None = None) -> SFTResult:
    """Run :func:`~posttrain.training.sft.train_sft`'s training as one rank of a torchrun job."""
    import torch.distributed as dist

    with _process_group(config) as r:
        rank, world, device = r.rank, r.world, r.device
        learner = _sharded_learner(config, r)
        model, tokenizer, optimizer, lr_scheduler, start = (learner.model, learner.tokenizer, learner.optimizer,
                                                            learner.lr_scheduler, learner.start)
        rows = training_rows(config, build_examples(config, tokenizer))
        emit = _Emitter(r, metrics_file)
        result = SFTResult(steps=start, checkpoint=None, metrics=[], model=model, resumed_from=start)
        emit({"event": "start", "resumed_from": start, "world_size": world, "device": str(device)})
        pad = tokenizer.pad_token_id
        for step in range(start, config.max_steps):
            t0 = time.perf_counter()
            chosen = step_rows(rows, step, config)
            total_tokens = int((collate(chosen, pad).labels[:, 1:] != IGNORE).sum())
            mine = chosen[rank::world]
            micro = config.micro_batch_size
            passes = math.ceil(math.ceil(len(chosen) / world) / micro)  # the same on every rank
            loss_value = 0.0
            for k in range(passes):
                part = mine[k * micro : (k + 1) * micro]
                weight = 1.0 if part else 0.0  # a pass with no rows of its own: the collectives still run
                batch = collate(part or chosen[:1], pad)
                model.set_requires_gradient_sync(k == passes - 1)  # type: ignore[operator]
                with autocast(device, r.amp):
                    loss = sft_loss_sum(model, batch, device) * (weight / max(1, total_tokens))
                (loss * world).backward()  # FSDP averages the ranks' gradients; the loss is their sum
                loss_value += float(loss.detach())
            step_loss = torch.tensor(loss_value, dtype=torch.float64, device=device)
            dist.all_reduce(step_loss)
            grad_norm = _full_tensor(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm or float("inf")))
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            elapsed = time.perf_counter() - t0
            metrics = step_metrics(float(step_loss), lr, float(grad_norm), total_tokens, elapsed)
            result.metrics.append(metrics)
            result.steps = step + 1
            emit({"step": step + 1, "metrics": metrics})
            if rank == 0:
                log.info("step %d/%d loss %.4f (%.2fs)", step + 1, config.max_steps, metrics["train/loss"], elapsed)
            if learner.ckpt_root is not None and checkpoint_due(config, step + 1):
                result.checkpoint = _save(config, r, learner, step + 1, {"data_position": step + 1}) or result.checkpoint
        if result.checkpoint is None and learner.ckpt_root is not None:
            result.checkpoint = latest_checkpoint(learner.ckpt_root)
        dist.barrier()  # no rank leaves while rank 0 still writes
        emit({"event": "end", "steps": result.steps, "checkpoint": str(result.checkpoint) if result.checkpoint else None})
        emit.close()
        return result


def train_grpo_fsdp(config: GRPOConfig, *, metrics_file: str | Path | None = None,
                    on_groups: GroupsFn | None = None) -> GRPOResult:
    """Run :func:`~posttrain.training.loop.train_grpo` as one rank of a torchrun job.

    Rank 0 drives the rollouts exactly as one process does (the same rollout sources: sync,
    pipelined, local processes or Ray), from an unsharded copy of the policy that it refreshes
    from the shards after every update; it picks the step's trajectories and broadcasts them.
    Every rank then runs :func:`~posttrain.training.learner.grpo_update` on its share; a KL
    reference model is sharded like the policy.
    """
    import torch.distributed as dist

    from posttrain.training.learner import grpo_update
    from posttrain.training.loop import GRPOResult, draw_step, rollout_source, time_step
    from posttrain.training.scheduler import Scheduler

    with _process_group(config) as r:
        learner = _sharded_learner(config, r, with_initial=config.kl_coef > 0, with_current=r.rank == 0)
        model, tokenizer, start = learner.model, learner.tokenizer, learner.start
        update_config = config.model_copy(update={"bf16": r.amp})  # FSDP's bf16 (on a GPU) replaces autocast
        ref_model = learner.initial
        if ref_model is not None:
            _shard(ref_model, r.mesh, r.mp_policy)
        emit = _Emitter(r, metrics_file)
        result = GRPOResult(steps=start, checkpoint=None, model=model, resumed_from=start)
        emit({"event": "start", "resumed_from": start, "world_size": r.world, "device": str(r.device)})
        with contextlib.ExitStack() as stack:
            scheduler: Scheduler | None = None
            rollouts = mirror = None
            if r.rank == 0:
                mirror = learner.current
                assert mirror is not None
                scheduler = Scheduler(config.scheduler)
                scheduler.set_domains(config.domains)
                if learner.state:
                    scheduler.load_state_dict(learner.state["scheduler"])
                rollouts = stack.enter_context(rollout_source(config, mirror, tokenizer, scheduler, version=start,
                                                              source=config.model))
            last_end = time.perf_counter()
            for step in range(start, config.max_steps):
                payload: list[Any] = [None, None, None]
                if rollouts is not None:
                    batch, *drawn = draw_step(rollouts, step, config)
                    payload = list(drawn)  # trajectories, advantages, rollout metrics
                dist.broadcast_object_list(payload, src=0)
                trajectories, advantages, metrics = payload
                t_learn = time.perf_counter()
                if trajectories:
                    metrics |= grpo_update(model, ref_model, learner.optimizer, learner.lr_scheduler, trajectories,
                                           advantages, update_config, tokenizer.pad_token_id, rank=r.rank, world=r.world)
                else:
                    learner.lr_scheduler.step()  # keep the schedule in step with the step count
                weights = _full_state(learner)  # every rank takes part; rank 0 refreshes its rollout policy
                if rollouts is not None and mirror is not None:
                    mirror.load_state_dict(weights)
                    rollouts.publish(mirror, version=step + 1)
                del weights
                last_end = time_step(metrics, t_learn, last_end)
                result.metrics.append(metrics)
                result.steps = step + 1
                if r.rank == 0 and on_groups is not None:
                    on_groups(step + 1, batch.groups)
                emit({"step": step + 1, "metrics": metrics})
                if learner.ckpt_root is not None and checkpoint_due(config, step + 1):
                    state = {"scheduler": scheduler.state_dict() if scheduler else None, "data_position": step + 1}
                    result.checkpoint = _save(config, r, learner, step + 1, state) or result.checkpoint
        if result.checkpoint is None and learner.ckpt_root is not None:
            result.checkpoint = latest_checkpoint(learner.ckpt_root)
        dist.barrier()
        emit({"event": "end", "steps": result.steps, "checkpoint": str(result.checkpoint) if result.checkpoint else None})
        emit.close()
        return result


# --- in the launching process -----------------------------------------------------------
def check_launch(config: SFTConfig | GRPOConfig) -> None:
    """Raise ``ValueError`` naming the fix when ``config`` cannot run on ``nproc_per_node`` processes here."""
    n = config.nproc_per_node
    if config.output_dir is None:
        raise ValueError(f"a multi-process {_kind(config).upper()} run needs output_dir: its final model is read back "
                         "from the last checkpoint")
    if config.model is None:
        raise ValueError("no model: set SFTConfig.model to a model directory")
    if resolve_device(config.device).type == "cuda" and torch.cuda.device_count() < n:
        raise ValueError(f"nproc_per_node={n} needs {n} GPUs, this machine has {torch.cuda.device_count()}; "
                         "lower nproc_per_node or set device: cpu")


def _pdeathsig() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGTERM when its launcher dies (libc resolved here, before the fork)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


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
    their environment, not on a command line). Returns an ``SFTResult`` or a ``GRPOResult``.
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
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(config.nproc_per_node),
               "-m", "posttrain.training.fsdp", "--kind", _kind(config), "--config", str(config_file),
               "--metrics-file", str(metrics_file)]
    env = dict(os.environ)
    if trajectories is not None:
        env[_TRAJECTORY_URL_ENV] = trajectories[0]
        command += ["--trajectories-job", str(trajectories[1]), "--trajectories-limit", str(trajectories[2])]
    sink = output if output is not None else sys.stderr
    tail: collections.deque[str] = collections.deque(maxlen=40)
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            preexec_fn=_pdeathsig(), text=True, errors="replace")  # noqa: PLW1509 - prctl only

    def pump() -> None:  # torchrun's and the ranks' output into ours, keeping the last lines for an error
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            with contextlib.suppress(Exception):
                sink.write(line)
                sink.flush()

    reader = threading.Thread(target=pump, name="torchrun-output", daemon=True)
    reader.start()
    follower = _Follower(metrics_file)
    if isinstance(config, GRPOConfig):
        from posttrain.training.loop import GRPOResult

        result: Any = GRPOResult(steps=0, checkpoint=None, metrics=[], model=None)
    else:
        result = SFTResult(steps=0, checkpoint=None, metrics=[], model=None)
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
        while proc.poll() is None:
            consume()
            if not stopped and should_stop is not None and should_stop():
                stopped = True
                proc.terminate()
                try:
                    proc.wait(timeout=stop_grace_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
            time.sleep(poll_s)
    finally:
        if proc.poll() is None:  # our caller is unwinding (an exception, an interrupt): take the run down with it
            proc.terminate()
            try:
                proc.wait(timeout=stop_grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(timeout=5)
    consume()
    config_file.unlink(missing_ok=True)
    if stopped:
        return result
    if proc.returncode != 0 or not ended:
        last = "\n".join(tail)
        raise DistributedRunError(
            f"the {config.nproc_per_node}-process FSDP learner failed (torchrun exit status {proc.returncode}) "
            f"after step {result.steps}; the end of its output:\n{last}"
        )
    return result


def trained_model(config: SFTConfig | GRPOConfig, checkpoint: str | Path) -> torch.nn.Module:
    """The model a finished run trained: ``config.model`` (with LoRA, if set) and the checkpoint's weights."""
    assert config.model is not None
    model, _ = load_policy(config.model)
    if config.lora is not None:
        model = apply_lora(model, config.lora)
    load_model_weights(model, Path(checkpoint) / "model")
    return model


# --- torchrun entry point -------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    import yaml
    from torch.distributed.elastic.multiprocessing.errors import record

    parser = argparse.ArgumentParser(prog="torchrun ... -m posttrain.training.fsdp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=["sft", "grpo"], default="sft", help="the trainer")
    parser.add_argument("--config", required=True, help="an SFTConfig or GRPOConfig as a YAML or JSON file")
    parser.add_argument("--metrics-file", help="rank 0 appends one JSON line per step here")
    parser.add_argument("--trajectories-job", type=int, help="GRPO: write each step's trajectories to this job's rows")
    parser.add_argument("--trajectories-limit", type=int, default=64, help="at most this many trajectories a step")
    args = parser.parse_args(argv)
    if "TORCHELASTIC_RUN_ID" in os.environ:
        _die_with_parent()
    rank = os.environ.get("RANK", "?")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s")
    raw = yaml.safe_load(Path(args.config).read_text())
    if args.kind == "grpo":
        on_groups = None
        if args.trajectories_job is not None and os.environ.get("RANK") == "0":
            from posttrain.platform.settings import get_settings
            from posttrain.training.jobs import TrajectoryWriter

            url = os.environ.get(_TRAJECTORY_URL_ENV) or get_settings().resolved_database_url
            on_groups = TrajectoryWriter(url, args.trajectories_job, args.trajectories_limit)
        record(train_grpo_fsdp)(GRPOConfig.model_validate(raw), metrics_file=args.metrics_file, on_groups=on_groups)
    else:
        record(train_sft_fsdp)(SFTConfig.model_validate(raw), metrics_file=args.metrics_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
