"""The model job kinds: ``build_model`` (a tiny model built locally), ``import_model`` (real weights: a GGUF file, a
Hugging Face directory or a built-in) and ``export_model`` (a Hugging Face directory or a GGUF file for llama.cpp)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from posttrain.platform.auth import Identity, action
from posttrain.platform.db.models import Role, utcnow
from posttrain.platform.engines.inspect import ModelDirError
from posttrain.platform.failures import BadInput
from posttrain.platform.jobs.context import JobContext
from posttrain.platform.jobs.registry import JOB_PATH, JobKind, register
from posttrain.platform.models.exporter import ExportError, export_model
from posttrain.platform.models.importer import BUILTIN_PREFIX, sha256_file
from posttrain.platform.models.importer import import_model as run_import
from posttrain.platform.models.registry import ModelNotFound, get_model, record_export, register_model


class BuildModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")
    architecture: Literal["qwen2", "llama", "qwen2-vl"] = "qwen2"
    hidden_size: int = Field(default=256, ge=32, le=4096)
    num_layers: int = Field(default=4, ge=1, le=64)
    seed: int = 0


def build_model(ctx: JobContext, config: BuildModelConfig) -> dict[str, Any]:
    # torch (the factory): only this job kind builds a model
    from posttrain.platform.models import (
        TinyModelSpec,
        TinyVisionModelSpec,
        build_tiny_model,
        build_tiny_vision_model,
    )

    out = ctx.settings.data_dir / "models" / config.name
    if out.exists():
        raise BadInput(f"model directory {out} exists already; choose another name")
    ctx.progress(0.1, "training the tokenizer and building the model", force=True)
    if config.architecture == "qwen2-vl":
        path = build_tiny_vision_model(out, TinyVisionModelSpec(seed=config.seed))
    else:
        spec = TinyModelSpec(
            architecture=config.architecture,
            hidden_size=config.hidden_size,
            num_layers=config.num_layers,
            seed=config.seed,
        )
        path = build_tiny_model(out, spec)
    row = register_model(ctx.identity, config.name, path, produced_by_job_id=ctx.job_id, meta={"built": config.model_dump()},
                         url=ctx.url)  # fmt: skip
    return {"model": row.name, "path": row.path}


class ImportModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str = Field(
        default="builtin:smollm2-135m-instruct",
        min_length=1,
        description="builtin:NAME, or a GGUF file or Hugging Face directory inside the data directory",
        json_schema_extra=JOB_PATH,
    )
    name: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")
    dtype: Literal["float32", "bfloat16"] = "float32"
    chat_template: str | None = Field(
        default=None,
        min_length=1,
        max_length=100_000,
        description="a family (chatml, gemma) or a Jinja template to give the model in "
        "place of its own; a base model has none",
    )


def import_model(ctx: JobContext, config: ImportModelConfig) -> dict[str, Any]:
    if not config.source.startswith(BUILTIN_PREFIX):  # a bare file name: in the data directory
        config = config.model_copy(update={"source": str(Path(ctx.settings.data_dir).resolve() / config.source)})
    try:
        row = run_import(ctx.identity, config.source, name=config.name, dtype=config.dtype, url=ctx.url,
                         produced_by_job_id=ctx.job_id, progress=lambda f, m: ctx.progress(f, m, force=True),
                         chat_template=config.chat_template)  # fmt: skip
    except ModelDirError as exc:
        raise BadInput(str(exc)) from None
    return {
        "model": row.name,
        "path": row.path,
        **{
            k: row.meta.get(k)
            for k in (
                "parameters",
                "sha256",
                "check_answer",
                "chat_template",
                "chat_template_assigned",
                "provenance",
                "licence",
            )
        },
    }


class ExportModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, description="a registered model name")
    format: Literal["hf", "gguf"] = "gguf"
    outtype: Literal["f16", "q8_0"] = Field(default="q8_0", description="GGUF weight type")


def export_path(settings: Any, config: ExportModelConfig) -> Path:
    """Where an export goes: ``<data_dir>/exports/<model>/<model>.<TYPE>.gguf`` or ``.../<model>-hf``."""
    folder = Path(settings.data_dir) / "exports" / config.model
    return folder / (
        f"{config.model}.{config.outtype.upper()}.gguf" if config.format == "gguf" else f"{config.model}-hf"
    )


@action("model.export", Role.operator)
def export_registered(
    identity: Identity, config: ExportModelConfig, settings: Any, *, url: str | None = None, progress: Any = None
) -> dict[str, Any]:
    """Export a registered model (replacing an older export of the same kind) and record it in its meta."""
    try:
        row = get_model(config.model, url=url)
    except ModelNotFound as exc:
        raise BadInput(str(exc)) from None
    out = export_path(settings, config)
    out.parent.mkdir(parents=True, exist_ok=True)
    previous = out.with_name(out.name + ".previous")
    if out.exists():
        out.rename(previous)  # kept until the new export is in place
    try:
        export_model(row.path, out, config.format, outtype=config.outtype, progress=progress)
    except BaseException as exc:  # the older export comes back; the input's fault is a BadInput
        if previous.exists():
            previous.rename(out)
        if isinstance(exc, (ExportError, ModelDirError)):
            raise BadInput(str(exc)) from None
        raise
    if previous.exists():
        shutil.rmtree(previous) if previous.is_dir() else previous.unlink()
    files = [out] if out.is_file() else [p for p in out.rglob("*") if p.is_file()]
    entry = {"format": config.format, "outtype": config.outtype if config.format == "gguf" else None, "path": str(out),
             "bytes": sum(p.stat().st_size for p in files), "sha256": sha256_file(out) if out.is_file() else None,
             "at": utcnow().isoformat(timespec="seconds")}  # fmt: skip
    record_export(config.model, entry, by=identity.username, url=url)
    return entry


def export_job(ctx: JobContext, config: ExportModelConfig) -> dict[str, Any]:
    return export_registered(ctx.identity, config, ctx.settings, url=ctx.url,
                             progress=lambda f, m: ctx.progress(f, m, force=True))  # fmt: skip


register(
    JobKind(
        name="build_model",
        config_model=BuildModelConfig,
        run=build_model,
        description="Build a small model locally (tokenizer + Qwen2/Llama/Qwen2-VL) and register it.",
    )
)
register(
    JobKind(
        name="import_model",
        config_model=ImportModelConfig,
        run=import_model,
        description="Import real weights (a GGUF file, a Hugging Face directory or a built-in model) and register them.",
    )
)
register(
    JobKind(
        name="export_model",
        config_model=ExportModelConfig,
        run=export_job,
        description="Export a registered model as a Hugging Face directory or a GGUF file (F16, Q8_0) for llama.cpp.",
    )
)
