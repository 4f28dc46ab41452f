"""The OpenAI-compatible HTTP API over one :class:`EmbeddedEngine`.

Given an ``auth`` (:mod:`posttrain.platform.serving.auth`; the engine command gives one when it
listens beyond loopback), every request's API key is checked against the database first.

A request ends when its client leaves, streamed or not (:mod:`posttrain.platform.serving.disconnect`):
its sequences are aborted and leave the engine's batch at the next decode step.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from posttrain.platform.api_keys import KeyGrant
from posttrain.platform.serving.auth import ApiAuth, allow_model, visible
from posttrain.platform.serving.disconnect import unless_client_leaves
from posttrain.platform.serving.engine import DoneEvent, EmbeddedEngine, ErrorEvent, RequestHandle
from posttrain.platform.serving.errors import APIError, model_not_found
from posttrain.platform.serving.protocol import (
    IGNORED_HEADER,
    ChatCompletionRequest,
    CompletionRequest,
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
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # nothing new yet, or an incomplete UTF-8 sequence: wait for the next token
        delta = after[len(before) :]
        self.text += delta
        self._prefix, self._read = self._read, len(self.ids)
        return delta

    def final(self) -> str:
        """What is left at the end: tokens held back for incomplete UTF-8 (decoded once as a whole)."""
        text = self._decode(self.ids)
        delta = text[len(self.text) :] if text.startswith(self.text) else ""
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
        keep = max(
            (k for stop in self.stops for k in range(1, len(stop)) if self.pending.endswith(stop[:k])), default=0
        )
        out, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep :]
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
        out = cut.feed(detok.final() if isinstance(event, DoneEvent) else detok.add(event.ids))
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
        if isinstance(event, DoneEvent):
            yield "", event.finish_reason
            return
    raise APIError(500, "generation ended without a finish event")


async def _whole(engine: EmbeddedEngine, handle: RequestHandle) -> tuple[str, str]:
    """The whole completion text and its finish reason."""
    parts: list[str] = []
    reason = "abort"
    async for delta, finished in _deltas(engine, handle):
        parts.append(delta)
        reason = finished or reason
    return "".join(parts), reason


async def _merged(engine: EmbeddedEngine, handles: list[RequestHandle]) -> AsyncIterator[tuple[int, str, str | None]]:
    """Every handle's :func:`_deltas` as they come, ``(index, delta, finish_reason)``, the requests' choices
    interleaved; the first engine error is raised."""
    if len(handles) == 1:
        async for text, reason in _deltas(engine, handles[0]):
            yield 0, text, reason
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
    """Each handle's whole text and finish reason (:func:`_whole`, together); every handle is released after, or
    aborted when this is cancelled (its client left)."""
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
    return cast(str, engine.tokenizer.decode([token]))  # one id list decodes to one string


def _chat_entries(engine: EmbeddedEngine, h: RequestHandle, start: int, end: int) -> list[dict[str, Any]]:
    """OpenAI's chat ``logprobs.content`` for answer tokens ``start:end``: text, bytes, log-prob, likeliest others."""

    def entry(token: int, logprob: float) -> dict[str, Any]:
        text = _token_text(engine, token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    seq = h.seq
    tops = seq.top_logprobs[start:end] if seq.params.top_logprobs else [[]] * (end - start)
    return [{**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in top]}
            for t, lp, top in zip(seq.generated[start:end], seq.logprobs[start:end], tops)]  # fmt: skip


def _scored_tokens(
    h: RequestHandle, echo: bool, end: int
) -> tuple[list[int], list[tuple[float, list[tuple[int, float]]] | None]]:
    """The legacy completions' scored tokens: with ``echo`` the prompt's first (the very first unscored), then the
    completion's first ``end``."""
    seq = h.seq
    tops = seq.top_logprobs[:end] if seq.params.top_logprobs else [[]] * end
    tokens, scored = seq.generated[:end], list(zip(seq.logprobs[:end], tops))
    if echo:
        return seq.prompt_ids + tokens, list(seq.prompt_logprobs) + scored
    return tokens, scored  # type: ignore[return-value]


def _legacy_logprobs(engine: EmbeddedEngine, tokens: list[int], scored: list[Any], offset: int) -> dict[str, Any]:
    """The legacy completions ``logprobs`` of ``tokens``: their texts, log-probs, the likeliest tokens at each
    position with the chosen one (null where unscored, as OpenAI's legacy API gives the first echoed token) and each
    token's offset in the returned text, the first at ``offset``."""
    texts = [_token_text(engine, t) for t in tokens]
    offsets = []
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    tops = [None if found is None else {**{_token_text(engine, a): alp for a, alp in found[1]}, text: found[0]}
            for text, found in zip(texts, scored)]  # fmt: skip
    return {
        "tokens": texts,
        "token_logprobs": [None if f is None else f[0] for f in scored],
        "top_logprobs": tops,
        "text_offset": offsets,
    }


class _Released:
    """How much of each choice's log-probs a stream has sent: the tokens scored so far, and the rest at the end."""

    def __init__(self, handles: list[RequestHandle], echo: bool = False) -> None:
        self.handles, self.echo = handles, echo
        self.sent = [0] * len(handles)  # entries sent (legacy with echo: the prompt's first)
        self.offsets = [0] * len(handles)  # the text offset of each choice's next legacy entry

    def _done(self, index: int, final: bool) -> int:
        """The answer tokens whose log-probs may go out now: those scored so far, and all of them at the end."""
        h = self.handles[index]
        return h.completion_tokens if final else min(len(h.seq.logprobs), h.completion_tokens)

    def chat(self, engine: EmbeddedEngine, index: int, final: bool = False) -> dict[str, Any] | None:
        if not self.handles[index].seq.params.logprobs:
            return None
        end = self._done(index, final)
        start, self.sent[index] = self.sent[index], max(end, self.sent[index])
        return {"content": _chat_entries(engine, self.handles[index], start, end)}

    def legacy(self, engine: EmbeddedEngine, index: int, final: bool = False) -> dict[str, Any] | None:
        h = self.handles[index]
        if not h.seq.params.logprobs:
            return None
        tokens, scored = _scored_tokens(h, self.echo, self._done(index, final))
        begin = self.sent[index]
        found = _legacy_logprobs(engine, tokens[begin:], scored[begin:], self.offsets[index])
        self.sent[index] = max(len(tokens), begin)
        self.offsets[index] += sum(len(t) for t in found["tokens"])
        return found


TEXT_REQUEST_BYTES = 1024 * 1024  # a body's room for text: JSON-escaped, far more than any context window holds


def default_max_request_bytes(engine: EmbeddedEngine) -> int:
    """``max_request_bytes`` when the deployment sets it, else 1 MiB of text plus, for a vision
    model only, room for the images a prompt may carry (base64: 4/3 of their bytes)."""
    if engine.config.max_request_bytes:
        return engine.config.max_request_bytes
    images = engine.config.max_images_per_prompt * engine.config.max_image_bytes if engine.is_vision else 0
    return images * 4 // 3 + TEXT_REQUEST_BYTES


def create_engine_app(
    engine: EmbeddedEngine, max_request_bytes: int | None = None, auth: ApiAuth | None = None
) -> FastAPI:
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
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "posttrain",
                    "root": engine.loaded.info.path,
                    "max_model_len": engine.max_model_len,
                }
                for name in visible(granted, [engine.name])
            ],
        }

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        granted, body = await body_of(request)
        req: ChatCompletionRequest = parse_request(ChatCompletionRequest, body)
        check_model(req.model, granted)
        # templating and tokenising are proportional to the prompt: off the event loop, so /health and
        # every other request keep being answered meanwhile
        handles = engine.submit([await asyncio.to_thread(engine.prepare_chat, req)], req.n)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return ignoring(
                req, StreamingResponse(_chat_stream(engine, handles, include_usage), media_type="text/event-stream")
            )
        return ignoring(req, await unless_client_leaves(request, _chat_full(engine, handles)))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        granted, body = await body_of(request)
        req: CompletionRequest = parse_request(CompletionRequest, body)
        check_model(req.model, granted)
        prepared = await asyncio.to_thread(engine.prepare_completion, req)
        handles = engine.submit(prepared, req.n)  # choice i: prompt i // n, sample i % n
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return ignoring(
                req,
                StreamingResponse(
                    _completion_stream(engine, handles, include_usage, req.echo), media_type="text/event-stream"
                ),
            )
        return ignoring(req, await unless_client_leaves(request, _completion_full(engine, handles, req.echo)))

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
                message = {
                    "role": "assistant",
                    "content": content or None,
                    "tool_calls": [c.to_openai() for c in calls],
                }
                reason = "tool_calls"
        scored = {"content": _chat_entries(engine, h, 0, h.completion_tokens)} if h.seq.params.logprobs else None
        choices.append({"index": index, "message": message, "finish_reason": reason, "logprobs": scored})
    first = handles[0]
    return JSONResponse(
        {
            "id": f"chatcmpl-{first.id}",
            "object": "chat.completion",
            "created": first.created,
            "model": engine.name,
            "choices": choices,
            "usage": _usage(handles),
        }
    )


async def _chat_stream(
    engine: EmbeddedEngine, handles: list[RequestHandle], include_usage: bool
) -> AsyncIterator[bytes]:
    first = handles[0]
    base = {
        "id": f"chatcmpl-{first.id}",
        "object": "chat.completion.chunk",
        "created": first.created,
        "model": engine.name,
    }
    tools = first.prepared.has_tools

    released = _Released(handles)

    def chunk(index: int, delta: dict[str, Any], reason: str | None = None) -> bytes:
        scored = released.chat(engine, index, final=reason is not None) if "role" not in delta else None
        return sse({**base, "choices": [{"index": index, "delta": delta, "finish_reason": reason, "logprobs": scored}]})

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
                    yield chunk(index, {"content": text[sent[index] : limit]})
                    sent[index] = limit
                continue
            content, calls = parse_tool_calls(text) if tools else (text, [])
            if calls:
                if len(content) > sent[index]:
                    yield chunk(index, {"content": content[sent[index] :]})
                yield chunk(index, {"tool_calls": [c.to_openai(index=i) for i, c in enumerate(calls)]})
                reason = "tool_calls"
            elif len(text) > sent[index]:
                yield chunk(index, {"content": text[sent[index] :]})
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
                     "logprobs": _legacy_logprobs(engine, *_scored_tokens(h, echo, h.completion_tokens), 0)
                     if h.seq.params.logprobs else None}
                    for index, (h, (text, reason)) in enumerate(zip(handles, await _wholes(engine, handles)))],
        "usage": _usage(handles),
    })  # fmt: skip


async def _completion_stream(
    engine: EmbeddedEngine, handles: list[RequestHandle], include_usage: bool, echo: bool
) -> AsyncIterator[bytes]:
    first = handles[0]
    base = {"id": f"cmpl-{first.id}", "object": "text_completion", "created": first.created, "model": engine.name}

    released = _Released(handles, echo)

    def chunk(index: int, text: str, reason: str | None) -> bytes:
        scored = released.legacy(engine, index, final=reason is not None)
        return sse({**base, "choices": [{"index": index, "text": text, "finish_reason": reason, "logprobs": scored}]})

    echoed = [not echo] * len(handles)
    try:
        async for index, delta, reason in _merged(engine, handles):
            if not echoed[index]:  # the prompt first, scored (the engine scored it when it took the request in)
                echoed[index] = True
                yield chunk(index, _echoed(handles[index], echo), None)
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
