"""Weight interpolation (WiSE-FT) between a trained model and the model it started from: a forgetting control.

    from posttrain.platform.models.interpolate import interpolate_models
    row = interpolate_models(operator, "base", "base-grpo", 0.5)          # registered as "base-grpo-alpha0.5"
    interpolate_dirs(Path(a_dir), Path(b_dir), Path("out"), 0.25)        # the same, on directories, unregistered

Every floating tensor of the result is ``(1 - alpha) * A + alpha * B``, computed in float32 (float64 stays
float64) and cast back to the stored dtype, where A is the model training started from and B the trained one;
a tensor that is not floating (an index, a mask) is B's. The ends are copies, not arithmetic: at ``alpha = 0``
the weight files are A's byte for byte, at ``alpha = 1`` B's, so nothing rounds differently. The config,
tokenizer, chat template and generation config are always B's (the model it is, trained as B was put).

The two models must hold the same tensors, by name, shape and dtype, as a model and one trained from it do;
anything else is refused before a byte is written, naming both models and the first tensor that differs. The
result is written tensor by tensor (one safetensors file of B's layout at a time, both inputs memory-mapped),
into a temporary directory renamed into place, so a failed interpolation leaves nothing behind.

:func:`interpolate_models` is the operator action (audited as ``model.interpolate``) that writes
``<data_dir>/models/<name>`` and registers it with A as its base and ``meta["interpolated"] = {"a", "b", "alpha"}``.
Picking alpha on validation tasks is the ``interpolate_model`` job's part (:mod:`posttrain.training.interpolation`).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from posttrain.platform.auth import Identity, action, audit
from posttrain.platform.db.models import Model, Role
from posttrain.platform.engines.inspect import ModelDirError, inspect_model_dir
from posttrain.platform.models.registry import ModelNotFound, get_model, register_model
from posttrain.platform.settings import get_settings

Progress = Callable[[float, str], None]

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
WEIGHTS = ".safetensors"
INDEX = ".safetensors.index.json"
OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".bin.index.json")  # weights this module cannot read
META_KEY = "interpolated"


class InterpolationError(ModelDirError):
    """An interpolation that cannot be done; the message names the models (or the input) and the fix."""


def _is_weights(path: Path) -> bool:
    return path.name.endswith((WEIGHTS, INDEX, *OTHER_WEIGHTS))


def check_alpha(alpha: float) -> float:
    """``alpha`` as a float in [0, 1], else :class:`InterpolationError` naming it."""
    if (
        isinstance(alpha, bool)
        or not isinstance(alpha, (int, float))
        or not math.isfinite(alpha)
        or not 0 <= alpha <= 1
    ):
        raise InterpolationError(f"alpha {alpha!r} is outside [0, 1]: give --alpha between 0 (the model it started "
                                 "from, A) and 1 (the trained model, B)")  # fmt: skip
    return float(alpha)


def weight_files(model_dir: Path, label: str) -> list[Path]:
    """The safetensors files of ``model_dir``; a directory without any (a LoRA adapter, ``.bin`` weights) is refused."""
    if (model_dir / "adapter_config.json").is_file():
        raise InterpolationError(f"model {label} at {model_dir} is a LoRA adapter; export it with its adapter merged "
                                 "(posttrain models export --format hf) and register that directory")  # fmt: skip
    files = sorted(model_dir.glob(f"*{WEIGHTS}"))
    if not files:
        raise InterpolationError(f"model {label} at {model_dir} has no *.safetensors weights; import it "
                                 "(posttrain models import DIR) to have them written as safetensors")  # fmt: skip
    return files


def _header(files: list[Path]) -> dict[str, tuple[Path, tuple[int, ...], str]]:
    """Each tensor's file, shape and dtype, read from the files' headers (no tensor is loaded)."""
    from safetensors import safe_open  # heavy: this module stays light for the CLI

    found: dict[str, tuple[Path, tuple[int, ...], str]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                piece = f.get_slice(key)
                found[key] = (file, tuple(piece.get_shape()), str(piece.get_dtype()))
    return found


def _config(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "config.json").read_text())


def check_compatible(
    a_dir: Path, b_dir: Path, a_label: str, b_label: str
) -> dict[str, tuple[Path, tuple[int, ...], str]]:
    """A's tensors (file, shape, dtype), after checking B holds the same ones by name, shape and dtype and that both
    are the same architecture; else :class:`InterpolationError` naming both models and the first difference."""
    for label, where in ((a_label, a_dir), (b_label, b_dir)):
        try:
            inspect_model_dir(where)
        except ModelDirError as exc:
            raise InterpolationError(f"model {label}: {exc}") from None
    a_config, b_config = _config(a_dir), _config(b_dir)
    for field in ("model_type", "architectures"):
        if a_config.get(field) != b_config.get(field):
            raise InterpolationError(
                f"models {a_label} and {b_label} are not the same architecture ({field} {a_config.get(field)!r} against "
                f"{b_config.get(field)!r}); interpolate a trained model with the model it was trained from"
            )
    a_tensors = _header(weight_files(a_dir, a_label))
    b_tensors = _header(weight_files(b_dir, b_label))
    fix = "interpolate a trained model with the model it was trained from (same architecture and size)"
    for name in sorted(set(a_tensors) | set(b_tensors)):
        if name not in b_tensors or name not in a_tensors:
            has, lacks = (a_label, b_label) if name in a_tensors else (b_label, a_label)
            raise InterpolationError(f"models {a_label} and {b_label} do not hold the same tensors: {name!r} is in "
                                     f"{has} but not in {lacks}; {fix}")  # fmt: skip
        (_, a_shape, a_dtype), (_, b_shape, b_dtype) = a_tensors[name], b_tensors[name]
        if (a_shape, a_dtype) != (b_shape, b_dtype):
            raise InterpolationError(f"models {a_label} and {b_label} differ at tensor {name!r}: {list(a_shape)} {a_dtype} "
                                     f"in {a_label}, {list(b_shape)} {b_dtype} in {b_label}; {fix}")  # fmt: skip
    return a_tensors


def _copy_entry(source: Path, target: Path) -> None:
    """A regular file or a directory of them (symbolic links are left out)."""
    if source.is_symlink():
        return
    if source.is_dir():
        target.mkdir()
        for item in sorted(source.iterdir()):
            _copy_entry(item, target / item.name)
    elif source.is_file():
        shutil.copyfile(source, target)


def _blend_file(
    b_file: Path,
    out_file: Path,
    alpha: float,
    a_tensors: dict[str, tuple[Path, tuple[int, ...], str]],
    a_open: Callable[[Path], Any],
) -> None:
    """One of B's weight files blended with A's tensors of the same names, written to ``out_file``."""
    import torch  # heavy: only when models are interpolated
    from safetensors import safe_open
    from safetensors.torch import save_file

    blended: dict[str, torch.Tensor] = {}
    with safe_open(str(b_file), framework="pt") as b:
        metadata = b.metadata()
        for name in b.keys():
            theirs = b.get_tensor(name)
            if not theirs.is_floating_point():
                blended[name] = theirs
                continue
            start = a_open(a_tensors[name][0]).get_tensor(name)
            work = torch.promote_types(theirs.dtype, torch.float32)
            blended[name] = (start.to(work) * (1.0 - alpha) + theirs.to(work) * alpha).to(theirs.dtype)
            del start
    save_file(blended, str(out_file), metadata=metadata)


def interpolate_dirs(
    a_dir: Path,
    b_dir: Path,
    out: Path,
    alpha: float,
    *,
    a_label: str | None = None,
    b_label: str | None = None,
    progress: Progress | None = None,
) -> Path:
    """Write the model ``(1 - alpha) * A + alpha * B`` to ``out`` (which must not exist): B's files but its weights,
    A's weight files as they are at ``alpha == 0`` and B's at ``alpha == 1``. Refuses, writing nothing, what
    :func:`check_alpha` and :func:`check_compatible` refuse."""
    from safetensors import safe_open  # heavy: see _header

    report: Progress = progress or (lambda fraction, message: None)
    alpha = check_alpha(alpha)
    a_dir, b_dir, out = Path(a_dir), Path(b_dir), Path(out)
    a_label, b_label = a_label or str(a_dir), b_label or str(b_dir)
    a_tensors = check_compatible(a_dir, b_dir, a_label, b_label)
    if out.exists():
        raise InterpolationError(f"{out} exists already; choose another name or remove it")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        for item in sorted(b_dir.iterdir()):  # config, tokenizer, chat template, generation config: B's
            if not _is_weights(item):
                _copy_entry(item, work / item.name)
        if alpha in (0.0, 1.0):  # an end is that model's weight files, byte for byte
            end = a_dir if alpha == 0.0 else b_dir
            for item in sorted(end.iterdir()):
                if item.is_file() and item.name.endswith((WEIGHTS, INDEX)):
                    report(0.1, f"copying {item.name} of {a_label if alpha == 0.0 else b_label}")
                    shutil.copyfile(item, work / item.name)
        else:
            for index in sorted(b_dir.glob(f"*{INDEX}")):  # B's layout: its shards and their index
                shutil.copyfile(index, work / index.name)
            b_files = weight_files(b_dir, b_label)
            with ExitStack() as stack:
                opened: dict[Path, Any] = {}

                def a_open(file: Path) -> Any:
                    if file not in opened:
                        opened[file] = stack.enter_context(safe_open(str(file), framework="pt"))
                    return opened[file]

                for i, b_file in enumerate(b_files):
                    report(0.05 + 0.9 * i / len(b_files), f"blending {b_file.name} at alpha {alpha:g}")
                    _blend_file(b_file, work / b_file.name, alpha, a_tensors, a_open)
        work.chmod(0o755)
        os.replace(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    report(1.0, f"wrote {out.name}")
    return out


def default_name(b: str, alpha: float) -> str:
    return f"{b}-alpha{alpha:g}"


@action("model.interpolate", Role.operator)
def interpolate_models(
    identity: Identity,
    a: str,
    b: str,
    alpha: float,
    *,
    name: str | None = None,
    url: str | None = None,
    produced_by_job_id: int | None = None,
    progress: Progress | None = None,
    meta: dict[str, Any] | None = None,
) -> Model:
    """Interpolate registered model ``a`` (the start) towards registered model ``b`` (trained from it) by ``alpha``,
    write the result to ``<data_dir>/models/<name>`` (default ``<b>-alpha<alpha>``) and register it with ``a`` as its
    base; audited as ``model.interpolate``. ``meta`` is added to the registered row's."""
    alpha = check_alpha(alpha)
    name = name or default_name(b, alpha)
    if not NAME_PATTERN.match(name):
        raise InterpolationError(f"model name {name!r} is not allowed: use letters, digits, '.', '_' and '-', "
                                 "starting with a letter or digit (at most 200 characters)")  # fmt: skip
    rows = {}
    for role, ref in (("A", a), ("B", b)):
        try:
            rows[role] = get_model(ref, url=url)
        except ModelNotFound as exc:
            raise ModelNotFound(f"model {role} of the interpolation: {exc}") from None
    try:
        taken = get_model(name, url=url)
    except ModelNotFound:
        taken = None
    if taken is not None:
        raise InterpolationError(
            f"a model named {name!r} is registered already (at {taken.path}); choose another --name"
        )
    final = Path(get_settings().data_dir) / "models" / name
    interpolate_dirs(Path(rows["A"].path), Path(rows["B"].path), final, alpha, a_label=repr(a), b_label=repr(b),
                     progress=progress)  # fmt: skip
    made = {"a": a, "b": b, "alpha": alpha}
    try:
        row = register_model(identity, name, final, base=a, produced_by_job_id=produced_by_job_id, url=url,
                             meta={**(meta or {}), META_KEY: made})  # fmt: skip
    except BaseException:
        shutil.rmtree(final, ignore_errors=True)
        raise
    audit(identity.username, "model.interpolate", target=name, details={**made, "path": row.path}, url=url)
    return row
