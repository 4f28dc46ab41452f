"""Check a model directory without loading it (no torch): what it holds and whether it can load."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel


class ModelDirError(ValueError):
    """A directory that is not a loadable model; the message names the path and the fix."""


class ModelInfo(BaseModel):
    """What a model directory holds, read from its config files without loading weights."""

    path: str
    model_type: str
    architectures: list[str]
    is_vision: bool
    max_position_embeddings: int | None
    has_chat_template: bool


def _max_positions(config: dict[str, Any]) -> int | None:
    for source in (config, config.get("text_config") or {}):
        value = source.get("max_position_embeddings")
        if isinstance(value, int):
            return value
    return None


def inspect_model_dir(path: str | os.PathLike[str]) -> ModelInfo:
    """Check ``path`` is a Hugging Face model directory and describe it."""
    root = Path(path)
    config_file = root / "config.json"
    if not root.is_dir():
        raise ModelDirError(
            f"model directory {root} does not exist; build one with build_tiny_model or point at real weights"
        )
    if not config_file.is_file():
        raise ModelDirError(f"{root} has no config.json; it is not a Hugging Face model directory")
    if not (root / "tokenizer.json").is_file() and not (root / "tokenizer_config.json").is_file():
        raise ModelDirError(f"{root} has no tokenizer files (tokenizer.json / tokenizer_config.json)")
    config = json.loads(config_file.read_text())
    has_template = (root / "chat_template.jinja").is_file() or (root / "chat_template.json").is_file()
    tok_config = root / "tokenizer_config.json"
    if not has_template and tok_config.is_file():
        has_template = bool(json.loads(tok_config.read_text()).get("chat_template"))
    return ModelInfo(
        path=str(root.resolve()),
        model_type=str(config.get("model_type", "")),
        architectures=list(config.get("architectures") or []),
        is_vision="vision_config" in config,
        max_position_embeddings=_max_positions(config),
        has_chat_template=has_template,
    )
