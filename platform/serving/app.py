"""The OpenAI-compatible HTTP API over one :class:`EmbeddedEngine`.

Given an ``auth`` (:mod:`posttrain.platform.serving.auth`; the engine command gives one when it
listens beyond loopback), every request's API key is checked against the database first.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from posttrain.platform.api_keys import KeyGrant
from posttrain.platform.serving.auth import ApiAuth, allow_model, visible
from posttrain.platform.serving.engine import DoneEvent, EmbeddedEngine, ErrorEvent, RequestHandle
from posttrain.platform.serving.errors import APIError, model_not_found
from posttrain.platform.serving.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    IGNORED_HEADER,
    SamplingFields,
    parse_request,
    read_json_body,
)
from posttrain.platform.serving.tool_parser import parse_tool_calls, safe_prefix_len


def sse(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status_code)


class _Detokenizer:
    """Turns a growing list of token ids into text deltas, holding back incomplete UTF-8.

    Incremental, as vLLM's detokenizer: each step decodes only a window of the newest tokens
    and the step before them, twice (without and with the new tokens; a tokenizer that drops
    a leading space at the start of a decode drops it on both sides of the comparison), never
    the whole sequence again: a 2,000-token answer costs 2,000 small decodes, not quadratic work.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # ids[_prefix:_read] decode to text already emitted
        self._read = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        before = self._decode(self.ids[self._prefix:self._read])
        after = self._decode(self.ids[self._prefix:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # nothing new yet, or an incomplete UTF-8 sequence: wait for the next token
        delta = after[len(before):]
        self.text += delta
        self._prefix, self._read = self._read, len(self.ids)
        return delta

    def final(self) -> str:
        """What is left at the end: tokens held back for incomplete UTF-8 (decoded once as a whole)."""
        text = self._decode(self.ids)
        delta = text[len(self.text):] if text.startswith(self.text) else ""
        self.text += delta
        return delta


class _StopStrings:
    """Stop strings over streamed text, as vLLM applies them: the output ends before the first stop string, which is
    not included; text that could be the start of a stop string is held back until the next text says it is not,
    so a stop string split across tokens or chunks is found all the same."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.pending = ""
        self.hit = False

    def feed(self, delta: str) -> str:
        """The part of the text so far that is safe to send."""
        if not self.stops or self.hit:
            return "" if self.hit else delta
        self.pending += delta
        found = [i for i in (self.pending.find(stop) for stop in self.stops) if i >= 0]
        if found:
            self.hit = True
            out, self.pending = self.pending[: min(found)], ""
            return out
        keep = max((k for stop in self.stops for k in range(1, len(stop)) if self.pending.endswith(stop[:k])), default=0)
        out, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep:]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


async def _deltas(engine: EmbeddedEngine, handle: RequestHandle) -> AsyncIterator[tuple[str, str | None]]:
    """The completion's text as it grows (``(delta, None)``), then ``("", finish_reason)``. A stop string ends the
    text before it (finish reason ``stop``) and the request in the engine at once; an engine error is raised."""
    detok = _Detokenizer(engine.tokenizer)
    cut = _StopStrings(handle.prepared.stop)
    async for event in handle.stream():
        if isinstance(event, ErrorEvent):
            raise event.error
        done = isinstance(event, DoneEvent)
        out = cut.feed(detok.final() if done else detok.add(event.ids))  # type: ignore[union-attr]
        if cut.hit:
            handle.stop_early(len(detok.ids))
            if out:
                yield out, None
            yield "", "stop"
            return
        if done:
            out += cut.flush()
        if out:
            yield out, None
        if done:
            yield "", event.finish_reason  # type: ignore[union-attr]
            return
    raise APIError(500, "generation ended without a finish event")


async def _whole(engine: EmbeddedEngine, handle: RequestHandle) -> tuple[str, str]:
    """The whole completion text and its finish reason."""
    parts, reason = [], "abort"
    async for delta, finished in _deltas(engine, handle):
        parts.append(delta)
        reason = finished or reason
    return "".join(parts), reason


def _usage(h: RequestHandle) -> dict[str, int]:
    p, c = len(h.seq.prompt_ids), h.completion_tokens
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


TEXT_REQUEST_BYTES = 1024 * 1024  # a body's room for text: JSON-escaped, far more than any context window holds


def default_max_request_bytes(engine: EmbeddedEngine) -> int:
    """``max_request_bytes`` when the deployment sets it, else 1 MiB of text plus, for a vision
    model only, room for the images a prompt may carry (base64: 4/3 of their bytes)."""
    if engine.config.max_request_bytes:
        return engine.config.max_request_bytes
    images = engine.config.max_images_per_prompt * engine.config.max_image_bytes if engine.is_vision else 0
    return images * 4 // 3 + TEXT_REQUEST_BYTES


def create_engine_app(engine: EmbeddedEngine, max_request_bytes: int | None = None, auth: ApiAuth | None = None) -> FastAPI:
    """Routes: /health, /v1/models, /v1/chat/completions, /v1/completions, /metrics.

    A request body over ``max_request_bytes`` (default :func:`default_max_request_bytes`) gets a 413;
    ``auth`` checks API keys on the /v1 routes (none: everyone is served)."""
    app = FastAPI(title=f"posttrain engine: {engine.name}")
    app.state.engine = engine
    app.state.auth = auth
    limit = max_request_bytes or default_max_request_bytes(engine)

    async def body_of(request: Request) -> tuple[KeyGrant | None, Any]:
        """The request's key grant (checked before the body is read), then its parsed JSON body."""
        granted = None if auth is None else await auth.grant(request)
        return granted, (await read_json_body(request, limit))[1]

    def check_model(model: str, granted: KeyGrant | None) -> None:
        allow_model(granted, model)
        if model != engine.name:
            raise model_not_found(model, [engine.name])

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        engine.metrics.request_rejected(exc.status_code)
        return error_response(exc)

    @app.get("/health")
    async def health() -> Response:
        alive = engine._thread is not None and engine._thread.is_alive()
        return Response(status_code=200 if alive else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(engine.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        granted = None if auth is None else await auth.grant(request)
        return {"object": "list", "data": [{
            "id": name, "object": "model", "created": 0, "owned_by": "posttrain",
            "root": engine.loaded.info.path, "max_model_len": engine.max_model_len,
        } for name in visible(granted, [engine.name])]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        granted, body = await body_of(request)
        req: ChatCompletionRequest = parse_request(ChatCompletionRequest, body)
        check_model(req.model, granted)
        # templating and tokenising are proportional to the prompt: off the event loop, so /health and
        # every other request keep being answered meanwhile
        handle = engine.submit(await asyncio.to_thread(engine.prepare_chat, req))
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return ignoring(req, StreamingResponse(_chat_stream(engine, handle, include_usage), media_type="text/event-stream"))
        return ignoring(req, await _chat_full(engine, handle))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        granted, body = await body_of(request)
        req: CompletionRequest = parse_request(CompletionRequest, body)
        check_model(req.model, granted)
        handle = engine.submit(await asyncio.to_thread(engine.prepare_completion, req))
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return ignoring(req, StreamingResponse(_completion_stream(engine, handle, include_usage),
                                                   media_type="text/event-stream"))
        return ignoring(req, await _completion_full(engine, handle))

    return app


def ignoring(req: SamplingFields, response: Response) -> Response:
    """``response`` naming the request's fields this engine ignored (none is dropped without a word)."""
    if ignored := req.ignored_fields:
        response.headers[IGNORED_HEADER] = ", ".join(ignored)[:1024]
    return response


async def _chat_full(engine: EmbeddedEngine, handle: RequestHandle) -> JSONResponse:
    text, reason = await _whole(engine, handle)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if handle.prepared.has_tools:
        content, calls = parse_tool_calls(text)
        if calls:
            message = {"role": "assistant", "content": content or None,
                       "tool_calls": [c.to_openai() for c in calls]}
            reason = "tool_calls"
    return JSONResponse({
        "id": f"chatcmpl-{handle.id}", "object": "chat.completion", "created": handle.created, "model": engine.name,
        "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": None}],
        "usage": _usage(handle),
    })


async def _chat_stream(engine: EmbeddedEngine, handle: RequestHandle, include_usage: bool) -> AsyncIterator[bytes]:
    base = {"id": f"chatcmpl-{handle.id}", "object": "chat.completion.chunk", "created": handle.created,
            "model": engine.name}

    def chunk(delta: dict[str, Any], reason: str | None = None) -> bytes:
        return sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}]})

    text, sent = "", 0  # the completion so far; characters of it already streamed
    try:
        yield chunk({"role": "assistant", "content": ""})
        async for delta, reason in _deltas(engine, handle):
            text += delta
            if reason is None:
                limit = safe_prefix_len(text) if handle.prepared.has_tools else len(text)
                if limit > sent:
                    yield chunk({"content": text[sent:limit]})
                    sent = limit
                continue
            content, calls = parse_tool_calls(text) if handle.prepared.has_tools else (text, [])
            if calls:
                if len(content) > sent:
                    yield chunk({"content": content[sent:]})
                yield chunk({"tool_calls": [c.to_openai(index=i) for i, c in enumerate(calls)]})
                reason = "tool_calls"
            elif len(text) > sent:
                yield chunk({"content": text[sent:]})
            yield chunk({}, reason)
            if include_usage:
                yield sse({**base, "choices": [], "usage": _usage(handle)})
        yield sse("[DONE]")
    except APIError as exc:
        yield sse(exc.body())
        yield sse("[DONE]")
    finally:
        handle.cancel()


async def _completion_full(engine: EmbeddedEngine, handle: RequestHandle) -> JSONResponse:
    text, reason = await _whole(engine, handle)
    return JSONResponse({
        "id": f"cmpl-{handle.id}", "object": "text_completion", "created": handle.created, "model": engine.name,
        "choices": [{"index": 0, "text": text, "finish_reason": reason, "logprobs": None}],
        "usage": _usage(handle),
    })


async def _completion_stream(engine: EmbeddedEngine, handle: RequestHandle, include_usage: bool) -> AsyncIterator[bytes]:
    base = {"id": f"cmpl-{handle.id}", "object": "text_completion", "created": handle.created, "model": engine.name}
    try:
        async for delta, reason in _deltas(engine, handle):
            if delta or reason is not None:
                yield sse({**base, "choices": [{"index": 0, "text": delta, "finish_reason": reason, "logprobs": None}]})
        if include_usage:
            yield sse({**base, "choices": [], "usage": _usage(handle)})
        yield sse("[DONE]")
    except APIError as exc:
        yield sse(exc.body())
        yield sse("[DONE]")
    finally:
        handle.cancel()


