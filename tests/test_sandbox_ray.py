"""Sandbox pools on a real local Ray cluster: a head and a second node started by this module.

Round trips, episode state, status, spreading over nodes, the hostile inputs of
test_sandbox_bad_inputs.py, an actor killed mid-episode and a node lost mid-episode.
The cluster is stopped by pid at the end; no process is left behind.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

pytest.importorskip("ray")

from ray_cluster import RayCluster, free_port, local_cluster, start_node, stop_nodes  # noqa: F401 (others import these from here)
from test_sandbox_bad_inputs import BAD_INPUTS, CONFIG, CONTAINED_WITHIN, HOST_MARKERS, SECRET, BadInput, peer_seconds

from posttrain.platform.sandbox import CallStatus, PoolExhaustedError, SandboxPool, run_agent
from posttrain.platform.sandbox.factory import make_pool
from posttrain.platform.sandbox.ray_backend import RaySandbox, RaySandboxPool
from posttrain.platform.sandbox.sandbox import Sandbox

pytestmark = [
    pytest.mark.slow,
    pytest.mark.requires("bubblewrap"),
]

RAY_CONFIG = CONFIG.model_copy(update={"backend": "ray"})


# ------------------------------------------------------------------ the cluster
@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    # the secret is in the actors' environment: the sandboxes must not see it
    with local_cluster(head_cpus=2, worker_cpus=[1], env={"POSTTRAIN_TEST_SECRET_TOKEN": SECRET}) as made:
        yield made


@pytest.fixture(scope="module")
def pool(cluster: RayCluster, sandbox_dir: Path) -> Iterator[RaySandboxPool]:
    made = make_pool(RAY_CONFIG, sandbox_dir, ray_address=cluster.address)
    assert isinstance(made, RaySandboxPool)
    with made:
        yield made
    # A pool's directory outlives it only when its node or actor died (the node's next pool sweeps it).
    left = [p.name for p in sandbox_dir.joinpath("sandboxes").iterdir() if psutil.pid_exists(int(p.name.split("-")[1]))]
    assert left == [], f"the pools left files behind: {left}"


def run(sandbox: RaySandbox, item: BadInput):  # type: ignore[no-untyped-def]
    return sandbox.run_python(item.code) if item.tool == "python" else sandbox.run_bash(item.code)


def assert_pool_healthy(pool: RaySandboxPool) -> None:
    """Every node's pool full again, each sandbox holding only its zygote and a fresh interpreter."""
    assert pool.wait_ready(30), pool.status()
    status = pool.status()
    assert status.ready == status.size == RAY_CONFIG.pool_size * len(pool.nodes()), status
    for pid in pool.host_pids():  # the cluster runs on this host: its sandboxes are visible here
        assert len(psutil.Process(pid).children(recursive=True)) == 2, "a process outlived its episode"
    for marker in HOST_MARKERS:
        assert not marker.exists(), f"{marker} was written on the host"
    with pool.acquire(timeout=30) as sandbox:
        assert sandbox.run_python("6 * 7").value == "42"
        assert sandbox.run_bash("ls -A /work /tmp | grep -v ':$' | grep . ; true").stdout == ""


# ------------------------------------------------------------------------ tests
def test_make_pool_picks_the_backend(pool: RaySandboxPool, sandbox_dir: Path) -> None:
    assert pool.config.backend == "bwrap"  # what each node runs
    assert len(pool.nodes()) == 2 and pool.size == 2 * RAY_CONFIG.pool_size
    local = make_pool(CONFIG.model_copy(update={"pool_size": 1}), sandbox_dir, ray_address=None)
    with local:
        assert type(local) is SandboxPool
        with local.acquire() as sandbox:
            assert isinstance(sandbox, Sandbox) and sandbox.run_python("1 + 1").value == "2"


def test_round_trip_and_state_within_one_episode(pool: RaySandboxPool) -> None:
    nodes = {n["node_id"] for n in pool.nodes()}
    with pool.acquire() as sandbox:
        assert sandbox.node_id in nodes
        first = sandbox.run_python("import math\nx = 6 * 7\nprint('hello')\nmath.sqrt(x * x)")
        assert first.status is CallStatus.OK and first.stdout == "hello\n" and first.value == "42.0", first
        assert sandbox.run_python("x + 1").value == "43"  # same actor, same sandbox, same interpreter
        assert sandbox.write_file("pkg/data.txt", "line 1\n").value == 7
        assert sandbox.write_file("pkg/data.txt", "line 2\n", append=True).ok
        assert sandbox.read_file("pkg/data.txt").value == "line 1\nline 2\n"
        listed = sandbox.list_dir(".").value
        assert [(e["name"], e["type"]) for e in listed] == [("pkg", "dir")]  # a directory's size is the file system's
        bash = sandbox.run_bash("wc -l < pkg/data.txt; echo oops >&2; exit 3")
        assert bash.status is CallStatus.ERROR and bash.exit_code == 3
        assert bash.stdout == "2\n" and bash.stderr == "oops\n"
        error = sandbox.run_python("1 / 0")
        assert error.status is CallStatus.ERROR and error.error and error.error.type == "ZeroDivisionError"
        assert (sandbox.work_dir / "pkg" / "data.txt").read_text() == "line 1\nline 2\n"  # this host is the node
    for _ in range(2 * pool.size):  # whichever sandbox comes next, nothing of that episode is left
        with pool.acquire() as sandbox:
            assert sandbox.run_python("'x' in globals()").value == "False"
            assert sandbox.list_dir(".").value == []


def scripted(replies: list[str]):  # type: ignore[no-untyped-def]
    turns = iter(replies)
    return lambda messages, tools: next(turns)


def call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def test_agent_episode_through_ray(pool: RaySandboxPool) -> None:
    with pool.acquire() as sandbox:
        episode = run_agent(scripted([call("n = 2 ** 10"), call("n + 1"), "1025"]), sandbox, [])
    assert episode.stop_reason == "answer" and episode.answer == "1025"
    assert [m["content"] for m in episode.messages if m["role"] == "tool"] == ["", "1025"]


def test_acquisitions_spread_over_nodes_least_busy_first(pool: RaySandboxPool) -> None:
    assert pool.wait_ready(30)
    first, second = pool.checkout(), pool.checkout()
    try:
        assert first.node_id != second.node_id  # the idle node is preferred over the half-busy one
        rest = [pool.checkout(), pool.checkout()]
        held = [first, second, *rest]
        assert len({(s.node_id, s.slot) for s in held}) == 4
        started = time.monotonic()
        threading.Event().wait(0.5)  # the peer: a plain wait as long as the timeout
        peer = time.monotonic() - started
        started = time.monotonic()
        with pytest.raises(PoolExhaustedError, match="on 2 node"):
            pool.checkout(timeout=0.5)
        waited = time.monotonic() - started
        assert 0.9 * peer <= waited < 4 * peer, (waited, peer)  # it waits out its timeout on both nodes, then gives up
        busy = pool.status()
        assert busy.busy == 4 and busy.ready == 0
        results: list[str] = []
        freed = threading.Timer(0.5, pool.release, args=(rest.pop(),))
        freed.start()
        with pool.acquire(timeout=20) as waited:  # a waiting acquire gets the sandbox released meanwhile
            results.append(waited.run_python("'late'").value)
        freed.join()
        assert results == ["'late'"]
    finally:
        for sandbox in (first, second, *rest):
            pool.release(sandbox)


def test_status_sums_the_nodes(pool: RaySandboxPool) -> None:
    assert pool.wait_ready(30)
    before = pool.status()
    with pool.acquire() as sandbox:
        for _ in range(5):
            assert sandbox.run_python("1").ok
        during = pool.status()
    assert during.busy == 1 and during.backend == "ray" and during.size == 4
    after = pool.status()
    assert after.calls == before.calls + 5 and after.episodes == before.episodes + 1
    assert after.infra_failures == before.infra_failures
    for key in ("call_p50", "call_p99", "acquire_p50", "node_call_p50"):
        assert after.latency_ms[key] > 0, after.latency_ms
    assert after.latency_ms["call_p50"] >= after.latency_ms["node_call_p50"]  # Ray adds to the node's time


def test_round_trip_latency_ray_vs_local(
    pool: RaySandboxPool, sandbox_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    """The figure for the report: one small call, through Ray and locally, in the same run, beside its peer: a bare
    Ray round trip to the same node's actor, taken in turn with the calls so both meet the same load."""

    import ray

    def timed(call: Callable[[], object]) -> float:
        started = time.perf_counter()
        call()
        return (time.perf_counter() - started) * 1000

    with SandboxPool(CONFIG.model_copy(update={"pool_size": 1}), data_dir=sandbox_dir) as local:
        with local.acquire() as sandbox:
            local_ms = sorted(timed(lambda: sandbox.run_python("1 + 1")) for _ in range(60))
    ray_ms, hop_ms = [], []
    with pool.acquire() as sandbox:
        for i in range(60):
            ray_ms.append(timed(lambda: sandbox.run_python(f"{i} + 1")))
            hop_ms.append(timed(lambda: ray.get(sandbox._member.actor.info.remote())))
    ray_ms.sort()
    hop_ms.sort()
    figure = {
        "figure": "sandbox_call_round_trip_ms",
        "ray_p50": round(ray_ms[len(ray_ms) // 2], 2),
        "ray_p90": round(ray_ms[int(len(ray_ms) * 0.9)], 2),
        "local_p50": round(local_ms[len(local_ms) // 2], 2),
        "local_p90": round(local_ms[int(len(local_ms) * 0.9)], 2),
        "ray_hop_p50": round(hop_ms[len(hop_ms) // 2], 2),
    }
    with capsys.disabled():
        print("\n" + json.dumps(figure))
    # Ray adds its hop to the local call and nothing more. Against the local call alone the ratio grew with the
    # machine's load (8x quiet, 46x with the suite and a benchmark on 2 cores): the hop is scheduled across processes,
    # the local call is one socket exchange. Against the hop measured in turn with it, the bound holds under load.
    assert figure["local_p50"] < figure["ray_p50"] < 4 * (figure["ray_hop_p50"] + figure["local_p50"]), figure


@pytest.mark.parametrize("item", BAD_INPUTS, ids=[b.name for b in BAD_INPUTS])
def test_bad_input_is_classified_and_contained(pool: RaySandboxPool, item: BadInput) -> None:
    with pool.acquire() as sandbox:
        peer = peer_seconds(sandbox)  # through Ray too: Ray's share is in both
        started = time.monotonic()
        result = run(sandbox, item)
        took = time.monotonic() - started
        assert took < CONTAINED_WITHIN * peer, (item.name, took, peer)
        assert result.status in item.expected, result
        assert not result.is_infrastructure_failure
        if result.status is CallStatus.OUTPUT_TRUNCATED:
            assert result.truncated and len(result.stdout) <= CONFIG.output_limit_bytes
        assert sandbox.run_python("'alive'").value == "'alive'"  # the episode goes on
    assert_pool_healthy(pool)


def test_the_host_loopback_is_out_of_reach(pool: RaySandboxPool) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        port = server.getsockname()[1]
        with pool.acquire() as sandbox:
            result = sandbox.run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=0.5)")
            assert result.status is CallStatus.ERROR and result.error
            assert result.error.type == "ConnectionRefusedError"
        with pytest.raises(BlockingIOError):
            server.accept()


def test_the_nodes_environment_is_invisible(pool: RaySandboxPool) -> None:
    actor_pid = pool.nodes()[0]["pid"]
    assert SECRET.encode() in Path(f"/proc/{actor_pid}/environ").read_bytes()  # the node's side has it
    with pool.acquire() as sandbox:
        env = sandbox.run_python("import os\ndict(os.environ)")
        procs = sandbox.run_bash("cat /proc/*/environ /proc/*/cmdline | tr '\\0' '\\n'; env")
        home = sandbox.run_bash("ls /root /home 2>&1; cat /proc/1/environ")
    for result in (env, procs, home):
        text = result.to_message_content()
        assert SECRET not in text and "POSTTRAIN_TEST_SECRET_TOKEN" not in text
    assert "PATH" in str(env.value)


def test_writes_outside_the_work_directory_stay_inside(pool: RaySandboxPool) -> None:
    with pool.acquire() as sandbox:
        assert sandbox.write_file("../posttrain-evil", "x").status is CallStatus.ERROR
        assert sandbox.write_file("/tmp/posttrain-evil", "x").status is CallStatus.ERROR
        assert sandbox.run_bash("echo x > /tmp/posttrain-evil").ok
    assert not Path("/tmp/posttrain-evil").exists()
    assert_pool_healthy(pool)


def test_killed_actor_is_an_infrastructure_failure_and_restarts(pool: RaySandboxPool) -> None:
    assert pool.wait_ready(30)
    before = pool.status()
    with pool.acquire() as sandbox:
        assert sandbox.run_python("x = 1").ok
        info = next(n for n in pool.nodes() if n["node_id"] == sandbox.node_id)
        actor = psutil.Process(info["pid"])
        doomed = actor.children(recursive=True)  # its sandboxes
        assert doomed
        actor.kill()
        result = sandbox.run_python("x")
        assert result.status is CallStatus.INFRA and result.is_infrastructure_failure, result
        assert "died" in result.detail or "unknown" in result.detail, result.detail
        assert sandbox.run_python("1").status is CallStatus.INFRA  # the rest of the episode too
        episode = run_agent(scripted([call("1"), "never"]), sandbox, [])
        assert episode.stop_reason == "infrastructure_failure" and episode.infrastructure_failure
    _, alive = psutil.wait_procs(doomed, timeout=10)
    assert alive == [], "sandboxes outlived their actor"
    # The actor restarts and the pool serves the next episodes, from a clean slate.
    for _ in range(pool.size):
        with pool.acquire(timeout=60) as sandbox:
            assert sandbox.run_python("'x' in globals()").value == "False"
    restarted = next(n for n in pool.nodes() if n["node_id"] == info["node_id"])
    assert restarted["restarted"] and restarted["pid"] != info["pid"]
    status = pool.status()
    assert status.infra_failures >= before.infra_failures + 3 and status.failures > before.failures
    assert "died" in status.last_error
    assert_pool_healthy(pool)


def test_lost_node_is_an_infrastructure_failure_and_the_rest_serve(cluster: RayCluster, pool: RaySandboxPool) -> None:
    """Runs last: it takes the second node away for good."""
    import ray

    assert pool.wait_ready(30)
    lost_node = cluster.worker.node_id()
    healthy = []  # the peer: acquisitions and a call while both nodes are up
    for _ in range(4):
        started = time.monotonic()
        with pool.acquire(timeout=30) as sandbox:
            assert sandbox.run_python("2 + 2").value == "4"
        healthy.append(time.monotonic() - started)
    held = [pool.checkout()]
    while len({s.node_id for s in held}) < 2:  # one episode on each node
        held.append(pool.checkout(timeout=10))
    try:
        doomed = next(s for s in held if s.node_id == lost_node)
        kept = next(s for s in held if s.node_id != lost_node)
        assert doomed.run_python("y = 2").ok and kept.run_python("y = 3").ok
        node_processes = cluster.worker.tree()
        for proc in node_processes:  # the node crashes: raylet, workers, the actor, its sandboxes
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(list(node_processes), timeout=10)
        result = doomed.run_python("y")
        assert result.status is CallStatus.INFRA, result
        assert kept.run_python("y").value == "3"  # the other node's episode is untouched
    finally:
        for sandbox in held:
            pool.release(sandbox)
    deadline = time.monotonic() + 60
    while any(n["NodeID"] == lost_node and n["Alive"] for n in ray.nodes()):
        assert time.monotonic() < deadline, "Ray did not notice the lost node"
        time.sleep(0.5)
    after = []
    for _ in range(4):  # acquisitions go to the node that is left, without waiting on the lost one
        started = time.monotonic()
        with pool.acquire(timeout=30) as sandbox:
            assert sandbox.node_id != lost_node and sandbox.run_python("2 + 2").value == "4"
        after.append(time.monotonic() - started)
    # As quick as with both nodes up (measured: 7 ms against 9 ms each): no wait on a call to the lost
    # node, which would take seconds. Summed over four, so one scheduling hiccup on a busy box is no failure.
    assert sum(after) < 30 * sum(healthy), (after, healthy)
    pool.refresh()
    assert [n["node_id"] for n in pool.nodes()] == [kept.node_id]
    assert pool.wait_ready(30)
    status = pool.status()
    assert status.size == status.ready == RAY_CONFIG.pool_size, status
    assert status.infra_failures >= 1 and status.failures >= 1
