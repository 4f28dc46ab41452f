"""Serving: the embedded CPU engine, vLLM launch profiles, speed tiers and the gateway.

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
__getattr__ = lazy_exports(__name__, _EXPORTS)
