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


async def _merged(engine: EmbeddedEngine, handles: list[RequestHandle]) -> AsyncIterator[tuple[int, str, str | None]]:
    """Every handle's :func:`_deltas` as they come, ``(index, delta, finish_reason)``, the requests' choices
    interleaved; the first engine error is raised."""
    if len(handles) == 1:
        async for delta, reason in _deltas(engine, handles[0]):
            yield 0, delta, reason
        return
    arrived: asyncio.Queue[tuple[int, str | None, str | None, APIError | None]] = asyncio.Queue()

    async def pump(index: int, handle: RequestHandle) -> None:
        try:
            async for delta, reason in _deltas(engine, handle):
                await arrived.put((index, delta, reason, None))
        except APIError as exc:
            await arrived.put((index, None, None, exc))
        await arrived.put((index, None, None, None))

    tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
    try:
        live = len(handles)
        while live:
            index, delta, reason, error = await arrived.get()
            if error is not None:
                raise error
            if delta is None:
                live -= 1
                continue
            yield index, delta, reason
    finally:
        for task in tasks:
            task.cancel()


async def _wholes(engine: EmbeddedEngine, handles: list[RequestHandle]) -> list[tuple[str, str]]:
    """Each handle's whole text and finish reason (:func:`_whole`, together); every handle is released after."""
    try:
        return list(await asyncio.gather(*(_whole(engine, h) for h in handles)))
    finally:
        for h in handles:
            h.cancel()


def _usage(handles: list[RequestHandle]) -> dict[str, int]:
    """The prompt tokens of each distinct prompt once (n samples share theirs) and every choice's completion tokens."""
    p = sum(len(prepared.prompt_ids) for prepared in {id(h.prepared): h.prepared for h in handles}.values())
    c = sum(h.completion_tokens for h in handles)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _token_text(engine: EmbeddedEngine, token: int) -> str:
    return engine.tokenizer.decode([token])


def _chat_logprobs(engine: EmbeddedEngine, h: RequestHandle) -> dict[str, Any] | None:
    """OpenAI's chat ``logprobs``: per answer token its text, bytes, log-prob and the likeliest alternatives."""
    if not h.seq.params.logprobs:
        return None

    def entry(token: int, logprob: float) -> dict[str, Any]:
        text = _token_text(engine, token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    n = h.completion_tokens
    tops = h.seq.top_logprobs or [[] for _ in range(n)]
    return {"content": [{**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in top]}
                        for t, lp, top in zip(h.seq.generated[:n], h.seq.logprobs[:n], tops[:n])]}  # fmt: skip


def _completion_logprobs(engine: EmbeddedEngine, h: RequestHandle, echo: bool) -> dict[str, Any] | None:
    """The legacy completions ``logprobs``: tokens, their log-probs, the likeliest tokens at each position (with
    the chosen one) and each token's offset in the returned text; with ``echo`` the prompt's tokens first, the
    very first without a log-prob (null), as OpenAI's legacy API returns them."""
    if not h.seq.params.logprobs:
        return None
    n = h.completion_tokens
    tokens = h.seq.generated[:n]
    scored: list[tuple[float, list[tuple[int, float]]] | None] = list(zip(h.seq.logprobs[:n], h.seq.top_logprobs[:n] or [[]] * n))
    if echo:
        tokens = h.seq.prompt_ids + tokens
        scored = list(h.seq.prompt_logprobs) + scored
    texts = [_token_text(engine, t) for t in tokens]
    offsets, at = [], 0
    for text in texts:
        offsets.append(at)
        at += len(text)
    tops: list[dict[str, float] | None] = []
    for token, text, found in zip(tokens, texts, scored):
        if found is None:
            tops.append(None)
            continue
        tops.append({**{_token_text(engine, a): alp for a, alp in found[1]}, text: found[0]})
    return {"tokens": texts, "token_logprobs": [None if f is None else f[0] for f in scored], "top_logprobs": tops,
            "text_offset": offsets}


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
        handles = engine.submit(await asyncio.to_thread(engine.prepare_chat, req), req.n)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return ignoring(req, StreamingResponse(_chat_stream(engine, handles, include_usage), media_type="text/event-stream"))
        return ignoring(req, await _chat_full(engine, handles))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        granted, body = await body_of(request)
        req: CompletionRequest = parse_request(CompletionRequest, body)
        check_model(req.model, granted)
        prepared = await asyncio.to_thread(engine.prepare_completion, req)
        handles = [h for p in prepared for h in engine.submit(p, req.n)]  # choice i: prompt i // n, sample i % n
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return ignoring(req, StreamingResponse(_completion_stream(engine, handles, include_usage, req.echo),
                                                   media_type="text/event-stream"))
        return ignoring(req, await _completion_full(engine, handles, req.echo))

    return app


def ignoring(req: SamplingFields, response: Response) -> Response:
    """``response`` naming the request's fields this engine ignored (none is dropped without a word)."""
    if ignored := req.ignored_fields:
        response.headers[IGNORED_HEADER] = ", ".join(ignored)[:1024]
    return response


async def _chat_full(engine: EmbeddedEngine, handles: list[RequestHandle]) -> JSONResponse:
    choices = []
    for index, (h, (text, reason)) in enumerate(zip(handles, await _wholes(engine, handles))):
        text = h.prepared.forced + text
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if h.prepared.has_tools:
            content, calls = parse_tool_calls(text)
            if calls:
                message = {"role": "assistant", "content": content or None,
                           "tool_calls": [c.to_openai() for c in calls]}
                reason = "tool_calls"
        choices.append({"index": index, "message": message, "finish_reason": reason, "logprobs": _chat_logprobs(engine, h)})
    first = handles[0]
    return JSONResponse({
        "id": f"chatcmpl-{first.id}", "object": "chat.completion", "created": first.created, "model": engine.name,
        "choices": choices, "usage": _usage(handles),
    })


async def _chat_stream(engine: EmbeddedEngine, handles: list[RequestHandle], include_usage: bool) -> AsyncIterator[bytes]:
    first = handles[0]
    base = {"id": f"chatcmpl-{first.id}", "object": "chat.completion.chunk", "created": first.created,
            "model": engine.name}
    tools = first.prepared.has_tools

    def chunk(index: int, delta: dict[str, Any], reason: str | None = None) -> bytes:
        return sse({**base, "choices": [{"index": index, "delta": delta, "finish_reason": reason, "logprobs": None}]})

    texts = [h.prepared.forced for h in handles]  # each choice so far (a forced call's start held back, as a call)
    sent = [0] * len(handles)  # characters of each already streamed
    try:
        for index in range(len(handles)):
            yield chunk(index, {"role": "assistant", "content": ""})
        async for index, delta, reason in _merged(engine, handles):
            texts[index] += delta
            text = texts[index]
            if reason is None:
                limit = safe_prefix_len(text) if tools else len(text)
                if limit > sent[index]:
                    yield chunk(index, {"content": text[sent[index]:limit]})
                    sent[index] = limit
                continue
            content, calls = parse_tool_calls(text) if tools else (text, [])
            if calls:
                if len(content) > sent[index]:
                    yield chunk(index, {"content": content[sent[index]:]})
                yield chunk(index, {"tool_calls": [c.to_openai(index=i) for i, c in enumerate(calls)]})
                reason = "tool_calls"
            elif len(text) > sent[index]:
                yield chunk(index, {"content": text[sent[index]:]})
            yield chunk(index, {}, reason)
        if include_usage:
            yield sse({**base, "choices": [], "usage": _usage(handles)})
        yield sse("[DONE]")
    except APIError as exc:
        yield sse(exc.body())
        yield sse("[DONE]")
    finally:
        for h in handles:
            h.cancel()


def _echoed(h: RequestHandle, echo: bool) -> str:
    return (h.prepared.prompt_text or "") if echo else ""


async def _completion_full(engine: EmbeddedEngine, handles: list[RequestHandle], echo: bool) -> JSONResponse:
    first = handles[0]
    return JSONResponse({
        "id": f"cmpl-{first.id}", "object": "text_completion", "created": first.created, "model": engine.name,
        "choices": [{"index": index, "text": _echoed(h, echo) + text, "finish_reason": reason,
                     "logprobs": _completion_logprobs(engine, h, echo)}
                    for index, (h, (text, reason)) in enumerate(zip(handles, await _wholes(engine, handles)))],
        "usage": _usage(handles),
    })  # fmt: skip


async def _completion_stream(engine: EmbeddedEngine, handles: list[RequestHandle], include_usage: bool,
                             echo: bool) -> AsyncIterator[bytes]:
    first = handles[0]
    base = {"id": f"cmpl-{first.id}", "object": "text_completion", "created": first.created, "model": engine.name}

    def chunk(index: int, text: str, reason: str | None) -> bytes:
        return sse({**base, "choices": [{"index": index, "text": text, "finish_reason": reason, "logprobs": None}]})

    try:
        if echo:
            for index, h in enumerate(handles):
                yield chunk(index, _echoed(h, echo), None)
        async for index, delta, reason in _merged(engine, handles):
            if delta or reason is not None:
                yield chunk(index, delta, reason)
        if include_usage:
            yield sse({**base, "choices": [], "usage": _usage(handles)})
        yield sse("[DONE]")
    except APIError as exc:
        yield sse(exc.body())
        yield sse("[DONE]")
    finally:
        for h in handles:
            h.cancel()
