"""A request ends when its client leaves, and one request cannot starve the others (issue 33, part 2).

A long ``/v1/completions`` (``n`` over the tier's whole batch, thousands of tokens a sample) runs on the
real embedded engine, sent straight to it or through the real gateway, streamed or not, from a client on
a raw socket. A short request beside it is measured against the same short request alone just before,
in the same run, in decode steps and in seconds: the median ratio in steps stays within the engine's
fairness bound (:mod:`posttrain.platform.serving.engine`). Then the long request's client closes its connection:
within a bound in decode steps of the client leaving, the server has asked for the abort and every sample of the
request has left the engine (each within 2 decode steps of that ask; the engine logs how many it took), and the
engine's running and waiting counts in ``/metrics`` are zero. A server that does not abort (the long request
decodes on for thousands of steps) fails at the bound.

Each case records its outcomes with ``category="request_lifetime"``; the load ``request_lifetime.client_leaving``
holds, per round, the seconds from the client leaving to its request gone from the engine, with the decode steps
of the same span in ``decode_steps`` (``p50``, ``max`` and the ``bound``), which ``bench/reliability.py`` carries
into its report, and the steps to the abort's ask in ``steps_to_abort``.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import statistics
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import Reliability, wait_for

from posttrain.platform.engines import DEFAULT_TIERS, EngineConfig
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
from posttrain.platform.serving.disconnect import CLIENT_CLOSED_REQUEST
from posttrain.platform.serving.gateway import RequestRecord

CATEGORY = "request_lifetime"
SPEC = TinyModelSpec(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
LONG_N = 32  # twice the standard tier's whole batch (max_num_seqs 16): before the budget it took all of it
LONG_TOKENS = 3000  # thousands of decode steps a sample: it never ends by itself while the test runs
SHORT_TOKENS = 48  # enough decode steps that a short request's latency is mostly decoding, not the machine's jitter
ROUNDS = 9  # the median of nine rounds: a burst of the machine's other load moves it less
ABORT_STEPS = 2  # the acceptance: a sample leaves within 2 decode steps of its abort
# The fairness bound, in decode steps. The engine promises (its module docstring) that beside one request a
# short one joins at the next step and then takes one step a token, as alone: its latency in steps is its
# latency alone plus at most one. Counted from outside, from sending to the answer, the steps the long request
# takes during the short one's HTTP round trip count too (alone, the engine takes only the short one's 47):
# measured, a median of 1.36x to 1.45x, and less when other processes load the CPU (its steps slow down more
# than the round trip). The bound lets the round trip cost as many steps as the short request's own decoding,
# over twice what it costs here. Without the budget the short request waited for the long one's 3000 steps:
# a ratio over 60. In seconds the multiple is also each step's cost, a batch of 9 rows against 1, which is
# the machine's, not the scheduler's: 1.6x to 2.2x on an idle CPU here, and unbounded when other processes
# take the cores (up to 12x seen at a load of 5 on these 2 cores: torch's threads for a wide step get
# descheduled). So seconds are recorded beside steps, and the steps are held to the bound.
STEPS_BOUND = 2.0
# From the long request's client leaving to the last of its samples leaving the engine, in decode steps: the server
# noticing the closed socket (through the gateway, the gateway noticing and closing its upstream connection, then the
# engine's server noticing that), its abort, and at most ABORT_STEPS more. The servers' event loops are threads of
# this process beside the engine's scheduler thread, so every step here is one the scheduler took while they waited
# for a core or the GIL. Measured (72 rounds, all four cases, at a load of 5 on these 2 cores): the abort asked 0
# or 1 steps after the client left, the request gone 1 or 2 steps after (1.5 to 85 ms). The bound is 16 times that.
# A server that does not abort leaves the long request decoding its 3000 steps: the test stops at the bound and
# fails (checked by removing the abort from each path that a leaving client takes: 33 steps, no abort asked).
LEAVING_STEPS_BOUND = 32
HANG_CAP_S = 60.0  # only turns a hang into a failure: an abort takes milliseconds


@dataclass
class Stack:
    engine: EmbeddedEngine
    server: ThreadedServer
    gateway: ThreadedServer
    records: deque[RequestRecord]  # the gateway's


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A tiny model on the embedded engine (standard tier: a batch of 16 rows, 8 a request), the gateway in front."""
    path = build_tiny_model(tmp_path_factory.mktemp("lifetime") / "tiny", SPEC)
    engine = EmbeddedEngine(EngineConfig(model_path=str(path), served_model_name="tiny", tier=DEFAULT_TIERS["standard"],
                                         max_model_len=4096)).start()  # fmt: skip
    server = serve_in_thread(create_engine_app(engine))
    app = create_gateway_app(GatewayConfig(deployments=[
        Deployment(model="tiny", tier="standard", base_url=server.base_url)]))  # fmt: skip
    gateway = serve_in_thread(app)
    _short_latency(gateway.base_url, engine)  # warm up both servers and the model: the first requests run slower
    yield Stack(engine, server, gateway, app.state.gateway.records)
    gateway.stop()
    server.stop()
    engine.stop()


class LeavingClient:
    """A real HTTP client on a raw socket: it sends one POST and, when told, leaves without reading the answer."""

    def __init__(self, base_url: str, path: str, body: dict[str, object]) -> None:
        where = urlsplit(base_url)
        payload = json.dumps(body).encode()
        self.sock = socket.create_connection((where.hostname, where.port))
        head = (f"POST {path} HTTP/1.1\r\nHost: {where.netloc}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n")  # fmt: skip
        self.sock.sendall(head.encode() + payload)

    def leave(self) -> None:
        self.sock.close()


def _no_eos(engine: EmbeddedEngine) -> dict[str, float]:
    """A logit bias that keeps the random tiny model from ending early: every request decodes its whole length."""
    return {str(t): -100.0 for t in engine.stop_ids}


@dataclass
class Latency:
    seconds: float
    steps: int  # the engine's decode steps meanwhile


def _short_latency(base_url: str, engine: EmbeddedEngine) -> Latency:
    """How long one short request took, from sending it to its answer (it must generate all its tokens)."""
    body = {
        "model": "tiny",
        "prompt": "The invoice total is",
        "max_tokens": SHORT_TOKENS,
        "temperature": 0,
        "logit_bias": _no_eos(engine),
    }
    steps, started = engine.decode_steps, time.perf_counter()
    answer = httpx.post(f"{base_url}/v1/completions", json=body, timeout=HANG_CAP_S)
    took = Latency(time.perf_counter() - started, engine.decode_steps - steps)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == SHORT_TOKENS
    return took


def _counts(server: ThreadedServer) -> tuple[float, float]:
    """The engine's running and waiting counts, as its ``/metrics`` reports them."""
    text = httpx.get(f"{server.base_url}/metrics").text

    def gauge(name: str) -> float:
        found = re.search(rf'^vllm:{name}{{model_name="tiny"}} (\S+)$', text, re.M)
        assert found is not None, text
        return float(found.group(1))

    return gauge("num_requests_running"), gauge("num_requests_waiting")


@dataclass
class Abort:
    """One aborted sample, as the engine logged it when it left: the decode step its abort was asked at, and the
    step and the time it left at."""

    asked_at_step: int
    left_at_step: int
    left_at: float


class AbortLog(logging.Handler):
    """The engine's "aborted" lines, read as they are written. The engine writes one as each aborted sample leaves
    (``request ... aborted: it left N decode step(s) after the abort``), from its scheduler thread: the only thread
    that counts decode steps, so ``engine.decode_steps`` here is the count the line's N was taken from."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        super().__init__(logging.INFO)
        self.engine = engine
        self.aborts: list[Abort] = []

    def emit(self, record: logging.LogRecord) -> None:
        if found := re.search(r"aborted: it left (\d+) decode step", record.getMessage()):
            now = self.engine.decode_steps
            self.aborts.append(Abort(now - int(found.group(1)), now, time.perf_counter()))


@dataclass
class Round:
    alone: Latency  # a short request alone
    beside: Latency  # the same short request beside the long one
    # from the long request's client leaving: the samples that left the engine, each's steps after its abort; the
    # decode steps to the server asking for the abort (None: it never did), and the decode steps and seconds to the
    # last sample leaving, or to the bound when they had not all left by then
    lags: list[int]
    steps_to_abort: int | None
    steps_after_leaving: int
    seconds_after_leaving: float

    @property
    def steps_ratio(self) -> float:
        return self.beside.steps / self.alone.steps

    @property
    def seconds_ratio(self) -> float:
        return self.beside.seconds / self.alone.seconds


def _round(stack: Stack, base_url: str, stream: bool) -> Round:
    """A short request alone; then one beside a long request whose client then leaves, until every sample of the
    long request has left the engine and its running and waiting counts (its ``/metrics``) are zero again, or
    until LEAVING_STEPS_BOUND decode steps have passed without."""
    engine = stack.engine
    alone = _short_latency(base_url, engine)
    steps = engine.decode_steps
    client = LeavingClient(base_url, "/v1/completions", {
        "model": "tiny", "prompt": "Summarise every invoice of the year", "n": LONG_N, "max_tokens": LONG_TOKENS,
        "temperature": 0, "stream": stream, "logit_bias": _no_eos(engine)})  # fmt: skip
    log = AbortLog(engine)
    logging.getLogger("posttrain.engine").addHandler(log)  # the short requests end without an abort: no lines
    try:
        try:
            wait_for(lambda: engine.metrics.running >= engine.rows_per_request and engine.decode_steps > steps + 3,
                     timeout=HANG_CAP_S, interval=0.005, message="the long request decoding")  # fmt: skip
            assert (
                engine.metrics.running == engine.rows_per_request < engine.config.tier.embedded.max_num_seqs
            )  # its budget
            beside = _short_latency(base_url, engine)
            assert _counts(stack.server) == (engine.rows_per_request, LONG_N - engine.rows_per_request), (
                "the long request changed before its client left"
            )
            assert not log.aborts, "a sample was aborted before its client left"
        finally:
            left_at, left_steps = time.perf_counter(), engine.decode_steps
            client.leave()
        wait_for(lambda: len(log.aborts) == LONG_N or engine.decode_steps - left_steps > LEAVING_STEPS_BOUND,
                 timeout=HANG_CAP_S, interval=0.001, message="the long request's samples to leave the engine")  # fmt: skip
    finally:
        logging.getLogger("posttrain.engine").removeHandler(log)
    gone = list(log.aborts)
    lags = [a.left_at_step - a.asked_at_step for a in gone]
    asked = max((a.asked_at_step - left_steps for a in gone), default=None)
    if len(gone) < LONG_N:  # past the bound: the figures as they stood then
        return Round(alone, beside, lags, asked, engine.decode_steps - left_steps, time.perf_counter() - left_at)
    wait_for(lambda: _counts(stack.server) == (0.0, 0.0), timeout=HANG_CAP_S, interval=0.005,
             message="the engine's running and waiting counts to fall to zero")  # fmt: skip
    last = max(gone, key=lambda a: a.left_at)
    return Round(alone, beside, lags, asked, last.left_at_step - left_steps, last.left_at - left_at)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("entry", ["engine", "gateway"])
def test_a_long_request_neither_starves_a_short_one_nor_outlives_its_client(
    stack: Stack, entry: str, stream: bool, reliability: Reliability, caplog: pytest.LogCaptureFixture
) -> None:
    """ROUNDS rounds, each a short request alone and one beside a long request, then the long request's client
    leaving: alone and beside are measured a fraction of a second apart, so the machine's load weighs on both.
    A round whose long request outlives the bound ends the rounds: the next would run beside it."""
    base = stack.server.base_url if entry == "engine" else stack.gateway.base_url
    caplog.set_level(logging.INFO, logger="posttrain.engine")  # the engine's "aborted" lines, which AbortLog reads
    rounds: list[Round] = []
    while len(rounds) < ROUNDS and all(r.steps_after_leaving <= LEAVING_STEPS_BOUND for r in rounds):
        rounds.append(_round(stack, base, stream))

    lags = [lag for r in rounds for lag in r.lags]
    in_time = [r for r in rounds if r.steps_after_leaving <= LEAVING_STEPS_BOUND]
    leaving = [r.steps_after_leaving for r in rounds]
    asked = [r.steps_to_abort for r in rounds]
    steps_ratio = statistics.median(r.steps_ratio for r in rounds)
    seconds_ratio = statistics.median(r.seconds_ratio for r in rounds)
    reliability.inputs("request_lifetime.client_leaves", tried=len(rounds) * LONG_N,
                       refused_cleanly=sum(lag <= ABORT_STEPS for r in in_time for lag in r.lags), category=CATEGORY,
                       max_steps_after_abort=max(lags, default=None))  # fmt: skip
    reliability.load("request_lifetime.client_leaving", [r.seconds_after_leaving for r in rounds], errors=0,
                     category=CATEGORY, decode_steps={"p50": statistics.median(leaving), "max": max(leaving),
                                                      "bound": LEAVING_STEPS_BOUND},
                     steps_to_abort=asked)  # fmt: skip
    reliability.load(
        "request_lifetime.short_beside_long",
        [r.beside.seconds for r in rounds],
        errors=0,
        category=CATEGORY,
        alone_p50_ms=round(statistics.median(r.alone.seconds for r in rounds) * 1e3, 2),
        steps_ratio=round(steps_ratio, 2),
        steps_bound=STEPS_BOUND,
        seconds_ratio=round(seconds_ratio, 2),
    )
    print(
        f"\nbeside/alone: {steps_ratio:.2f}x in steps {[round(r.steps_ratio, 2) for r in rounds]}, "
        f"{seconds_ratio:.2f}x in seconds {[round(r.seconds_ratio, 2) for r in rounds]}; aborted {len(lags)} "
        f"samples, steps after abort {sorted(set(lags))}; from the client leaving: steps to the abort {asked}, "
        f"to the request gone {leaving}, ms {[round(r.seconds_after_leaving * 1e3, 1) for r in rounds]}"
    )
    assert max(leaving) <= LEAVING_STEPS_BOUND, (
        f"the long request's client left and {max(leaving)} decode steps later {len(rounds[-1].lags)} of its {LONG_N} "
        f"samples had left the engine (the bound: {LEAVING_STEPS_BOUND} steps); "
        + (
            "the server never asked for the abort"
            if rounds[-1].steps_to_abort is None
            else f"the server asked for the abort {rounds[-1].steps_to_abort} steps after the client left"
        )
    )
    assert len(lags) == ROUNDS * LONG_N, f"{len(lags)} of {ROUNDS} long requests' {ROUNDS * LONG_N} samples aborted"
    assert max(lags) <= ABORT_STEPS, lags
    assert steps_ratio <= STEPS_BOUND, rounds
    if entry == "gateway" and not stream:
        assert sum(r.status == CLIENT_CLOSED_REQUEST for r in stack.records) >= ROUNDS
