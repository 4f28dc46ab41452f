"""Serving: the embedded CPU engine, vLLM launch profiles, speed tiers and the gateway.

    engine = EmbeddedEngine(EngineConfig(model_path="var/models/tiny", tier=DEFAULT_TIERS["fast"])).start()
    server = serve_in_thread(create_engine_app(engine), port=0)   # server.base_url + "/v1"
    gateway = serve_in_thread(create_gateway_app(GatewayConfig(deployments=[
        Deployment(model="tiny", tier="fast", base_url=server.base_url)])))
"""

from posttrain.platform.serving.app import create_engine_app
from posttrain.platform.serving.engine import EmbeddedEngine
from posttrain.platform.serving.errors import APIError
from posttrain.platform.serving.gateway import Deployment, GatewayConfig, RoutingPolicy, create_gateway_app
from posttrain.platform.serving.launcher import LaunchError, ServerProcess
from posttrain.platform.serving.profiles import DEFAULT_TIERS, EngineConfig, TierCatalog, TierProfile
from posttrain.platform.serving.server import ThreadedServer, serve_in_thread
from posttrain.platform.serving.vllm import VllmProfile

__all__ = [
    "APIError", "DEFAULT_TIERS", "Deployment", "EmbeddedEngine", "EngineConfig", "GatewayConfig", "LaunchError",
    "RoutingPolicy", "ServerProcess", "ThreadedServer", "TierCatalog", "TierProfile", "VllmProfile",
    "create_engine_app", "create_gateway_app", "serve_in_thread",
]
