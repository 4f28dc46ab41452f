"""How the learner's weights reach an inference engine in another process: the state dict with its output layer
named (vLLM keeps a packed copy of it), or saved as a model directory, one version at a time, that a new engine
loads (:class:`~posttrain.training.vllm_engines.VLLMRolloutEngine` when its vLLM has no in-place reload)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file

WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")


def with_output_layer(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The learner's weights as vLLM must get them: ``lm_head.weight`` named even when the model ties it to the
    embeddings (vLLM's CPU backend keeps a packed copy of the output layer, which an update without it leaves
    stale: log-probs then drift by about 0.6)."""
    weights = dict(state_dict)
    if "lm_head.weight" not in weights and "model.embed_tokens.weight" in weights:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    return weights


def save_weights(state_dict: Mapping[str, torch.Tensor], source: Path, weights_dir: Path, version: int) -> Path:
    """``state_dict`` as a model directory ``weights_dir/version-N`` (the source directory's config and
    tokenizer files, one ``model.safetensors``), written to a temporary name and renamed; older
    versions are removed."""
    weights_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".version-", dir=weights_dir))
    for item in source.iterdir():
        if item.is_file() and not item.name.endswith(WEIGHT_FILES):
            shutil.copy2(item, staging / item.name)
    save_file(
        {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()},
        str(staging / "model.safetensors"),
        metadata={"format": "pt"},
    )
    final = weights_dir / f"version-{version}"
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    for old in weights_dir.glob("version-*"):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final
