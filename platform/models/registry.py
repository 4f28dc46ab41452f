"""The model registry: model directories (Hugging Face layout) with their lineage, in the database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlmodel import col, select

from posttrain.platform.auth import Identity, action
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import AuditLog, Model, Role
from posttrain.platform.engines.inspect import ModelDirError, inspect_model_dir
from posttrain.platform.engines.tiers import tier_catalog
from posttrain.platform.models.general_check import META_KEY, GeneralCheck
from posttrain.platform.settings import get_settings


class ModelNotFound(LookupError):
    pass


@action("model.register", Role.operator)
def register_model(
    identity: Identity,
    name: str,
    path: str | Path,
    *,
    base: str | None = None,
    produced_by_job_id: int | None = None,
    meta: dict[str, Any] | None = None,
    replace: bool = False,
    url: str | None = None,
) -> Model:
    """Record a model directory under ``name`` after checking it loads (config, tokenizer, weights present)."""
    info = inspect_model_dir(path)  # raises ModelDirError naming what is missing
    with session(url) as s:
        row = s.exec(select(Model).where(Model.name == name)).first()
        if row is not None and not replace:
            raise ModelDirError(f"a model named {name!r} is registered already (at {row.path}); choose another name")
        base_id = None
        if base is not None:
            base_row = s.exec(select(Model).where(Model.name == base)).first()
            if base_row is None:
                raise ModelNotFound(f"no base model named {base!r}")
            base_id = base_row.id
        row = row or Model(name=name, path="")
        row.path = str(Path(path).resolve())
        row.architecture = (info.architectures or [info.model_type])[0]
        row.base_model_id = base_id
        row.produced_by_job_id = produced_by_job_id
        row.meta = {
            **(meta or {}),
            "is_vision": info.is_vision,
            "max_position_embeddings": info.max_position_embeddings,
            "chat_template": info.has_chat_template,
        }  # False: a base model
        s.add(row)
        s.add(AuditLog(username=identity.username, action="model.register", target=name, details={"path": row.path}))
        s.flush()
        s.refresh(row)
        return row


def get_model(name: str, *, url: str | None = None) -> Model:
    # a NUL byte is in no stored name (PostgreSQL's text cannot hold one, and asking it fails): not found, unasked
    with session(url, read_only=True) as s:
        row = None if "\x00" in name else s.exec(select(Model).where(Model.name == name)).first()
    if row is None:
        raise ModelNotFound(f"no model named {name!r}; `posttrain models list` shows the registered ones")
    return row


def is_registered(name: str, *, url: str | None = None) -> bool:
    """Whether the registry holds a model named ``name``."""
    try:
        get_model(name, url=url)
    except ModelNotFound:
        return False
    return True


def list_models(*, url: str | None = None) -> list[Model]:
    with session(url, read_only=True) as s:
        return list(s.exec(select(Model).order_by(col(Model.id).desc())).all())


def lineage(name: str, *, url: str | None = None) -> list[Model]:
    """The model and its ancestors, newest first."""
    chain = [get_model(name, url=url)]
    with session(url, read_only=True) as s:
        while chain[-1].base_model_id is not None and len(chain) < 100:
            parent = s.get(Model, chain[-1].base_model_id)
            if parent is None:
                break
            chain.append(parent)
    return chain


TOOL_TRAINING_KEY = "tool_training"  # a trained model's meta: the tool environment its run trained it in


def tool_training(name: str, *, url: str | None = None) -> str | None:
    """How ``name`` or a model it was trained from learned to call tools: the environment of the run that trained
    it (``code_repair``, ``tool_use``, a plugin's) and the model that run produced; None when no run in its lineage
    trained on tool calls (a model as it ships, or trained on single-turn answers)."""
    for model in lineage(name, url=url):
        if environment := (model.meta or {}).get(TOOL_TRAINING_KEY):
            return f"{environment} (model {model.name!r})"
    return None


@action("model.default_tier", Role.operator)
def set_default_tier(identity: Identity, name: str, tier: str | None, *, url: str | None = None) -> Model:
    """The tier the gateway sends ``name``'s requests to when they name none (``None``: the policy decides);
    it must be one of the installation's tier profiles (the Tiers tab, ``<data_dir>/tiers.json``)."""
    known = sorted(tier_catalog(get_settings()).tiers)
    if tier is not None and tier not in known:
        raise ValueError(f"unknown tier {tier!r}; the tiers are {', '.join(known)}")
    with session(url) as s:
        row = s.exec(select(Model).where(Model.name == name)).first()
        if row is None:
            raise ModelNotFound(f"no model named {name!r}; `posttrain models list` shows the registered ones")
        meta = {k: v for k, v in (row.meta or {}).items() if k != "default_tier"}
        row.meta = meta | ({"default_tier": tier} if tier is not None else {})
        s.add(row)
        s.add(AuditLog(username=identity.username, action="model.default_tier", target=name, details={"tier": tier}))
        s.flush()
        s.refresh(row)
        return row


def record_export(name: str, entry: dict[str, Any], *, by: str = "system", url: str | None = None) -> Model:
    """Add an export (format, path, bytes, sha256, when) to the model's ``meta["exports"]``, newest first;
    an export to the same path replaces the older entry."""
    with session(url) as s:
        row = s.exec(select(Model).where(Model.name == name)).first()
        if row is None:
            raise ModelNotFound(f"no model named {name!r}; `posttrain models list` shows the registered ones")
        exports = [e for e in (row.meta or {}).get("exports", []) if e.get("path") != entry.get("path")]
        row.meta = {**(row.meta or {}), "exports": [entry, *exports]}
        s.add(row)
        s.add(
            AuditLog(
                username=by,
                action="model.export",
                target=name,
                details={"path": entry.get("path"), "format": entry.get("format")},
            )
        )
        s.flush()
        s.refresh(row)
        return row


def record_general_check(name: str, check: GeneralCheck, *, by: str = "system", url: str | None = None) -> Model:
    """Store ``check`` (what the job that measured it found) as model ``name``'s
    ``meta["general_check"]``, replacing an older one; audited."""
    with session(url) as s:
        row = s.exec(select(Model).where(Model.name == name)).first()
        if row is None:
            raise ModelNotFound(f"no model named {name!r}; `posttrain models list` shows the registered ones")
        row.meta = {**(row.meta or {}), META_KEY: check.as_meta()}
        s.add(row)
        s.add(AuditLog(username=by, action="model.general_check", target=name, details=check.as_meta()))
        s.flush()
        s.refresh(row)
        return row
