"""Serving: the embedded CPU engine, vLLM launch profiles, speed tiers and the gateway.

    engine = EmbeddedEngine(EngineConfig(model_path="var/models/tiny", tier=DEFAULT_TIERS["fast"])).start()
    server = serve_in_thread(create_engine_app(engine), port=0)   # server.base_url + "/v1"
    gateway = serve_in_thread(create_gateway_app(GatewayConfig(deployments=[
        Deployment(model="tiny", tier="fast", base_url=server.base_url)])))
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "create_engine_app": "app",
    "EmbeddedEngine": "engine",
    "APIError": "errors",
    "Deployment": "gateway",
    "GatewayConfig": "gateway",
    "RoutingPolicy": "gateway",
    "create_gateway_app": "gateway",
    "LaunchError": "launcher",
    "ServerProcess": "launcher",
    "DEFAULT_TIERS": "profiles",
    "EngineConfig": "profiles",
    "TierCatalog": "profiles",
    "TierProfile": "profiles",
    "ThreadedServer": "server",
    "serve_in_thread": "server",
    "VllmProfile": "vllm",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import on first use: the job worker imports deployment code without torch."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
