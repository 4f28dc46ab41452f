"""The gateway in front of real engines: routing by task type, tool calls, retries, failures."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from conftest import wait_for
from drills import ChatExample, memorize

from posttrain.platform.engines import DEFAULT_TIERS, EngineConfig
from posttrain.platform.engines.launcher import free_port
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

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ANSWER = "It is 21 C and sunny in Paris."


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """A tool-using tiny model (taught by a quick fine-tune) in two tiers, plus a gateway with a dead replica."""
    path = build_tiny_model(
        tmp_path_factory.mktemp("gw") / "tool",
        TinyModelSpec(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128),
    )
    after_call = QUESTION + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"},
    ]
    losses = memorize(path, [ChatExample(QUESTION, CALL, TOOLS), ChatExample(after_call, ANSWER, TOOLS)], steps=80)
    assert losses[-1] < 0.1 * losses[0]
    engines, servers = [], []
    for name, tier in (("tool", "fast"), ("tool", "standard"), ("other", "standard")):
        engine = EmbeddedEngine(
            EngineConfig(model_path=str(path), served_model_name=name, tier=DEFAULT_TIERS[tier], max_model_len=512)
        ).start()
        engines.append(engine)
        servers.append(serve_in_thread(create_engine_app(engine)))
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    config = GatewayConfig(
        deployments=[
            Deployment(model="tool", tier="fast", base_url=dead),
            Deployment(model="tool", tier="fast", base_url=servers[0].base_url),
            Deployment(model="tool", tier="standard", base_url=servers[1].base_url),
            Deployment(model="other", tier="standard", base_url=servers[2].base_url),
        ],
        health_interval_s=0.5,
    )
    app = create_gateway_app(config)
    gateway = serve_in_thread(app)
    yield {"gateway": gateway, "app": app, "engines": engines, "servers": servers}
    gateway.stop()
    for s in servers:
        s.stop()
    for e in engines:
        e.stop()


def _client(stack: dict[str, object], **headers: str) -> openai.OpenAI:
    gateway: ThreadedServer = stack["gateway"]  # type: ignore[assignment]
    return openai.OpenAI(
        base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0, default_headers=headers or None
    )


def test_tool_call_round_trip_through_gateway(stack: dict[str, object]) -> None:
    client = _client(stack, **{"x-task-type": "chat"})
    first = client.chat.completions.create(model="tool", messages=QUESTION, tools=TOOLS, temperature=0, max_tokens=40)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    messages = QUESTION + [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "21 C, sunny"},
    ]
    second = client.chat.completions.create(model="tool", messages=messages, tools=TOOLS, temperature=0, max_tokens=40)
    assert second.choices[0].message.content == ANSWER
    assert second.choices[0].finish_reason == "stop"


def test_streamed_tool_call(stack: dict[str, object]) -> None:
    chunks = list(
        _client(stack).chat.completions.create(
            model="tool", messages=QUESTION, tools=TOOLS, temperature=0, max_tokens=40, stream=True
        )
    )
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert "<tool_call>" not in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_routing_policy_picks_the_tier(stack: dict[str, object]) -> None:
    fast_engine, standard_engine, _ = stack["engines"]  # type: ignore[misc]
    before = (fast_engine.metrics.success.copy(), standard_engine.metrics.success.copy())
    for task, engine, idx in (("ide", fast_engine, 0), ("batch", standard_engine, 1)):
        n = sum(engine.metrics.success.values())
        out = _client(stack, **{"x-task-type": task}).chat.completions.create(
            model="tool", messages=[{"role": "user", "content": "hello"}], max_tokens=3
        )
        assert out.usage.completion_tokens >= 1
        assert sum(engine.metrics.success.values()) == n + 1, (task, before[idx])
    # metadata works like the header
    n = sum(fast_engine.metrics.success.values())
    _client(stack).chat.completions.create(
        model="tool", messages=[{"role": "user", "content": "hi"}], max_tokens=2, metadata={"task_type": "chat"}
    )
    assert sum(fast_engine.metrics.success.values()) == n + 1


def test_any_openai_client_reaches_a_model_deployed_in_some_tiers_only(
    stack: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    """No custom header needed: a model deployed in `standard` only answers requests that name no tier, or a task
    type whose tier it lacks; `name@tier` picks a tier from the model name; each decision is logged with its id."""
    caplog.set_level(logging.INFO, logger="posttrain.gateway")
    fast_engine, _, other_engine = stack["engines"]  # type: ignore[misc]
    ask = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    n = sum(other_engine.metrics.success.values())
    assert _client(stack).chat.completions.create(model="other", **ask).choices  # type: ignore[arg-type]
    assert _client(stack, **{"x-task-type": "chat"}).chat.completions.create(model="other", **ask).choices  # type: ignore[arg-type]
    assert sum(other_engine.metrics.success.values()) == n + 2
    n = sum(fast_engine.metrics.success.values())
    out = _client(stack).completions.create(model="tool@fast", prompt="hello", max_tokens=2)
    assert out.model == "tool" and sum(fast_engine.metrics.success.values()) == n + 1  # the engine serves it as `tool`
    with pytest.raises(
        openai.NotFoundError, match=r"no deployment in tier `batch` \(asked by the model name's suffix\)"
    ):
        _client(stack).chat.completions.create(model="other@batch", **ask)  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError, match="The model `missing` does not exist"):
        _client(stack).chat.completions.create(model="missing@fast", **ask)  # type: ignore[arg-type]

    gateway: ThreadedServer = stack["gateway"]  # type: ignore[assignment]
    sent = httpx.post(
        f"{gateway.base_url}/v1/chat/completions",
        json={"model": "other", **ask},
        headers={"x-request-id": "req-42"},
        timeout=60,
    )
    assert sent.status_code == 200 and sent.headers["x-request-id"] == "req-42"
    refused = httpx.post(f"{gateway.base_url}/v1/chat/completions", json={"model": "other@fast", **ask}, timeout=60)
    rid = refused.headers["x-request-id"]
    assert refused.status_code == 404 and len(rid) == 32
    lines = [r.getMessage() for r in caplog.records if r.name == "posttrain.gateway"]
    assert "request req-42: other -> model other, tier standard (the policy's default tier)" in lines, lines
    assert any(
        line.startswith("request ") and "task type 'chat' asks for `fast`, not deployed" in line for line in lines
    )
    assert any(
        line.startswith(f"request {rid} refused with 404: model `other` has no deployment in tier `fast`")
        for line in lines
    ), lines


def test_route_picks_the_asked_tier_then_the_task_type_then_the_models_default() -> None:
    from posttrain.platform.serving.gateway import Gateway, RoutingPolicy

    def gw(deployments: list[Deployment], **policy: object) -> Gateway:
        return Gateway(GatewayConfig(deployments=deployments, policy=RoutingPolicy.model_validate(policy)))

    both = [Deployment(model="m", tier="fast", base_url="a"), Deployment(model="m", tier="standard", base_url="b")]
    assert gw(both).route("m", None, None).tier == "standard"  # the policy's default tier
    assert gw(both).route("m", None, "chat").tier == "fast"
    assert gw(both).route("m", "fast", "batch").tier == "fast"  # the header over the task type
    assert gw(both).route("m@standard", "fast", None).tier == "standard"  # the name's suffix over the header
    assert gw(both, model_tiers={"m": "fast"}).route("m", None, None).how == "the policy's tier for the model"
    marked = [both[0].model_copy(update={"default": True}), both[1]]
    assert gw(marked, model_tiers={"m": "standard"}).route("m", None, None).tier == "fast"  # the registry's mark first
    only = [Deployment(model="m", tier="long", base_url="c")]
    assert gw(only).route("m", None, None).model_dump() == {
        "model": "m",
        "tier": "long",
        "how": "the only tier deployed",
    }
    named = [Deployment(model="a@b", tier="fast", base_url="d")]  # a served name with an @ stays whole
    assert gw(named).route("a@b", None, None).model == "a@b"


def test_a_model_not_served_is_told_apart_from_one_registered_but_not_deployed() -> None:
    """The 404 for a model no deployment serves: a registered one is told how to deploy it (the registry asked only on
    that path), an unknown one that it does not exist; the served models listed are those the key may use, and a
    gateway with nothing deployed says so instead of an empty list. A key that may not use the model learns nothing of
    the registry."""
    import asyncio

    from posttrain.platform.api_keys import KeyGrant
    from posttrain.platform.serving.errors import APIError
    from posttrain.platform.serving.gateway import Gateway

    asked: list[str] = []

    def registered(name: str) -> bool:
        asked.append(name)
        return name == "trained"

    def refusal(gw: Gateway, model: str, grant: KeyGrant | None = None) -> str:
        with pytest.raises(APIError) as err:
            asyncio.run(gw.resolve(model, None, None, grant))
        assert err.value.status_code == 404
        return err.value.message

    served = Gateway(
        GatewayConfig(
            deployments=[
                Deployment(model="a", tier="standard", base_url="x"),
                Deployment(model="b", tier="standard", base_url="y"),
            ]
        ),
        registered=registered,
    )
    assert asyncio.run(served.resolve("a", None, None, None)).model == "a" and asked == []  # served: no registry query
    assert refusal(served, "trained") == (
        "The model `trained` is registered but not deployed: deploy it (Deploy on the "
        "console's Models page, or `posttrain models deploy trained`) and ask again. "
        "Served models: a, b."
    )
    assert refusal(served, "nothing") == "The model `nothing` does not exist. Served models: a, b."
    scoped = KeyGrant(key_id="k", name="n", models=("b",))
    assert refusal(served, "trained", scoped) == "The model `trained` does not exist. Served models: b."
    assert asked == ["trained", "nothing"]  # the scoped key's request never asked the registry
    empty = Gateway(GatewayConfig(deployments=[]), registered=registered)
    assert refusal(empty, "nothing").endswith("does not exist. Nothing is deployed yet.")
    assert refusal(Gateway(GatewayConfig(deployments=[])), "trained").startswith("The model `trained` does not exist")


def test_dead_replica_is_skipped_and_marked(stack: dict[str, object]) -> None:
    client = _client(stack, **{"x-posttrain-tier": "fast"})
    for _ in range(3):  # round robin lands on the dead replica at least once
        out = client.chat.completions.create(model="tool", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert out.choices[0].message is not None
    gw = stack["app"].state.gateway  # type: ignore[attr-defined]
    assert [d.healthy for d in gw.deployments if d.tier == "fast"] == [False, True]
    records = list(gw.records)
    assert any(r.attempts == 2 and r.status == 200 for r in records)
    assert all(r.latency_ms > 0 for r in records)
    assert any(r.completion_tokens for r in records)


def test_gateway_errors(stack: dict[str, object]) -> None:
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        _client(stack).chat.completions.create(model="missing", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.NotFoundError, match="no deployment in tier `fast`"):
        _client(stack, **{"x-posttrain-tier": "fast"}).chat.completions.create(
            model="other", messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(openai.BadRequestError, match="maximum context length is 512"):
        _client(stack).chat.completions.create(model="tool", messages=[{"role": "user", "content": "w " * 900}])
    with pytest.raises(openai.BadRequestError):
        _client(stack).chat.completions.create(model="tool", messages=[{"role": "nobody", "content": "x"}])


DYING_SERVER = textwrap.dedent("""
    import asyncio, os, sys, uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route
    async def health(request): return Response(status_code=200)
    async def chat(request):
        # The partial answer must be on the wire before the process dies (else the test measures this server's
        # race, not the gateway, as it did under load): read the request whole (a process that exits with unread
        # bytes in its socket resets the connection, and a reset can discard what the gateway has not read yet),
        # and give the event loop a moment to write the chunk out.
        await request.body()
        async def body():
            yield b'data: {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "dying", '
            yield b'"choices": [{"index": 0, "delta": {"content": "partial"}, "finish_reason": null}]}\\n\\n'
            await asyncio.sleep(0.2)
            os._exit(1)  # the deployment dies mid-stream
        return StreamingResponse(body(), media_type="text/event-stream")
    app = Starlette(routes=[Route("/health", health), Route("/v1/chat/completions", chat, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
""")


def test_deployment_dying_mid_stream(tmp_path: Path) -> None:
    port = free_port()
    script = tmp_path / "dying.py"
    script.write_text(DYING_SERVER)
    proc = subprocess.Popen([sys.executable, str(script), str(port)])

    def healthy() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(
            healthy, timeout=30, message="the dying deployment to answer /health"
        )  # fails the test if it never does
        app = create_gateway_app(
            GatewayConfig(deployments=[Deployment(model="dying", tier="standard", base_url=f"http://127.0.0.1:{port}")])
        )
        with serve_in_thread(app) as gateway:
            client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0)
            stream = client.chat.completions.create(
                model="dying", messages=[{"role": "user", "content": "x"}], stream=True
            )
            got = []
            with pytest.raises(openai.APIError, match="failed mid-stream"):
                for chunk in stream:
                    got.append(chunk.choices[0].delta.content)
            assert got == ["partial"]
            assert httpx.get(gateway.base_url + "/health").status_code == 200  # the gateway keeps serving
            assert app.state.gateway.deployments[0].healthy is False
    finally:
        proc.kill()
        proc.wait()
