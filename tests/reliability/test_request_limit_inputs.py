"""Request limits under hostile input: a batch of oversize and out-of-range requests against a real
serving engine on loopback (the tiny test model, ``max_model_len`` 256, one engine for the module,
started by the ``server`` fixture of tests/test_request_limits.py). Each must get a clear 4xx naming
the limit, and the server must still answer /health and serve a valid request after every one.

Records ``reliability.inputs(..., category="request_limits")``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
from conftest import Reliability
from test_request_limits import _png, server  # noqa: F401 - ``server`` is the module's engine fixture

from posttrain.platform.serving import EmbeddedEngine
from posttrain.platform.serving.app import TEXT_REQUEST_BYTES
from posttrain.platform.serving.errors import APIError
from posttrain.platform.serving.images import decode_image_url

CATEGORY = "request_limits"
MAX_LEN = 256  # the fixture's max_model_len
CONTEXT = f"maximum context length is {MAX_LEN} tokens"
TOO_LARGE = f"larger than {TEXT_REQUEST_BYTES} bytes"


@dataclass
class Case:
    name: str
    send: Callable[[httpx.Client, str], httpx.Response]
    status: int  # what a clean answer is: this status and ``says`` in the error message
    says: str


def _post(path: str, **kwargs: object) -> Callable[[httpx.Client, str], httpx.Response]:
    return lambda client, url: client.post(f"{url}{path}", **kwargs)  # type: ignore[arg-type]


def _streamed(head: bytes, size: int) -> Callable[[httpx.Client, str], httpx.Response]:
    """A body with no Content-Length: the server must count while reading."""

    def body() -> Iterator[bytes]:
        yield head
        for _ in range(size // 65536):
            yield b"y" * 65536

    return _post("/v1/chat/completions", content=body(), headers={"content-type": "application/json"})


def _tokens_over(engine: EmbeddedEngine, over: int) -> str:
    """A plain-text prompt of a few tokens more than ``max_model_len``."""
    words = 1
    while len(engine.tokenizer("hello " * words)["input_ids"]) <= MAX_LEN + over - 1:
        words += 1
    return "hello " * words


def _cases(engine: EmbeddedEngine) -> list[Case]:
    huge = "x" * (2 * TEXT_REQUEST_BYTES)
    just_over = _tokens_over(engine, 2)
    deep = b'{"model": "tiny", "messages": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    assert len(deep) < TEXT_REQUEST_BYTES  # under the size limit: the nesting itself must be refused
    many = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}] * 12_000}
    assert len(json.dumps(many)) < TEXT_REQUEST_BYTES  # under the size limit: the context check refuses it
    chat = "/v1/chat/completions"
    comp = "/v1/completions"
    return [
        Case(
            "one huge string (chat)",
            _post(chat, json={"model": "tiny", "messages": [{"role": "user", "content": huge}]}),
            413,
            TOO_LARGE,
        ),
        Case("one huge string (completion)", _post(comp, json={"model": "tiny", "prompt": huge}), 413, TOO_LARGE),
        Case(
            "huge body, Content-Length declared",
            _post(
                comp,
                content=b"{" + b" " * (8 * TEXT_REQUEST_BYTES) + b"}",
                headers={"content-type": "application/json"},
            ),
            413,
            TOO_LARGE,
        ),
        Case(
            "huge body streamed without Content-Length",
            _streamed(b'{"model": "tiny", "prompt": "', 4 * TEXT_REQUEST_BYTES),
            413,
            TOO_LARGE,
        ),
        Case("many messages", _post(chat, json=many), 400, CONTEXT),
        Case(
            "many prompts in a list",
            _post(comp, json={"model": "tiny", "prompt": ["hello " * 40] * 3000}),
            400,
            "3000 prompts x n=1 is over 64 completions a request",
        ),
        Case(
            "deeply nested JSON",
            _post(chat, content=deep, headers={"content-type": "application/json"}),
            400,
            "nests JSON too deeply",
        ),
        Case(
            "huge max_tokens (completion)",
            _post(comp, json={"model": "tiny", "prompt": "hi", "max_tokens": 10**15}),
            400,
            "'max_tokens' or 'max_completion_tokens' is too large",
        ),
        Case(
            "huge max_tokens (chat)",
            _post(chat, json={"model": "tiny", "max_tokens": 2**62, "messages": [{"role": "user", "content": "hi"}]}),
            400,
            "is too large",
        ),
        Case(
            "negative max_tokens",
            _post(comp, json={"model": "tiny", "prompt": "hi", "max_tokens": -1}),
            400,
            "max_tokens",
        ),
        Case(
            "prompt just over max_model_len (text)",
            _post(comp, json={"model": "tiny", "prompt": just_over, "max_tokens": 1}),
            400,
            CONTEXT,
        ),
        Case(
            "prompt just over max_model_len (chat)",
            _post(chat, json={"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": just_over}]}),
            400,
            CONTEXT,
        ),
        Case(
            "prompt of token ids one over max_model_len",
            _post(comp, json={"model": "tiny", "prompt": [5] * (MAX_LEN + 1), "max_tokens": 1}),
            400,
            CONTEXT,
        ),
        Case(
            "prompt that fits, max_tokens past the context",
            _post(comp, json={"model": "tiny", "prompt": [5] * (MAX_LEN - 10), "max_tokens": 11}),
            400,
            "is too large",
        ),
        Case(
            "NaN in the body",
            _post(
                comp,
                content=b'{"model": "tiny", "prompt": "hi", "temperature": NaN}',
                headers={"content-type": "application/json"},
            ),
            400,
            "not valid JSON",
        ),
    ]


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return ""


def test_oversize_requests_are_refused_cleanly_and_the_engine_keeps_serving(
    server: tuple[str, EmbeddedEngine], reliability: Reliability
) -> None:  # noqa: F811
    url, engine = server
    cases = _cases(engine)
    refused, accepted, problems = 0, 0, []
    with httpx.Client(timeout=60) as client:
        for case in cases:
            try:
                response = case.send(client, url)
                status, message = response.status_code, _error_message(response)
            except httpx.HTTPError as exc:  # a refusal mid-stream may close the connection: not a clean answer
                status, message = -1, repr(exc)
            healthy = client.get(f"{url}/health").status_code == 200
            if status == case.status and case.says in message and healthy:
                refused += 1
            else:
                problems.append((case.name, status, message[:200], healthy))
        valid = client.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 2})
        accepted += valid.status_code == 200
        healthy = client.get(f"{url}/health").status_code == 200
    reliability.inputs(
        "serving engine /v1 request bodies",
        tried=len(cases) + 1,
        refused_cleanly=refused,
        accepted=accepted,
        category=CATEGORY,
        problems=problems,
    )
    assert not problems, problems
    assert valid.status_code == 200, valid.text
    assert healthy


def test_images_over_the_caps_are_refused_from_their_header(reliability: Reliability) -> None:
    """The decoder the engine runs on every image_url: pixel and byte caps, several bomb shapes."""
    limit_px, limit_bytes = 4 * 2**20, 256 * 1024
    cases = [
        (_png(8_000, 8_000), "pixels, over this deployment's limit"),  # square bomb
        (_png(60_000, 100), "pixels, over this deployment's limit"),  # thin strip: few bytes, many pixels
        (_png(2_049, 2_049), "pixels, over this deployment's limit"),  # just over 4 Mpx
        ("data:image/png;base64," + "A" * (2 * limit_bytes), "image 0"),  # bytes over the byte cap
        ("data:image/png;base64,!!!not-base64!!!", "image 0"),
        ("file:///etc/passwd", "image 0"),
        ("http://127.0.0.1:1/x.png", "image 0"),
    ]
    refused, problems = 0, []
    for url, says in cases:
        try:
            decode_image_url(url, 0, max_bytes=limit_bytes, max_pixels=limit_px)
            problems.append((url[:60], "accepted"))
        except APIError as exc:
            if 400 <= exc.status_code < 500 and says in str(exc):
                refused += 1
            else:
                problems.append((url[:60], exc.status_code, str(exc)[:200]))
        except Exception as exc:  # noqa: BLE001 - anything but a clear APIError is mishandled
            problems.append((url[:60], repr(exc)[:200]))
    ok = decode_image_url(_png(64, 48), 0, max_bytes=limit_bytes, max_pixels=limit_px).size == (64, 48)
    reliability.inputs(
        "image_url decoding",
        tried=len(cases) + 1,
        refused_cleanly=refused,
        accepted=int(ok),
        category=CATEGORY,
        problems=problems,
    )
    assert not problems, problems
    assert ok
