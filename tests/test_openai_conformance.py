"""OpenAI API conformance, parameter by parameter, through the official ``openai`` client against the embedded engine
and through the gateway: each test asserts the behaviour, not only a 200. (vLLM's behaviour is the reference where
OpenAI's and vLLM's differ.)"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from posttrain.platform.models import TinyModelSpec, build_tiny_model
from posttrain.platform.serving import (
    DEFAULT_TIERS,
    Deployment,
    EmbeddedEngine,
    EngineConfig,
    GatewayConfig,
    ThreadedServer,
    create_engine_app,
    create_gateway_app,
    serve_in_thread,
)

SMALL = TinyModelSpec(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
PROMPT = "The invoice total is"
CHAT = [{"role": "user", "content": "Summarise the invoice total."}]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ThreadedServer]]:
    path = build_tiny_model(tmp_path_factory.mktemp("conf") / "tiny", SMALL)
    engine = EmbeddedEngine(EngineConfig(model_path=str(path), served_model_name="tiny", tier=DEFAULT_TIERS["fast"],
                                         max_model_len=256)).start()
    server = serve_in_thread(create_engine_app(engine))
    gateway = serve_in_thread(create_gateway_app(GatewayConfig(deployments=[
        Deployment(model="tiny", tier="fast", base_url=server.base_url)])))
    yield {"engine": server, "gateway": gateway}
    gateway.stop()
    server.stop()
    engine.stop()


@pytest.fixture(params=["engine", "gateway"])
def api(request: pytest.FixtureRequest, servers: dict[str, ThreadedServer]) -> openai.OpenAI:
    """The same client against the engine and against the gateway (which routes the model to its only tier)."""
    return openai.OpenAI(base_url=servers[request.param].base_url + "/v1", api_key="unused", max_retries=0)


def greedy(api: openai.OpenAI, **extra: object) -> tuple[str, str, int]:
    out = api.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, **extra)  # type: ignore[call-overload]
    return out.choices[0].text, out.choices[0].finish_reason, out.usage.completion_tokens


def test_stop_trims_the_text_and_sets_the_finish_reason(api: openai.OpenAI) -> None:
    text, reason, tokens = greedy(api)
    assert reason == "length" and tokens == 24 and len(text) >= 12, (text, reason)
    for stop in (text[6:9], [text[6:9], "\u2603never"], [text[9:13], text[6:9]]):  # a string, a list, the first one wins
        cut, why, used = greedy(api, stop=stop)
        assert (cut, why) == (text[: text.find(text[6:9])], "stop"), (text, stop, cut)
        assert used < tokens  # generation stopped there, and usage counts what was generated up to it
    # streamed: the same text, even when the stop string spans chunks (each chunk is about a token here)
    chunks = list(api.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, stream=True,
                                         stop=text[6:9], stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text[: text.find(text[6:9])]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= tokens  # include_usage, completions too
    # never found: the whole text, finish reason length
    assert greedy(api, stop="\u2603 no such text") == (text, "length", 24)


def test_stop_in_chat_streaming_and_not(api: openai.OpenAI) -> None:
    full = api.chat.completions.create(model="tiny", messages=CHAT, max_tokens=24, temperature=0)  # type: ignore[arg-type]
    text = full.choices[0].message.content or ""
    assert len(text) >= 12, text
    stop = text[5:8]
    cut = api.chat.completions.create(model="tiny", messages=CHAT, max_tokens=24, temperature=0, stop=stop)  # type: ignore[arg-type]
    assert cut.choices[0].message.content == text[: text.find(stop)] and cut.choices[0].finish_reason == "stop"
    chunks = list(api.chat.completions.create(model="tiny", messages=CHAT, max_tokens=24, temperature=0, stop=[stop],  # type: ignore[arg-type]
                                              stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text[: text.find(stop)]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


@pytest.mark.parametrize("field, value", [("presence_penalty", 0.5), ("frequency_penalty", -1.0), ("logprobs", 2),
                                          ("echo", True), ("best_of", 3), ("logit_bias", {"5": 10})])
def test_a_parameter_the_engine_does_not_implement_is_refused_by_name(api: openai.OpenAI, field: str, value: object) -> None:
    with pytest.raises(openai.BadRequestError, match=f"`{field}` is not supported by this engine") as caught:
        api.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, extra_body={field: value})
    assert caught.value.body["param"] == field  # type: ignore[index]


def test_tool_choice_that_is_not_enforced_is_refused(api: openai.OpenAI) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        with pytest.raises(openai.BadRequestError, match="`tool_choice` is not supported by this engine"):
            api.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, tools=tools, tool_choice=choice)  # type: ignore[arg-type]
    out = api.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, tools=tools, tool_choice="none")  # type: ignore[arg-type]
    assert out.choices[0].message.tool_calls is None


def test_neutral_values_are_accepted_and_unknown_fields_are_named_back(servers: dict[str, ThreadedServer]) -> None:
    neutral = {"presence_penalty": 0, "frequency_penalty": 0.0, "logprobs": None, "echo": False, "best_of": 1,
               "logit_bias": {}, "user": "analyst-7"}
    for where in ("engine", "gateway"):
        url = servers[where].base_url + "/v1/completions"
        plain = httpx.post(url, json={"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "temperature": 0}, timeout=60)
        same = httpx.post(url, json={"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "temperature": 0, **neutral},
                          timeout=60)
        assert same.status_code == 200 and same.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
        assert "x-posttrain-ignored-fields" not in same.headers
        extra = httpx.post(url, json={"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "my_flag": 1, "guided_x": "y"},
                           timeout=60)
        assert extra.status_code == 200 and extra.headers["x-posttrain-ignored-fields"] == "guided_x, my_flag"


def test_stop_strings_are_checked_at_the_edge(api: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="stop strings, each 1 to 256 characters"):
        api.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, stop=[""])
    with pytest.raises(openai.BadRequestError, match="at most 16 stop strings"):
        api.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, stop=[f"s{i}" for i in range(17)])
