"""Run an ASGI app (engine or gateway) with uvicorn, in this process or as ``python -m``.

    with serve_in_thread(create_engine_app(engine.start())) as server:
        print(server.base_url)

    python -m posttrain.platform.serving --model var/models/tiny --port 8001 --tier fast

Beyond loopback a server must check API keys: :class:`ThreadedServer` refuses a non-loopback address
for an app built without ``auth``, and the engine command checks keys in the configured database
when told to listen beyond loopback (and refuses to start while no key exists).
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from types import TracebackType

import uvicorn
from fastapi import FastAPI

from posttrain.platform.auth import is_loopback
from posttrain.platform.engines.loader import ModelDirError
from posttrain.platform.engines.profiles import DEFAULT_TIERS, EngineConfig, TierCatalog
from posttrain.platform.serving.app import create_engine_app
from posttrain.platform.serving.auth import ApiAuth, OpenServerRefused, refuse_open_server
from posttrain.platform.serving.engine import EmbeddedEngine


class ThreadedServer:
    """uvicorn in a background thread; ``port=0`` picks a free port. An address beyond loopback needs an
    app that checks API keys (built with ``auth``) and a key to exist."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        auth = getattr(app.state, "auth", None)
        refuse_open_server(app.title, host, auth, url=auth.url if auth is not None else None)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="auto", access_log=False)
        self.server = uvicorn.Server(config)
        self.host = host
        self.port = port
        self._thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ThreadedServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on {self.host}:{self.port} did not start")
            time.sleep(0.01)
        sock: socket.socket = self.server.servers[0].sockets[0]
        self.port = int(sock.getsockname()[1])
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> ThreadedServer:
        return self if self.server.started else self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()


def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> ThreadedServer:
    return ThreadedServer(app, host, port).start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="posttrain embedded engine (OpenAI-compatible API)")
    parser.add_argument("--model", required=True, help="model directory (Hugging Face layout)")
    parser.add_argument("--served-model-name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tier", default="standard", help="tier name: " + ", ".join(DEFAULT_TIERS))
    parser.add_argument("--tiers-file", help="JSON TierCatalog overriding the default tiers")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--max-images-per-prompt", type=int, default=4)
    args = parser.parse_args(argv)
    auth = None if is_loopback(args.host) else ApiAuth(args.host)  # on loopback: behind the gateway
    try:
        refuse_open_server("engine", args.host, auth)
    except OpenServerRefused as exc:
        raise SystemExit(f"error: {exc}") from None
    catalog = TierCatalog.load(args.tiers_file) if args.tiers_file else TierCatalog()
    config = EngineConfig(
        model_path=args.model,
        served_model_name=args.served_model_name,
        tier=catalog.get(args.tier),
        max_model_len=args.max_model_len,
        max_images_per_prompt=args.max_images_per_prompt,
    )
    try:
        engine = EmbeddedEngine(config).start()
    except (ModelDirError, ValueError) as exc:  # a bad directory; weights this host cannot serve (q8_0)
        raise SystemExit(f"error: {exc}") from None
    print(f"serving {engine.name} ({args.tier}) on http://{args.host}:{args.port}", flush=True)
    try:
        uvicorn.run(create_engine_app(engine, auth=auth), host=args.host, port=args.port, log_level="info",
                    lifespan="off")  # fmt: skip
    finally:
        engine.stop()
