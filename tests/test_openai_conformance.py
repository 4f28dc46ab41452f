"""OpenAI API conformance, parameter by parameter, through the official ``openai`` client against the embedded engine
and through the gateway: each test asserts the behaviour, not only a 200. (vLLM's behaviour is the reference where
OpenAI's and vLLM's differ.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from posttrain.platform.engines import DEFAULT_TIERS, EngineConfig
from posttrain.platform.engines.loader import load_model, load_tokenizer
from posttrain.platform.models import TinyModelSpec, build_tiny_model
from posttrain.platform.serving import (
    Deployment,
    EmbeddedEngine,
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
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("conf") / "tiny", SMALL)


@pytest.fixture(scope="module")
def servers(tiny_path: Path) -> Iterator[dict[str, ThreadedServer]]:
    path = tiny_path
    engine = EmbeddedEngine(
        EngineConfig(model_path=str(path), served_model_name="tiny", tier=DEFAULT_TIERS["fast"], max_model_len=256)
    ).start()
    server = serve_in_thread(create_engine_app(engine))
    gateway = serve_in_thread(
        create_gateway_app(GatewayConfig(deployments=[Deployment(model="tiny", tier="fast", base_url=server.base_url)]))
    )
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
    for stop in (
        text[6:9],
        [text[6:9], "\u2603never"],
        [text[9:13], text[6:9]],
    ):  # a string, a list, the first one wins
        cut, why, used = greedy(api, stop=stop)
        assert (cut, why) == (text[: text.find(text[6:9])], "stop"), (text, stop, cut)
        assert used < tokens  # generation stopped there, and usage counts what was generated up to it
    # streamed: the same text, even when the stop string spans chunks (each chunk is about a token here)
    chunks = list(
        api.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=24,
            temperature=0,
            stream=True,
            stop=text[6:9],
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text[: text.find(text[6:9])]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert (
        chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= tokens
    )  # include_usage, completions too
    # never found: the whole text, finish reason length
    assert greedy(api, stop="\u2603 no such text") == (text, "length", 24)


def test_stop_in_chat_streaming_and_not(api: openai.OpenAI) -> None:
    full = api.chat.completions.create(model="tiny", messages=CHAT, max_tokens=24, temperature=0)  # type: ignore[arg-type]
    text = full.choices[0].message.content or ""
    assert len(text) >= 12, text
    stop = text[5:8]
    cut = api.chat.completions.create(model="tiny", messages=CHAT, max_tokens=24, temperature=0, stop=stop)  # type: ignore[arg-type]
    assert cut.choices[0].message.content == text[: text.find(stop)] and cut.choices[0].finish_reason == "stop"
    chunks = list(
        api.chat.completions.create(
            model="tiny",
            messages=CHAT,
            max_tokens=24,
            temperature=0,
            stop=[stop],  # type: ignore[arg-type]
            stream=True,
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text[: text.find(stop)]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


@pytest.mark.parametrize("field, value", [("response_format", {"type": "json_object"}), ("suffix", " end")])
def test_a_parameter_the_engine_does_not_implement_is_refused_by_name(
    api: openai.OpenAI, field: str, value: object
) -> None:
    with pytest.raises(openai.BadRequestError, match=f"`{field}` is not supported by this engine") as caught:
        api.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, extra_body={field: value})
    assert caught.value.body["param"] == field  # type: ignore[index]


def test_what_is_supported_only_in_part_is_refused_with_the_reason(api: openai.OpenAI) -> None:
    refusals = [({"n": 2, "best_of": 3}, "best_of", "best_of other than n")]
    for fields, param, why in refusals:
        with pytest.raises(openai.BadRequestError, match=why) as caught:
            api.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, **fields)  # type: ignore[call-overload]
        assert caught.value.body["param"] == param  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs: true"):
        api.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, top_logprobs=2)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="over 64 completions a request"):
        api.completions.create(model="tiny", prompt=[PROMPT] * 9, max_tokens=2, n=8)


def test_n_samples_in_one_request(api: openai.OpenAI) -> None:
    """n=4 at temperature 1: four distinct samples (each its own draw); at 0 four identical greedy answers; seeded,
    the same four again; usage counts the prompt once and every sample's tokens."""
    sampled = api.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=1.0, n=4, seed=7)
    texts = [c.text for c in sampled.choices]
    assert [c.index for c in sampled.choices] == [0, 1, 2, 3] and len(set(texts)) == 4, texts
    again = api.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=1.0, n=4, seed=7)
    assert [c.text for c in again.choices] == texts
    greedy_four = api.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, n=4)
    one = api.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0)
    assert [c.text for c in greedy_four.choices] == [one.choices[0].text] * 4
    assert greedy_four.usage.prompt_tokens == one.usage.prompt_tokens  # type: ignore[union-attr]
    assert greedy_four.usage.completion_tokens == 4 * one.usage.completion_tokens  # type: ignore[union-attr]
    chat = api.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, temperature=1.0, n=3, seed=1)  # type: ignore[arg-type]
    assert len({c.message.content for c in chat.choices}) == 3 and [c.index for c in chat.choices] == [0, 1, 2]
    # streamed: each choice's chunks carry its index and end with its finish reason; together they are the same texts
    streamed: dict[int, str] = {}
    ends: dict[int, str] = {}
    for chunk in api.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=16, temperature=1.0, n=4, seed=7, stream=True
    ):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
            if c.finish_reason:
                ends[c.index] = c.finish_reason
    assert [streamed[i] for i in range(4)] == texts and set(ends) == {0, 1, 2, 3}
    deltas: dict[int, str] = {}
    for chunk in api.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=12, temperature=1.0, n=3, seed=1, stream=True
    ):  # type: ignore[arg-type]
        for c in chunk.choices:
            deltas[c.index] = deltas.get(c.index, "") + (c.delta.content or "")
    assert [deltas[i] for i in range(3)] == [c.message.content for c in chat.choices]


def test_a_list_of_prompts_and_token_id_prompts(api: openai.OpenAI, tiny_path: Path) -> None:
    """Choices in prompt order (prompt i's n samples at i * n ...), each the same as the prompt sent alone; token ids
    complete as the text that tokenises to them."""
    prompts = [PROMPT, "Total due:", "Amount"]
    alone = [
        api.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0).choices[0].text for p in prompts
    ]
    together = api.completions.create(model="tiny", prompt=prompts, max_tokens=8, temperature=0, n=2)
    assert [c.text for c in together.choices] == [t for t in alone for _ in range(2)]
    ids = load_tokenizer(tiny_path)(PROMPT, add_special_tokens=False)["input_ids"]
    by_ids = api.completions.create(model="tiny", prompt=ids, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == alone[0]
    several = api.completions.create(model="tiny", prompt=[ids, ids[:2]], max_tokens=8, temperature=0)
    assert several.choices[0].text == alone[0] and len(several.choices) == 2
    with pytest.raises(openai.BadRequestError, match="prompt token ids must lie in") as caught:
        api.completions.create(model="tiny", prompt=[ids, [10**7]], max_tokens=2)
    assert caught.value.body["param"] == "prompt.1"  # type: ignore[index]


def test_tool_choice_is_checked_at_the_edge(api: openai.OpenAI) -> None:
    """A named function must be among the tools, required needs tools, nothing else is a choice; none leaves the
    tools out (their enforcement: the real-model test below, as the tools' text is over the tiny model's context)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    refusals = [
        (
            {"tool_choice": {"type": "function", "function": {"name": "g"}}, "tools": tools},
            "not among the request's tools",
        ),
        ({"tool_choice": "required"}, "tool_choice required needs tools"),
        ({"tool_choice": "always", "tools": tools}, "tool_choice is none, auto, required or a named function"),
    ]
    for fields, why in refusals:
        with pytest.raises(openai.BadRequestError, match=why):
            api.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, **fields)  # type: ignore[call-overload]
    out = api.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, tools=tools, tool_choice="none")  # type: ignore[arg-type]
    assert out.choices[0].message.tool_calls is None


def test_neutral_values_are_accepted_and_unknown_fields_are_named_back(servers: dict[str, ThreadedServer]) -> None:
    neutral = {
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "logprobs": None,
        "echo": False,
        "best_of": 1,
        "logit_bias": {},
        "user": "analyst-7",
    }
    for where in ("engine", "gateway"):
        url = servers[where].base_url + "/v1/completions"
        plain = httpx.post(url, json={"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "temperature": 0}, timeout=60)
        same = httpx.post(
            url, json={"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "temperature": 0, **neutral}, timeout=60
        )
        assert same.status_code == 200 and same.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
        assert "x-posttrain-ignored-fields" not in same.headers
        extra = httpx.post(
            url, json={"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "my_flag": 1, "guided_x": "y"}, timeout=60
        )
        assert extra.status_code == 200 and extra.headers["x-posttrain-ignored-fields"] == "guided_x, my_flag"


def test_models_report_their_context_length_as_vllm_does(api: openai.OpenAI) -> None:
    """/v1/models: owned_by and max_model_len from the engine (the gateway asks its replica), and the gateway's tiers."""
    (model,) = api.models.list().data
    extra = model.model_extra or {}
    assert model.id == "tiny" and model.owned_by == "posttrain" and extra["max_model_len"] == 256
    if "tiers" in extra:  # the gateway
        assert (
            extra["tiers"] == ["fast"]
            and extra["default_tier"] == "fast"
            and extra["max_model_len_by_tier"] == {"fast": 256}
        )


def test_stop_strings_are_checked_at_the_edge(api: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="stop strings, each 1 to 256 characters"):
        api.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, stop=[""])
    with pytest.raises(openai.BadRequestError, match="at most 16 stop strings"):
        api.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, stop=[f"s{i}" for i in range(17)])


def test_logprobs_echo_scores_the_prompt_as_the_learner_does(api: openai.OpenAI, tiny_path: Path) -> None:
    """Completions with echo and logprobs: the prompt's tokens then the completion's, the first without a log-prob;
    each log-prob equal to the learner's recomputation over the same ids (within 1e-4), top log-probs listing the
    likeliest tokens with the chosen one, text offsets into the echoed text."""
    import torch

    from posttrain.training.modeling import token_logprobs

    out = api.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, echo=True, logprobs=3)
    choice = out.choices[0]
    lp = choice.logprobs
    assert lp is not None and choice.text.startswith(PROMPT)
    loaded = load_model(tiny_path)
    ids = loaded.tokenizer(choice.text, add_special_tokens=False)["input_ids"]
    prompt_len = len(loaded.tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
    assert (
        lp.tokens == [loaded.tokenizer.decode([t]) for t in ids][: len(lp.tokens)] and len(lp.tokens) == prompt_len + 4
    )
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # type: ignore[index]
    with torch.no_grad():
        expected = token_logprobs(loaded.model, torch.tensor([ids[: len(lp.tokens)]]))[0].tolist()
    assert max(abs(a - b) for a, b in zip(lp.token_logprobs[1:], expected)) < 1e-4  # type: ignore[index, operator]
    for token, logprob, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):  # type: ignore[index]
        assert top[token] == logprob and len(top) in (3, 4)  # the 3 likeliest, and the chosen one when not among them
        assert max(top.values()) <= 0
    greedy_steps = lp.top_logprobs[prompt_len:]  # type: ignore[index]
    assert all(top[token] == max(top.values()) for token, top in zip(lp.tokens[prompt_len:], greedy_steps))  # greedy
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]  # type: ignore[index]
    # without echo: the completion's tokens only; chat: OpenAI's content entries with bytes and top log-probs
    plain = (
        api.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=0).choices[0].logprobs
    )
    assert plain is not None and plain.token_logprobs == pytest.approx(lp.token_logprobs[prompt_len:], abs=1e-5)  # type: ignore[index]
    chat = api.chat.completions.create(
        model="tiny",
        messages=CHAT,
        max_tokens=5,
        temperature=0,
        logprobs=True,  # type: ignore[arg-type]
        top_logprobs=2,
    ).choices[0]
    content = chat.logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 5
    assert "".join(c.token for c in content) == chat.message.content
    for c in content:
        assert len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob == c.logprob  # greedy: the likeliest
        assert c.bytes == list(c.token.encode())
    none = api.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, temperature=0)  # type: ignore[arg-type]
    assert none.choices[0].logprobs is None


MULTIPLE_CHOICE = [
    ("Question: What is 2 + 3?\nAnswer:", [" 4", " 5", " 23", " 6"]),
    ("The capital of France is", [" Berlin", " Paris", " Madrid"]),
    ("Water freezes at a temperature of", [" 0 degrees Celsius", " 100 degrees Celsius", " 50 degrees Celsius"]),
    ("Question: Which animal barks?\nAnswer:", [" a cat", " a dog", " a fish"]),
]


def test_the_real_model_through_the_gateway_loglik_choices_and_forced_tool_calls(real_model, real_model_dir) -> None:  # type: ignore[no-untyped-def]
    """On the built-in real model through the gateway: a log-likelihood multiple-choice evaluation written against
    the API (echo + logprobs, the options as one list of prompts) makes the same choices, with the same scores within
    1e-3, as computing them directly; tool_choice named and required answer with a parsed call (streamed too)."""
    import torch

    from posttrain.platform.serving.client import choose_by_loglik
    from posttrain.training.modeling import token_logprobs

    engine = EmbeddedEngine(
        EngineConfig(model_path=str(real_model_dir.path), served_model_name="smol", tier=DEFAULT_TIERS["standard"]),
        loaded=real_model,
    ).start()
    server = serve_in_thread(create_engine_app(engine))
    gateway = serve_in_thread(
        create_gateway_app(
            GatewayConfig(deployments=[Deployment(model="smol", tier="standard", base_url=server.base_url)])
        )
    )
    tokenizer = real_model.tokenizer
    try:
        for context, options in MULTIPLE_CHOICE:
            chosen, scores = choose_by_loglik(gateway.base_url, "smol", context, options)
            direct = []
            for option in options:
                ids = tokenizer(context + option, add_special_tokens=False)["input_ids"]
                offsets = [sum(len(tokenizer.decode([t])) for t in ids[:i]) for i in range(len(ids))]
                with torch.no_grad():
                    logprobs = token_logprobs(real_model.model, torch.tensor([ids]))[0].tolist()
                direct.append(sum(lp for at, lp in zip(offsets[1:], logprobs) if at >= len(context)))
            assert scores == pytest.approx(direct, abs=1e-3), (context, scores, direct)
            assert chosen == max(range(len(options)), key=direct.__getitem__)
        client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0)
        weather = [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "The weather in a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                },
            },
            {
                "type": "function",
                "function": {
                    "name": "get_time",
                    "description": "The time in a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                },
            },
        ]
        ask = [{"role": "user", "content": "What is the weather in Paris?"}]
        for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
            out = client.chat.completions.create(
                model="smol",
                messages=ask,
                tools=weather,
                tool_choice=choice,  # type: ignore[arg-type]
                max_tokens=80,
                temperature=0,
            ).choices[0]
            assert out.finish_reason == "tool_calls" and out.message.tool_calls, out.message
            assert out.message.tool_calls[0].function.name in ("get_weather", "get_time")  # one of them, never another
            assert choice == "required" or out.message.tool_calls[0].function.name == "get_weather"
            json.loads(out.message.tool_calls[0].function.arguments)
        streamed = [
            c
            for chunk in client.chat.completions.create(
                model="smol",
                messages=ask,
                tools=weather,
                max_tokens=80,  # type: ignore[arg-type]
                temperature=0,
                tool_choice="required",
                stream=True,
            )
            for c in chunk.choices
        ]
        assert streamed[-1].finish_reason == "tool_calls"
        assert len([t.function.name for c in streamed for t in c.delta.tool_calls or []]) == 1
        assert not "".join(c.delta.content or "" for c in streamed)  # nothing of the call leaked as content
    finally:
        gateway.stop()
        server.stop()
        engine.stop()


def test_penalties_and_logit_bias_change_the_choice_as_vllm_applies_them(api: openai.OpenAI, tiny_path: Path) -> None:
    """logit_bias: +100 on a token makes greedy decoding repeat it, -100 on the greedy answer's first token removes
    it; frequency and presence penalties over the tokens generated so far: a strong one forbids any repeat."""
    plain = api.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, logprobs=0)
    tokens = plain.choices[0].logprobs.tokens  # type: ignore[union-attr]
    forced = api.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=0, logit_bias={"42": 100}
    )
    assert len(set(forced.choices[0].logprobs.tokens)) == 1  # type: ignore[union-attr]
    tokenizer = load_tokenizer(tiny_path)
    first = next(i for i in range(len(tokenizer)) if tokenizer.decode([i]) == tokens[0])
    banned = api.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=1, temperature=0, logprobs=0, logit_bias={str(first): -100}
    )
    assert banned.choices[0].logprobs.tokens[0] != tokens[0]  # type: ignore[union-attr]
    # the log-probs stay the model's own (before the bias), as vLLM reports them
    assert forced.choices[0].logprobs.token_logprobs[0] < 0  # type: ignore[union-attr, index, operator]
    assert len(set(tokens)) < len(tokens), f"the tiny model's greedy answer repeats tokens: {tokens}"
    for field in ("frequency_penalty", "presence_penalty"):
        varied = api.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, logprobs=0, **{field: 2.0}
        )  # type: ignore[arg-type]
        seen = varied.choices[0].logprobs.tokens  # type: ignore[union-attr]
        assert seen != tokens and len(set(seen)) > len(set(tokens)), (field, tokens, seen)
    with pytest.raises(openai.BadRequestError, match="logit_bias token ids must lie in"):
        api.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, logit_bias={"99999999": 1})
    with pytest.raises(openai.BadRequestError, match="biases from -100 to 100"):
        api.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, logit_bias={"5": 101})


def test_streamed_logprobs_are_the_whole_responses_in_pieces(api: openai.OpenAI) -> None:
    """Streaming with log-probs: every token's entry once, in order, the same as the whole response's (chat and
    completions, with echo: the prompt's in the first chunk)."""
    whole = (
        api.chat.completions.create(
            model="tiny",
            messages=CHAT,
            max_tokens=10,
            temperature=0,
            logprobs=True,  # type: ignore[arg-type]
            top_logprobs=2,
        )
        .choices[0]
        .logprobs.content
    )  # type: ignore[union-attr]
    pieces = [
        e
        for chunk in api.chat.completions.create(
            model="tiny",
            messages=CHAT,
            max_tokens=10,
            temperature=0,  # type: ignore[arg-type]
            logprobs=True,
            top_logprobs=2,
            stream=True,
        )
        for c in chunk.choices
        if c.logprobs
        for e in c.logprobs.content or []
    ]
    assert [(e.token, e.logprob) for e in pieces] == [(e.token, e.logprob) for e in whole]  # type: ignore[union-attr]
    full = api.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, echo=True, logprobs=1
    ).choices[0]
    tokens, logprobs, offsets, text = [], [], [], ""
    for chunk in api.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, echo=True, logprobs=1, stream=True
    ):
        for c in chunk.choices:
            text += c.text
            if c.logprobs:
                tokens += c.logprobs.tokens or []
                logprobs += c.logprobs.token_logprobs or []
                offsets += c.logprobs.text_offset or []
    assert text == full.text and tokens == full.logprobs.tokens  # type: ignore[union-attr]
    assert logprobs == full.logprobs.token_logprobs and offsets == full.logprobs.text_offset  # type: ignore[union-attr]


def test_sampling_parameters_do_what_they_say(api: openai.OpenAI) -> None:
    """seed: the same sample again, another seed another; temperature 0: the greedy answer; top_p near 0 keeps only
    the likeliest token, so sampling at temperature 1 gives the greedy answer; max_tokens and (chat)
    max_completion_tokens bound the answer, finish reason length; user is taken and changes nothing."""

    def sample(**fields: object) -> str:
        return api.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, **fields).choices[0].text  # type: ignore[call-overload]

    assert sample(temperature=1.0, seed=11) == sample(temperature=1.0, seed=11) != sample(temperature=1.0, seed=12)
    greedy_text = sample(temperature=0)
    assert sample(temperature=1.0, top_p=1e-6, seed=3) == greedy_text
    assert sample(temperature=0, user="analyst-7") == greedy_text
    bounded = api.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0)
    assert bounded.usage.completion_tokens == 5 and bounded.choices[0].finish_reason == "length"  # type: ignore[union-attr]
    chat = api.chat.completions.create(
        model="tiny",
        messages=CHAT,
        max_tokens=9,
        max_completion_tokens=3,  # type: ignore[arg-type]
        temperature=0,
    )
    assert chat.usage.completion_tokens == 3 and chat.choices[0].finish_reason == "length"  # type: ignore[union-attr]
