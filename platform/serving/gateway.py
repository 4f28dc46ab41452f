"""One OpenAI-compatible endpoint in front of many deployments.

The gateway picks a deployment by ``model`` and tier (:meth:`Gateway.route`). The tier comes from a
suffix of the model's name (``"model": "smollm2@fast"``: any OpenAI client can send it), else from the
``x-posttrain-tier`` header; either is strict (a tier the model is not deployed in is a 404). Without
one, the task type (``x-task-type`` header or ``metadata.task_type`` in the body) picks a tier through
the routing policy when the model is deployed there; otherwise the request goes to the model's default
tier: the one its deployment marks (``default``), else ``policy.model_tiers[model]``, else the policy's
``default_tier``, else the first tier it is deployed in. Every decision and every refusal is logged
with the request's id (``x-request-id``: the client's, or a fresh one), which every response carries. Responses and
streams pass through unchanged; a replica that refuses a connection or fails
with a 5xx before answering is marked unhealthy and the request is retried on
another replica of the same model and tier.

Requests are checked against API keys (:mod:`posttrain.platform.serving.auth`) when the app is given
an ``auth``: every command that starts a gateway gives one; an app built without one serves everyone
and is for in-process use on loopback (tests, benchmarks). The API's description (``/docs``,
``/openapi.json``) is behind the same check; only ``/health`` is open.

A request ends when its client leaves (:mod:`posttrain.platform.serving.disconnect`): the upstream
connection is closed at once, streamed or not, so the deployment aborts the request too.

Upstream calls go through one pooled ``aiohttp`` session (keep-alive connections to every
replica): measured on this project's 2-core machine, httpx's async client added about
1.1 ms per proxied request over aiohttp's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import time
import urllib.parse
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import aiohttp
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field
from starlette.concurrency import iterate_in_threadpool

from posttrain.platform.api_keys import KeyGrant
from posttrain.platform.models.downloads import ROUTE as EXPORTS_ROUTE
from posttrain.platform.models.downloads import Download, DownloadRefused
from posttrain.platform.serving.auth import ApiAuth, OpenServerRefused, allow_model, refuse_open_server, visible
from posttrain.platform.serving.disconnect import CLIENT_CLOSED_REQUEST, unless_client_leaves
from posttrain.platform.serving.errors import APIError, base_model_cannot_chat, model_not_found
from posttrain.platform.serving.protocol import IGNORED_HEADER, read_json_body

log = logging.getLogger("posttrain.gateway")

TIER_HEADER = "x-posttrain-tier"
TASK_HEADER = "x-task-type"


REQUEST_ID_HEADER = "x-request-id"


class Deployment(BaseModel):
    """One running server (a replica) serving ``model`` in ``tier`` at ``base_url``; ``default``: its tier is
    the model's default tier (the registry's ``default_tier`` in the model's meta)."""

    model: str
    tier: str
    base_url: str
    healthy: bool = True
    default: bool = False
    chat: bool = True  # False: a base model (no chat template), whose chat requests the gateway refuses


class RoutingPolicy(BaseModel):
    task_tiers: dict[str, str] = Field(
        default_factory=lambda: {"chat": "fast", "ide": "fast", "batch": "standard", "reasoning": "standard"}
    )
    default_tier: str = "standard"
    model_tiers: dict[str, str] = Field(default_factory=dict, description="a model's default tier, by model name")


class Route(BaseModel):
    """Where one request goes, and why (logged with the request id)."""

    model: str
    tier: str
    how: str


class GatewayConfig(BaseModel):
    deployments: list[Deployment]
    policy: RoutingPolicy = Field(default_factory=RoutingPolicy)
    health_interval_s: float = Field(2.0, gt=0)
    request_timeout_s: float = Field(600.0, gt=0)
    max_request_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        description="larger request bodies get a 413 (each "
        "deployment bounds its own too: 1 MiB of text, more for images on vision models)",
    )


class RequestRecord(BaseModel):
    model: str
    tier: str
    replica: str | None
    status: int
    latency_ms: float
    stream: bool
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    attempts: int = 1


class ModelNotServed(LookupError):
    """A request named a model no deployment serves (:meth:`Gateway.resolve` turns it into its 404)."""

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.model = model


class Gateway:
    def __init__(
        self,
        config: GatewayConfig,
        refresh: Callable[[], list[Deployment]] | None = None,
        registered: Callable[[str], bool] | None = None,
    ) -> None:
        self.config = config
        self.refresh = refresh
        self.registered = registered
        self.deployments = [d.model_copy() for d in config.deployments]
        self.records: deque[RequestRecord] = deque(maxlen=10_000)
        self._rr: dict[tuple[str, str], int] = {}
        self.client: aiohttp.ClientSession | None = None
        self._lengths: dict[str, int] = {}  # base_url -> its engine's max_model_len (fixed for the engine's life)

    async def max_model_len(self, model: str, tier: str) -> int | None:
        """The context length of ``model`` in ``tier``, as its replica's engine reports it (None when none answers)."""
        assert self.client is not None
        for replica in (d for d in self.deployments if d.model == model and d.tier == tier):  # no round-robin turn
            if replica.base_url in self._lengths:
                return self._lengths[replica.base_url]
            try:
                async with self.client.get(
                    f"{replica.base_url}/v1/models", timeout=aiohttp.ClientTimeout(total=2.0)
                ) as r:
                    found = [
                        m.get("max_model_len") or (m.get("meta") or {}).get("n_ctx")  # llama-server: per slot
                        for m in (await r.json()).get("data", [])
                        if m.get("id") == model
                    ]
            except (aiohttp.ClientError, TimeoutError, ValueError):
                continue
            if found and isinstance(found[0], int):
                self._lengths[replica.base_url] = found[0]
                return found[0]
        return None

    def models(self) -> list[str]:
        return sorted({d.model for d in self.deployments})

    def tiers(self, model: str) -> list[str]:
        return sorted({d.tier for d in self.deployments if d.model == model})

    async def resolve(
        self, requested: str, tier_header: str | None, task_type: str | None, grant: KeyGrant | None
    ) -> Route:
        """:meth:`route`, whose 404 for a model not served names the served models ``grant`` may see and, when the
        model is in the registry (asked off the event loop, only then) and the key may use it, says how to deploy it."""
        try:
            return self.route(requested, tier_header, task_type)
        except ModelNotServed as exc:
            asks = self.registered is not None and visible(grant, [exc.model]) == [exc.model]
            known = asks and await asyncio.to_thread(self.registered, exc.model)  # type: ignore[arg-type]
            raise model_not_found(exc.model, visible(grant, self.models()), registered=bool(known)) from None

    def route(self, requested: str, tier_header: str | None, task_type: str | None) -> Route:
        """The model and tier of a request naming ``requested`` (perhaps ``name@tier``); :class:`ModelNotServed` when
        the model is not served, :class:`APIError` 404 when an asked-for tier is not deployed."""
        models = self.models()
        model, suffix = requested, ""
        if requested not in models and "@" in requested.strip("@"):  # a served name may itself hold an @
            model, _, suffix = requested.rpartition("@")
        if model not in models:
            raise ModelNotServed(model)
        tiers = self.tiers(model)
        asked, how = (suffix, "the model name's suffix") if suffix else (tier_header, f"the {TIER_HEADER} header")
        if asked:
            if asked not in tiers:
                raise APIError(
                    404,
                    f"model `{model}` has no deployment in tier `{asked}` (asked by {how}); deployed "
                    f"tiers: {', '.join(tiers)}",
                    param="model" if suffix else "tier",
                )
            return Route(model=model, tier=asked, how=how)
        policy = self.config.policy
        wanted = policy.task_tiers.get(task_type or "")
        if wanted in tiers:
            return Route(model=model, tier=wanted, how=f"task type {task_type!r}")
        marked = [d.tier for d in self.deployments if d.model == model and d.default and d.tier in tiers]
        for tier, why in (
            (marked[0] if marked else None, "the model's default tier"),
            (policy.model_tiers.get(model), "the policy's tier for the model"),
            (policy.default_tier, "the policy's default tier"),
            (tiers[0], "the only tier deployed" if len(tiers) == 1 else "the first tier deployed"),
        ):
            if tier in tiers:
                unmet = f"; task type {task_type!r} asks for `{wanted}`, not deployed" if wanted else ""
                return Route(model=model, tier=tier, how=why + unmet)
        raise AssertionError("unreachable: a served model has a tier")  # pragma: no cover

    def replicas(self, model: str, tier: str) -> list[Deployment]:
        """The replicas of a routed model and tier, healthy first, in round-robin order."""
        found = [d for d in self.deployments if d.model == model and d.tier == tier]
        start = self._rr.get((model, tier), 0)
        self._rr[(model, tier)] = start + 1
        ordered = found[start % len(found) :] + found[: start % len(found)]
        return sorted(ordered, key=lambda d: not d.healthy)  # healthy first, rotation kept within each group

    async def check_health(self) -> None:
        assert self.client is not None

        async def one(d: Deployment) -> None:
            try:
                async with self.client.get(f"{d.base_url}/health", timeout=aiohttp.ClientTimeout(total=2.0)) as r:  # type: ignore[union-attr]
                    d.healthy = r.status == 200
            except (aiohttp.ClientError, TimeoutError):
                d.healthy = False

        await asyncio.gather(*(one(d) for d in self.deployments))

    def sync(self, fresh: list[Deployment]) -> None:
        """Replace the deployment list, keeping what is known of the health of those that stay."""
        known = {(d.model, d.tier, d.base_url): d.healthy for d in self.deployments}
        self.deployments = [
            d.model_copy(update={"healthy": known.get((d.model, d.tier, d.base_url), d.healthy)}) for d in fresh
        ]

    async def health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            if self.refresh is not None:
                with contextlib.suppress(Exception):
                    self.sync(await asyncio.to_thread(self.refresh))
            with contextlib.suppress(Exception):
                await self.check_health()

    def record(self, rec: RequestRecord) -> None:
        self.records.append(rec)
        log.info("%s", rec.model_dump_json())


def _error(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status_code)


def create_gateway_app(
    config: GatewayConfig,
    refresh: Callable[[], list[Deployment]] | None = None,
    auth: ApiAuth | None = None,
    exports: Callable[[str], Download] | None = None,
    registered: Callable[[str], bool] | None = None,
) -> FastAPI:
    """The gateway app; ``refresh`` (called every health interval) replaces the deployment list;
    ``auth`` checks API keys (none: everyone is served); ``exports`` opens a signed export link
    (:func:`posttrain.platform.models.downloads.open_export`; none: no exports are served); ``registered`` says
    whether a model that is not served is in the registry (its 404 then says how to deploy it)."""
    gw = Gateway(config, refresh, registered)

    async def grant(request: Request) -> KeyGrant | None:
        return None if auth is None else await auth.grant(request)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        gw.client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=512, limit_per_host=128, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=config.request_timeout_s, connect=2.0),
            auto_decompress=False,  # bytes pass through as the deployment sent them
        )
        task = asyncio.create_task(gw.health_loop())
        try:
            yield
        finally:
            task.cancel()
            await gw.client.close()

    app = FastAPI(title="posttrain gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gw
    app.state.auth = auth

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        response = _error(exc)
        if (rid := getattr(request.state, "request_id", None)) is not None:  # a proxied request: logged, id returned
            log.warning("request %s refused with %d: %s", rid, exc.status_code, exc.message)
            response.headers[REQUEST_ID_HEADER] = rid
        return response

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> JSONResponse:
        await grant(request)
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        await grant(request)
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - Swagger UI")

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        shown = visible(await grant(request), gw.models())
        lengths = {m: dict(zip(gw.tiers(m), await asyncio.gather(*(gw.max_model_len(m, t) for t in gw.tiers(m)))))
                   for m in shown}  # fmt: skip
        data = []
        for m in shown:
            default = gw.route(m, None, None).tier
            data.append(
                {
                    "id": m,
                    "object": "model",
                    "created": 0,
                    "owned_by": "posttrain",
                    "root": m,
                    "max_model_len": lengths[m][default],
                    "tiers": gw.tiers(m),
                    "default_tier": default,
                    "max_model_len_by_tier": lengths[m],
                }
            )
        return {"object": "list", "data": data}

    @app.get("/v1/deployments")
    async def deployments(request: Request) -> list[dict[str, Any]]:
        shown = set(visible(await grant(request), gw.models()))
        return [d.model_dump() for d in gw.deployments if d.model in shown]

    async def proxy(request: Request, path: str) -> Response:
        started = time.perf_counter()
        request.state.request_id = rid = (request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex)[:128]
        granted = await grant(request)  # before the body is read: a caller without a key costs nothing more
        raw, body = await read_json_body(request, gw.config.max_request_bytes)
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            raise APIError(400, "request body must be a JSON object with a string 'model'", param="model")
        metadata = cast(dict[str, Any], body.get("metadata")) if isinstance(body.get("metadata"), dict) else {}
        task_type = request.headers.get(TASK_HEADER) or metadata.get("task_type")
        if task_type is not None and not isinstance(task_type, str):
            raise APIError(
                400,
                f"metadata.task_type must be a string such as 'chat', got {type(task_type).__name__}",
                param="metadata.task_type",
            )
        routed = await gw.resolve(body["model"], request.headers.get(TIER_HEADER), task_type, granted)
        model, tier = routed.model, routed.tier
        allow_model(granted, model)
        if path == "/v1/chat/completions" and not any(d.chat for d in gw.deployments if d.model == model):
            raise base_model_cannot_chat(model)
        log.info("request %s: %s -> model %s, tier %s (%s)", rid, body["model"], model, tier, routed.how)
        if body["model"] != model:  # name@tier: the deployment serves the model under its own name
            raw = json.dumps({**body, "model": model}).encode()
        stream = bool(body.get("stream"))
        headers = {"content-type": "application/json", REQUEST_ID_HEADER: rid}
        if auth := request.headers.get("authorization"):
            headers["authorization"] = auth
        response = await unless_client_leaves(request, _forward(gw, path, raw, headers, routed, stream, started))
        if response.status_code == CLIENT_CLOSED_REQUEST:
            log.info("request %s: the client left; the upstream request is closed", rid)
            gw.record(
                RequestRecord(
                    model=model,
                    tier=tier,
                    replica=None,
                    status=CLIENT_CLOSED_REQUEST,
                    latency_ms=(time.perf_counter() - started) * 1000,
                    stream=stream,
                )
            )
        return response

    @app.get(EXPORTS_ROUTE + "{token}")
    async def export(token: str) -> Response:
        """A model's export, streamed from disk; the signed link is the credential (no API key), as a presigned URL."""
        if exports is None:
            raise APIError(404, "this gateway serves no exports: take them away from the console's Export tab")
        try:
            download = await asyncio.to_thread(exports, token)
        except DownloadRefused as exc:
            raise APIError(exc.status, str(exc)) from None
        disposition = f"attachment; filename*=UTF-8''{urllib.parse.quote(download.filename)}"
        return StreamingResponse(
            iterate_in_threadpool(download.chunks()),
            media_type=download.media_type,
            headers={"content-length": str(download.size), "content-disposition": disposition},
        )

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await proxy(request, "/v1/chat/completions")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await proxy(request, "/v1/completions")

    return app


async def _forward(
    gw: Gateway, path: str, raw: bytes, headers: dict[str, str], routed: Route, stream: bool, started: float
) -> Response:
    """The first answer to ``raw`` from a replica of the routed model and tier: a replica that cannot be reached or
    fails with a 5xx before answering is marked unhealthy and the next one is tried; a stream passes through."""
    model, tier = routed.model, routed.tier
    assert gw.client is not None
    last_error: APIError | None = None
    attempts = 0
    for replica in gw.replicas(model, tier):
        attempts += 1
        try:
            resp = await gw.client.post(f"{replica.base_url}{path}", data=raw, headers=headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            replica.healthy = False
            last_error = APIError(503, f"deployment {replica.base_url} unreachable: {type(exc).__name__}")
            continue
        if resp.status >= 500:
            text = (await resp.read()).decode("utf-8", "replace")
            resp.release()
            replica.healthy = False
            last_error = APIError(resp.status, f"deployment {replica.base_url} failed: {text[:500]}")
            continue
        rec = RequestRecord(
            model=model,
            tier=tier,
            replica=replica.base_url,
            status=resp.status,
            latency_ms=0.0,
            stream=stream,
            attempts=attempts,
        )
        passed = {REQUEST_ID_HEADER: headers[REQUEST_ID_HEADER]}
        if IGNORED_HEADER in resp.headers:
            passed[IGNORED_HEADER] = resp.headers[IGNORED_HEADER]
        if not stream or resp.status != 200:
            try:
                content = await resp.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                replica.healthy = False
                last_error = APIError(502, f"deployment {replica.base_url} failed mid-response: {type(exc).__name__}")
                continue
            finally:
                resp.release()
            if resp.status == 200:
                with contextlib.suppress(Exception):
                    usage = json.loads(content).get("usage") or {}
                    rec.prompt_tokens, rec.completion_tokens = (
                        usage.get("prompt_tokens"),
                        usage.get("completion_tokens"),
                    )
            rec.latency_ms = (time.perf_counter() - started) * 1000
            gw.record(rec)
            return Response(
                content,
                status_code=resp.status,
                headers=passed,
                media_type=resp.headers.get("content-type", "application/json"),
            )
        return StreamingResponse(
            _pass_stream(gw, resp, replica, rec, started), media_type="text/event-stream", headers=passed
        )
    err = last_error or APIError(503, f"no replica of `{model}` in tier `{tier}` answered")
    gw.record(
        RequestRecord(
            model=model,
            tier=tier,
            replica=None,
            status=err.status_code,
            latency_ms=(time.perf_counter() - started) * 1000,
            stream=stream,
            attempts=attempts,
        )
    )
    raise APIError(503, f"all {attempts} replica(s) of `{model}` in tier `{tier}` failed; last error: {err.message}")


async def _pass_stream(
    gw: Gateway, resp: aiohttp.ClientResponse, replica: Deployment, rec: RequestRecord, started: float
) -> AsyncIterator[bytes]:
    try:
        async for chunk in resp.content.iter_any():
            if b'"usage"' in chunk:
                with contextlib.suppress(Exception):
                    for line in chunk.split(b"\n"):
                        if line.startswith(b"data: {") and b'"usage"' in line:
                            usage = json.loads(line[6:]).get("usage") or {}
                            rec.prompt_tokens = usage.get("prompt_tokens")
                            rec.completion_tokens = usage.get("completion_tokens")
            yield chunk
    except (aiohttp.ClientError, TimeoutError) as exc:
        replica.healthy = False
        rec.status = 502
        err = APIError(502, f"deployment {replica.base_url} failed mid-stream: {type(exc).__name__}")
        yield f"data: {json.dumps(err.body())}\n\ndata: [DONE]\n\n".encode()
    finally:
        resp.release()
        rec.latency_ms = (time.perf_counter() - started) * 1000
        gw.record(rec)


def main(argv: list[str] | None = None) -> None:
    """``python -m posttrain.platform.serving.gateway --config gateway.json --port 9000``: a gateway over a
    fixed list of deployments, checking API keys in the configured database (``--no-api-keys``, on
    loopback only: serve everyone, with no database at all)."""
    import uvicorn  # only for this command-line entry point

    parser = argparse.ArgumentParser(description="posttrain gateway (OpenAI-compatible)")
    parser.add_argument("--config", required=True, help="JSON file holding a GatewayConfig")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--no-api-keys", action="store_true", help="serve everyone (loopback only; benchmarks)")
    args = parser.parse_args(argv)
    config = GatewayConfig.model_validate_json(Path(args.config).read_text())
    logging.basicConfig(level=logging.WARNING)
    auth = None if args.no_api_keys else ApiAuth(args.host)
    try:
        refuse_open_server("gateway", args.host, auth)
    except OpenServerRefused as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"gateway on http://{args.host}:{args.port} for {len(config.deployments)} deployment(s)", flush=True)
    uvicorn.run(create_gateway_app(config, auth=auth), host=args.host, port=args.port, log_level="warning",
                access_log=False)  # fmt: skip


if __name__ == "__main__":
    main()
