"""Training checkpoints: everything a resumed run needs to continue where it stopped.

A checkpoint is a directory ``<root>/step_<N>/``:

- ``model/``: the model (``save_pretrained``: a servable Hugging Face directory, or the
  LoRA adapter for a peft model) and its tokenizer;
- ``trainer.pt``: optimizer and LR-scheduler state and the RNG states (python, numpy,
  torch CPU and CUDA);
- ``state.json``: the step, the data position, the task scheduler's statistics and any
  other JSON the trainer passes.

It is written to a temporary directory next to it and renamed into place, so a crash
never leaves a half-written ``step_<N>``; older checkpoints beyond ``keep`` are removed.
"""

from __future__ import annotations

import errno
import json
import logging
import pickle
import random
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import PreTrainedTokenizerBase

from posttrain.platform.jobs.registry import no_room_left

if TYPE_CHECKING:
    from posttrain.training.config import TrainConfig

PREFIX = "step_"

log = logging.getLogger(__name__)


def checkpoint_due(config: TrainConfig, steps_done: int) -> bool:
    """Whether a run that has finished ``steps_done`` steps checkpoints now: every
    ``checkpoint.every`` steps (0: never in between) and always at the last step."""
    every = config.checkpoint.every
    return steps_done == config.max_steps or bool(every and steps_done % every == 0)


def rng_state() -> dict[str, Any]:
    """Every RNG's state as tensors and plain values, so ``trainer.pt`` loads with ``weights_only``."""
    # The legacy global generator is always MT19937, so its state is the tuple form.
    legacy = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    kind, keys, pos, has_gauss, cached = legacy
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.int64).astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def save_checkpoint(
    root: str | Path,
    step: int,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase | None,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: Any | None,
    state: dict[str, Any],
    *,
    keep: int = 2,
    model_state: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> Path:
    """Write ``root/step_<step>`` atomically and return its path.

    ``model_state`` / ``optimizer_state``: full state dicts to write instead of the model's and the
    optimizer's own (a sharded learner gathers them first, see :mod:`posttrain.training.fsdp`)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:08d}"
    tmp = root / f".{final.name}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.mkdir()
    try:
        model.save_pretrained(tmp / "model", **({"state_dict": model_state} if model_state is not None else {}))  # type: ignore[operator]
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "model")
        torch.save(
            {
                "optimizer": optimizer_state if optimizer_state is not None else optimizer.state_dict(),
                "lr_scheduler": lr_scheduler.state_dict() if lr_scheduler is not None else None,
                "rng": rng_state(),
            },
            tmp / "trainer.pt",
        )
        (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=1))
        if final.exists():  # the same step saved again after a resume: replace it
            trash = root / f".{final.name}.{uuid.uuid4().hex[:8]}.old"
            final.rename(trash)
            shutil.rmtree(trash, ignore_errors=True)
        tmp.rename(final)
    except BaseException as exc:
        full = isinstance(exc, Exception) and no_room_left(root)  # measured before the partial write is removed
        shutil.rmtree(tmp, ignore_errors=True)
        if full and not (isinstance(exc, OSError) and exc.errno == errno.ENOSPC):
            # torch.save reports a short write as "unexpected pos ...": say what happened
            raise OSError(errno.ENOSPC, f"No space left on device while writing checkpoint {final} ({exc})") from exc
        raise
    for old in list_checkpoints(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoint_step(path: str | Path) -> int:
    """The step a checkpoint directory ``step_<N>`` was written at."""
    return int(Path(path).name[len(PREFIX) :])


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / "state.json").is_file()]
    return sorted(found, key=checkpoint_step)


def latest_checkpoint(root: str | Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


class CheckpointError(RuntimeError):
    """Checkpoints exist under a root but none of them can be loaded."""


class LoadedCheckpoint(NamedTuple):
    path: Path
    state: dict[str, Any]  # state.json
    trainer: dict[str, Any]  # trainer.pt: optimizer, LR scheduler and RNG states (the RNG already restored)


def load_latest_checkpoint(root: str | Path, model: torch.nn.Module) -> LoadedCheckpoint | None:
    """Restore the model weights and RNG of the newest checkpoint under ``root`` that loads, or None when
    there is none; its optimizer and scheduler states come back in ``trainer`` for the caller to load.

    A checkpoint that fails to load (a torn or garbled file: a crash, a full disk, bad storage) is
    logged and skipped for the one before it, which is then loaded over whatever the bad one had
    restored; :class:`CheckpointError` when checkpoints exist but none loads.
    """
    found = list_checkpoints(root)
    errors: list[str] = []
    for path in reversed(found):
        try:
            state, trainer = load_checkpoint(path, model)
        except Exception as exc:  # noqa: BLE001 - whatever a damaged file raises: try the previous checkpoint
            reason = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
            errors.append(f"{path.name}: {reason}")
            log.warning(
                "checkpoint %s is corrupt or unreadable (%s); falling back to the previous checkpoint", path, reason
            )
            continue
        if errors:
            log.warning(
                "the run resumes from checkpoint %s (step %s) after skipping %d corrupt one(s)",
                path,
                state.get("step"),
                len(errors),
            )
        else:
            log.info("the run resumes from checkpoint %s (step %s)", path, state.get("step"))
        return LoadedCheckpoint(path, state, trainer)
    if errors:
        raise CheckpointError(
            f"no checkpoint under {root} can be loaded ({'; '.join(errors)}); "
            "remove the directory (or set resume: false) to start the run afresh"
        )
    return None


def load_model_weights(model: torch.nn.Module, model_dir: str | Path) -> None:
    """Load saved weights into an already built model (full weights, or a peft adapter)."""
    model_dir = Path(model_dir)
    if _is_peft(model):
        from peft import set_peft_model_state_dict  # heavy: only for an adapter

        set_peft_model_state_dict(model, load_file(model_dir / "adapter_model.safetensors"))
        return
    weights: dict[str, torch.Tensor] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        weights.update(load_file(file))
    if not weights:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    result = model.load_state_dict(weights, strict=False)
    tied = {k for k in result.missing_keys if k.endswith("lm_head.weight")}
    if result.unexpected_keys or set(result.missing_keys) - tied:
        raise ValueError(
            f"checkpoint {model_dir} does not match the model: missing {result.missing_keys[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}"
        )


def read_trainer_state(path: str | Path) -> dict[str, Any]:
    """``trainer.pt`` of the checkpoint at ``path``, tensors and plain values only (``weights_only``):
    a file planted in a checkpoint directory cannot run code when a run resumes from it."""
    try:
        return torch.load(Path(path) / "trainer.pt", map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{Path(path) / 'trainer.pt'} holds more than tensors and plain values, which a "
            f"checkpoint never does ({str(exc).splitlines()[0][:200]}); it was not loaded"
        ) from None


def load_checkpoint(
    path: str | Path, model: torch.nn.Module, *, restore_rng: bool = True
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restore the model weights and RNG from ``path``; return its ``state.json`` and ``trainer.pt`` (read once)."""
    path = Path(path)
    load_model_weights(model, path / "model")
    trainer = read_trainer_state(path)
    if restore_rng:
        set_rng_state(trainer["rng"])
    return json.loads((path / "state.json").read_text()), trainer
