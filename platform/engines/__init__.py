"""Engines: what reads a model's files and runs them. The embedded engine's decoding (:mod:`generation`, 8-bit
weights in :mod:`q8`), llama.cpp's and vLLM's servers with their typed profiles, the speed tiers, and the process
launcher every served engine starts under.

    loaded = load_model("var/models/tiny")                  # the model, its tokenizer, its chat template
    profile = VllmProfile(model="var/models/tiny", port=free_port("127.0.0.1"))
    with ServerProcess(profile.to_args(), base_url=profile.base_url).start() as server: ...

Below the model registry and its jobs (they export to llama.cpp and check a model's tier), above the job queue and
the database; the HTTP side (the OpenAI-compatible app, the gateway, the deploy job) is :mod:`posttrain.platform.serving`.
Names are imported on first use, so the job worker stays light.
"""

from __future__ import annotations

from posttrain.platform.lazy import lazy_exports

_EXPORTS = {
    "ModelDirError": "inspect",
    "ModelInfo": "inspect",
    "inspect_model_dir": "inspect",
    "LaunchError": "launcher",
    "ServerProcess": "launcher",
    "free_port": "launcher",
    "LoadedModel": "loader",
    "load_model": "loader",
    "DEFAULT_TIERS": "profiles",
    "EngineConfig": "profiles",
    "TierCatalog": "profiles",
    "TierProfile": "profiles",
    "VllmProfile": "vllm",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
