"""Serving, the HTTP side: the embedded engine's request scheduler and its OpenAI-compatible app, the gateway in
front of every deployment, the client, and the ``deploy`` job. What runs the model (decoding, llama.cpp, vLLM, the
tier profiles, the launcher) is :mod:`posttrain.platform.engines`.

engine = EmbeddedEngine(EngineConfig(model_path="var/models/tiny", tier=DEFAULT_TIERS["fast"])).start()
server = serve_in_thread(create_engine_app(engine), port=0)   # server.base_url + "/v1"
gateway = serve_in_thread(create_gateway_app(GatewayConfig(deployments=[
    Deployment(model="tiny", tier="fast", base_url=server.base_url)])))
"""

from __future__ import annotations

from posttrain.platform.lazy import lazy_exports

_EXPORTS = {
    "create_engine_app": "app",
    "EmbeddedEngine": "engine",
    "APIError": "errors",
    "Deployment": "gateway",
    "GatewayConfig": "gateway",
    "RoutingPolicy": "gateway",
    "create_gateway_app": "gateway",
    "ThreadedServer": "server",
    "serve_in_thread": "server",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
