"""The embedded engine over HTTP, driven by the official openai client."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from PIL import Image

from posttrain.platform.engines import DEFAULT_TIERS, EngineConfig
from posttrain.platform.models import TinyModelSpec, TinyVisionModelSpec, build_tiny_model, build_tiny_vision_model
from posttrain.platform.serving import EmbeddedEngine, ThreadedServer, create_engine_app, serve_in_thread
from posttrain.platform.serving.app import TEXT_REQUEST_BYTES, default_max_request_bytes

SMALL = TinyModelSpec(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)


@pytest.fixture(scope="module")
def text_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ThreadedServer, EmbeddedEngine]]:
    path = build_tiny_model(tmp_path_factory.mktemp("e") / "tiny", SMALL)
    standard = DEFAULT_TIERS["standard"]
    tier = standard.model_copy(update={"embedded": standard.embedded.model_copy(update={"batch_wait_ms": 100.0})})
    engine = EmbeddedEngine(
        EngineConfig(model_path=str(path), served_model_name="tiny", tier=tier, max_model_len=256)
    ).start()
    server = serve_in_thread(create_engine_app(engine))
    yield server, engine
    server.stop()
    engine.stop()


@pytest.fixture(scope="module")
def client(text_server: tuple[ThreadedServer, EmbeddedEngine]) -> openai.OpenAI:
    return openai.OpenAI(base_url=text_server[0].base_url + "/v1", api_key="unused", max_retries=0)


def test_models_and_health(text_server: tuple[ThreadedServer, EmbeddedEngine], client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert httpx.get(text_server[0].base_url + "/health").status_code == 200


def test_chat_streaming_equals_non_streaming(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Summarise the invoice total."}]
    full = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    assert full.choices[0].finish_reason in {"stop", "length"}
    assert full.usage is not None and full.usage.completion_tokens == 12 or full.choices[0].finish_reason == "stop"
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason


def test_completions_endpoint(client: openai.OpenAI) -> None:
    out = client.completions.create(model="tiny", prompt="The invoice total is", max_tokens=5, temperature=0)
    assert out.usage.completion_tokens == 5 and out.choices[0].finish_reason == "length"
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="tiny", prompt="The invoice total is", max_tokens=5, temperature=0, stream=True
        )
    )
    assert streamed == out.choices[0].text


def test_concurrent_requests_are_batched(
    text_server: tuple[ThreadedServer, EmbeddedEngine], client: openai.OpenAI
) -> None:
    engine = text_server[1]
    results: list[str] = []

    def ask(i: int) -> None:
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"question {i}"}], max_tokens=8, temperature=0
        )
        results.append(r.choices[0].message.content or "")

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4
    assert engine.largest_batch >= 2


def test_a_request_joins_the_running_batch(
    text_server: tuple[ThreadedServer, EmbeddedEngine], client: openai.OpenAI
) -> None:
    """Continuous batching: a short request sent while a long one is decoding is answered before the
    long one ends (it joins the running batch instead of waiting for it), with the output it gets alone."""
    ask = {"model": "tiny", "prompt": "The payment date is", "max_tokens": 6, "temperature": 0}
    alone = client.completions.create(**ask).choices[0].text
    events: list[str] = []
    short: list[str] = []
    started = threading.Event()

    def long_stream() -> None:
        for chunk in client.completions.create(
            model="tiny", prompt="The invoice total is", max_tokens=220, temperature=0, stream=True
        ):
            if chunk.choices and chunk.choices[0].text:
                events.append("long")
                if len(events) == 3:
                    started.set()
        events.append("long-done")

    thread = threading.Thread(target=long_stream)
    thread.start()
    assert started.wait(60)
    out = client.completions.create(**ask)
    events.append("short-done")
    short.append(out.choices[0].text)
    thread.join(120)
    assert short == [alone]
    assert events.index("short-done") < events.index("long-done")
    assert "long" in events[events.index("short-done") :], "the long stream kept going after the short request"
    running = httpx.get(text_server[0].base_url + "/metrics").text
    assert 'vllm:num_requests_running{model_name="tiny"} 0' in running


def test_errors_are_openai_shaped(text_server: tuple[ThreadedServer, EmbeddedEngine], client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="maximum context length is 256 tokens") as exc:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "word " * 400}])
    assert exc.value.status_code == 400
    with pytest.raises(openai.BadRequestError, match="'max_tokens' or 'max_completion_tokens' is too large"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=250)
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="tiny", messages=[{"role": "wizard", "content": "hi"}])  # type: ignore
    with pytest.raises(openai.BadRequestError, match="takes no images"):
        client.chat.completions.create(
            model="tiny",
            messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}
            ],
        )
    r = httpx.post(text_server[0].base_url + "/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(text_server[0].base_url + "/v1/chat/completions", json={"model": "tiny", "messages": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_metrics_use_vllm_names(text_server: tuple[ThreadedServer, EmbeddedEngine], client: openai.OpenAI) -> None:
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    text = httpx.get(text_server[0].base_url + "/metrics").text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_success_total",
    ):
        assert name in text
    generated = [line for line in text.splitlines() if line.startswith("vllm:generation_tokens_total{")]
    assert float(generated[0].split()[-1]) >= 3


def _png(color: tuple[int, int, int]) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_vision_model_image_question(tmp_path: Path) -> None:
    path = build_tiny_vision_model(tmp_path / "vl", TinyVisionModelSpec())
    engine = EmbeddedEngine(EngineConfig(model_path=str(path), served_model_name="vl", max_images_per_prompt=1)).start()
    with serve_in_thread(create_engine_app(engine)) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)

        def ask(url: str, extra: list[dict[str, object]] | None = None) -> openai.types.chat.ChatCompletion:
            parts = [
                {"type": "image_url", "image_url": {"url": url}},
                *(extra or []),
                {"type": "text", "text": "What colour is this?"},
            ]
            return client.chat.completions.create(
                model="vl", messages=[{"role": "user", "content": parts}], max_tokens=4, temperature=0
            )

        red = ask(_png((255, 0, 0)))
        text_only = client.chat.completions.create(
            model="vl", messages=[{"role": "user", "content": "What colour is this?"}], max_tokens=4, temperature=0
        )
        assert red.usage.completion_tokens == 4
        # the image reached the model: it adds its visual tokens to the prompt
        assert red.usage.prompt_tokens > text_only.usage.prompt_tokens + 4
        with pytest.raises(openai.BadRequestError, match="image 0 is not a valid image"):
            ask("data:image/png;base64," + base64.b64encode(b"this is not a png").decode())
        with pytest.raises(openai.BadRequestError, match="too many images: at most 1"):
            ask(_png((0, 0, 255)), [{"type": "image_url", "image_url": {"url": _png((0, 255, 0))}}])
        with pytest.raises(openai.BadRequestError, match="only data: URLs"):
            ask("http://example.com/cat.png")
        big = io.BytesIO()
        Image.new("L", (6000, 6000)).save(big, format="PNG")  # 36 megapixels, a small file
        with pytest.raises(openai.BadRequestError, match="image 0 is 6000x6000 = 36000000 pixels, over"):
            ask("data:image/png;base64," + base64.b64encode(big.getvalue()).decode())
    # room in the body for the one image this deployment accepts, on top of the text's
    assert (
        default_max_request_bytes(engine) == EngineConfig(model_path="x").max_image_bytes * 4 // 3 + TEXT_REQUEST_BYTES
    )
    engine.stop()
