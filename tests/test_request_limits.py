"""One request cannot exhaust the serving engine: bodies are bounded while they stream in, a prompt
that cannot fit the context is refused before it is tokenised, tokenising runs off the event loop
(so /health keeps answering), and an image's pixels are capped before it is decoded."""

from __future__ import annotations

import base64
import io
import statistics
import threading
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest
from PIL import Image

from posttrain.platform.engines import DEFAULT_TIERS, EngineConfig
from posttrain.platform.models import TinyModelSpec, build_tiny_model
from posttrain.platform.serving import EmbeddedEngine, create_engine_app, serve_in_thread
from posttrain.platform.serving.app import TEXT_REQUEST_BYTES, default_max_request_bytes
from posttrain.platform.serving.errors import APIError
from posttrain.platform.serving.images import decode_image_url


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, EmbeddedEngine]]:
    path = build_tiny_model(
        tmp_path_factory.mktemp("limits") / "tiny",
        TinyModelSpec(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128),
    )
    engine = EmbeddedEngine(
        EngineConfig(model_path=str(path), served_model_name="tiny", tier=DEFAULT_TIERS["standard"], max_model_len=256)
    ).start()
    with serve_in_thread(create_engine_app(engine)) as running:
        yield running.base_url, engine
    engine.stop()


def _health_latencies(url: str, seconds: float, out: list[float], stop: threading.Event) -> None:
    with httpx.Client(timeout=10) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not stop.is_set():
            started = time.perf_counter()
            assert client.get(f"{url}/health").status_code == 200
            out.append(time.perf_counter() - started)
            time.sleep(0.02)


def test_a_100_mb_body_in_flight_is_refused_and_health_keeps_answering(server: tuple[str, EmbeddedEngine]) -> None:
    url, engine = server
    assert default_max_request_bytes(engine) == TEXT_REQUEST_BYTES  # a text model: no room made for images
    idle: list[float] = []
    _health_latencies(url, 1.0, idle, threading.Event())
    chunk = b"x" * (1024 * 1024)

    def body() -> Iterator[bytes]:  # no Content-Length: the server must count while reading
        yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
        for _ in range(100):
            yield chunk

    process = psutil.Process()
    rss_before = process.memory_info().rss
    busy: list[float] = []
    stop = threading.Event()
    poller = threading.Thread(target=_health_latencies, args=(url, 30.0, busy, stop))
    poller.start()
    try:
        with httpx.Client(timeout=60) as client:
            refused = client.post(
                f"{url}/v1/chat/completions", content=body(), headers={"content-type": "application/json"}
            )
    except httpx.HTTPError:
        refused = None  # the server may close the connection on a body it refused mid-stream
    finally:
        time.sleep(0.5)
        stop.set()
        poller.join()
    if refused is not None:
        assert refused.status_code == 413 and "larger than" in refused.json()["error"]["message"]
    grown_mb = (process.memory_info().rss - rss_before) / 2**20
    assert grown_mb < 200, grown_mb
    bound = max(0.1, 10 * statistics.median(idle))  # within 100 ms, or ten idle answers where the machine is loaded
    assert busy and max(busy) < bound, (max(busy), statistics.median(idle))


def test_a_prompt_that_cannot_fit_is_refused_before_tokenising(server: tuple[str, EmbeddedEngine], monkeypatch) -> None:  # type: ignore[no-untyped-def]
    url, engine = server
    calls: list[int] = []
    real = type(engine.tokenizer).__call__

    def counting(self, text, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(text) if isinstance(text, str) else 0)
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(type(engine.tokenizer), "__call__", counting)
    long = "word " * 150_000  # 750,000 characters: thousands of tokens however they are split
    with httpx.Client(timeout=60) as client:
        chat = client.post(
            f"{url}/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": long}]}
        )
        completion = client.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": long})
        fits = client.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 2})
    for refused in (chat, completion):
        assert refused.status_code == 400, refused.text
        assert "maximum context length is 256 tokens" in refused.json()["error"]["message"]
        assert "at least" in refused.json()["error"]["message"]
    assert fits.status_code == 200
    assert all(n < 1000 for n in calls), calls  # only the small prompt was tokenised


def _png(width: int, height: int) -> str:
    buffer = io.BytesIO()
    Image.new("L", (width, height)).save(buffer, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_an_image_over_the_pixel_cap_is_refused_from_its_header() -> None:
    before = Image.MAX_IMAGE_PIXELS
    bomb = _png(12_000, 12_000)  # 144 megapixels in a few hundred kilobytes
    assert len(bomb) < 1_000_000
    started = time.perf_counter()  # the two refusals, timed against decoding the bomb's pixels (below)
    with pytest.raises(
        APIError,
        match="image 0 .*than this deployment's limit of 16777216|image 0 is 12000x12000 = "
        "144000000 pixels, over this deployment's limit of 16777216",
    ):
        decode_image_url(bomb, 0, max_bytes=20 * 2**20, max_pixels=16 * 2**20)
    Image.MAX_IMAGE_PIXELS = 10**12  # Pillow's own process-wide limit out of the way: the deployment's still holds
    try:
        with pytest.raises(APIError, match="image 0 is 12000x12000 = 144000000 pixels, over this deployment's limit"):
            decode_image_url(bomb, 0, max_bytes=20 * 2**20, max_pixels=16 * 2**20)
        refusing = time.perf_counter() - started
        started = time.perf_counter()
        with Image.open(io.BytesIO(base64.b64decode(bomb.partition(",")[2]))) as pixels:
            pixels.load()  # the peer: what a refusal after decoding would have cost, measured here and now
        decoding = time.perf_counter() - started
    finally:
        Image.MAX_IMAGE_PIXELS = before
    assert refusing < decoding / 4, (refusing, decoding)  # both refusals read the header only
    assert decode_image_url(_png(64, 48), 1, max_bytes=2**20, max_pixels=16 * 2**20).size == (64, 48)
