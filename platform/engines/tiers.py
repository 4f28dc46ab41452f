"""The tier profiles in force: the operator's edited catalogue (``<data_dir>/tiers.json``) when there is one, else
the defaults. Below both the model registry (a model's default tier must be one of them) and the ``deploy`` job
(which runs a deployment with its tier's profile)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posttrain.platform.auth import Identity, action, audit
from posttrain.platform.db.models import Role
from posttrain.platform.engines.profiles import TierCatalog
from posttrain.platform.failures import BadInput


def tiers_path(settings: Any) -> Path:
    """Where the operator's edited tier profiles live."""
    return Path(settings.data_dir) / "tiers.json"


@action("tiers.save", Role.operator)
def save_tiers(identity: Identity, text: str, settings: Any, *, url: str | None = None) -> TierCatalog:
    """Replace the operator's tier profiles with ``text`` (a TierCatalog as JSON, validated: pydantic's
    ValidationError names the field); deployments started afterwards use them."""
    edited = TierCatalog.model_validate_json(text)
    edited.save(tiers_path(settings))
    audit(
        identity.username,
        "tiers.save",
        target=str(tiers_path(settings)),
        details={"tiers": sorted(edited.tiers)},
        url=url,
    )
    return edited


def tier_catalog(settings: Any, path: str | Path | None = None) -> TierCatalog:
    """The tier profiles in force: ``path``, else the operator's file when there is one, else the defaults."""
    chosen = Path(path) if path else tiers_path(settings)
    if path and not chosen.is_file():
        raise BadInput(f"tiers file {chosen} does not exist")
    return TierCatalog.load(chosen) if chosen.is_file() else TierCatalog()
