"""Where a learner runs, and what sharding it over several processes needs (FSDP2 under torchrun, one process per
GPU; gloo processes on CPU): :class:`DistContext` (one process: :func:`local_context`; a rank of a torchrun job:
:func:`process_group`), then

- joining the job (nccl on a GPU, gloo on CPU) and the mixed-precision policy: FSDP's bf16 (bf16 parameters, fp32
  gradient reduction) on a GPU that has bf16; elsewhere the single-process rule (``TrainConfig.bf16``, default off on
  CPU);
- ``fully_shard`` of each decoder layer, then the root;
- full state dicts gathered from the shards, and the optimizer state converted between the name-keyed form of
  ``torch.distributed.checkpoint`` and the index-keyed form one process writes, so any number of processes, one
  included, resumes from any checkpoint.

The :class:`~posttrain.training.learner.Learner` calls these; :mod:`posttrain.training.fsdp` launches the job.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from posttrain.training.config import TrainConfig
from posttrain.training.modeling import resolve_device

log = logging.getLogger(__name__)


# --- where a learner runs --------------------------------------------------------------
@dataclass(frozen=True)
class DistContext:
    """This process's place in the training job: rank ``rank`` of ``world`` on ``device``.

    ``amp``: bf16 autocast inside the learner (``TrainConfig.bf16``; FSDP's own bf16 replaces it on a
    GPU). ``mesh`` and ``mp_policy``: the FSDP device mesh and mixed-precision policy (world > 1).
    """

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    amp: bool | None = None
    mesh: Any = None
    mp_policy: Any = None

    @property
    def main(self) -> bool:
        """Rank 0: the rank that draws rollouts, reports metrics and writes checkpoints."""
        return self.rank == 0

    def broadcast(self, payload: list[Any]) -> list[Any]:
        """Rank 0's ``payload`` on every rank (no communication with one process)."""
        if self.world > 1:
            dist.broadcast_object_list(payload, src=0)
        return payload

    def sum(self, value: float) -> float:
        """``value`` summed over the ranks."""
        if self.world == 1:
            return value

        total = torch.tensor(value, dtype=torch.float64, device=self.device)
        dist.all_reduce(total)
        return float(total)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def local_context(config: TrainConfig) -> DistContext:
    """One process on the config's device."""
    return DistContext(device=resolve_device(config.device), amp=config.bf16)


# --- sharding, inside each rank ----------------------------------------------------------------
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
