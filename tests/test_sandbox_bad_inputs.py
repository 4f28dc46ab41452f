"""Hostile model output, one test each: classified, the host untouched, the pool still serving.

Also ``test_two_hundred_episodes_with_bad_inputs_mixed_in``: the acceptance soak run.
"""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from posttrain.platform.sandbox import CallStatus, Sandbox, SandboxConfig, SandboxPool, ToolResult

pytestmark = pytest.mark.requires("bubblewrap")

SECRET = "posttrain-test-secret-7f3a9c"
HOST_MARKERS = [Path("/tmp/posttrain-evil"), Path("/posttrain-evil"), Path("/etc/posttrain-evil")]
CONFIG = SandboxConfig(pool_size=2, call_timeout_s=1.0, kill_grace_s=0.5, file_size_mb=8, max_processes=48)


@dataclass(frozen=True)
class BadInput:
    name: str
    tool: str  # "python" or "bash"
    code: str
    expected: frozenset[CallStatus]


def bad(name: str, tool: str, code: str, *expected: CallStatus) -> BadInput:
    return BadInput(name, tool, code, frozenset(expected))


TIMEOUT, ERROR, OK = CallStatus.TIMEOUT, CallStatus.ERROR, CallStatus.OK

BAD_INPUTS = [
    bad("fork bomb (python)", "python", "import os\nwhile True:\n    os.fork()", ERROR, TIMEOUT),
    bad("fork bomb (bash)", "bash", ":(){ :|:& };:\nsleep 0.5", OK, ERROR, TIMEOUT),
    bad("allocate 10 GB", "python", "x = bytearray(10 * 1024 ** 3)", CallStatus.MEMORY),
    bad("allocate 10 GB (bash)", "bash", "python3 -c 'x = b\" \" * (10 * 1024 ** 3)'", ERROR),
    bad("busy loop", "python", "while True: pass", TIMEOUT),
    bad(
        "busy loop ignoring the alarm",
        "python",
        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True: pass",
        TIMEOUT,
    ),
    bad("sleep forever", "python", "import time\ntime.sleep(10 ** 9)", TIMEOUT),
    bad("read stdin forever (python)", "python", "import sys\nsys.stdin.read()", OK),
    bad("read stdin forever (input)", "python", "input()", ERROR),
    bad("read stdin forever (bash)", "bash", "cat; read line", OK, ERROR),
    bad(
        "socket to an outside address",
        "python",
        "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=0.5)",
        ERROR,
    ),
    bad("write outside the work directory", "python", "open('/etc/posttrain-evil', 'w').write('x')", ERROR),
    bad(
        "write outside the work directory (bash)",
        "bash",
        "echo x > /posttrain-evil; echo x > /work/../posttrain-evil; echo x > /etc/posttrain-evil",
        ERROR,
    ),
    bad("print gigabytes", "python", "while True:\n    print('x' * 10 ** 6)", CallStatus.OUTPUT_TRUNCATED),
    bad("print gigabytes (bash)", "bash", "yes", CallStatus.OUTPUT_TRUNCATED),
    bad(
        "setsid daemon",
        "bash",
        "setsid sh -c 'while true; do date >> /work/daemon.log; sleep 0.05; done' > /dev/null 2>&1 &",
        OK,
    ),
    bad(
        "double-fork daemon",
        "python",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        while True: time.sleep(1)\n    os._exit(0)\nos.wait()",
        OK,
    ),
    bad(
        "ignore SIGTERM",
        "python",
        "import signal, time\nfor s in (signal.SIGTERM, signal.SIGALRM, signal.SIGINT):\n"
        "    signal.signal(s, signal.SIG_IGN)\ntime.sleep(10 ** 9)",
        TIMEOUT,
    ),
    bad(
        "kill the parent",
        "python",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(1, signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)",
        OK,
        ERROR,
    ),
    bad("kill the interpreter from bash", "bash", "kill -9 $PPID", CallStatus.KILLED),
    bad("exit the interpreter", "python", "import os\nos._exit(7)", CallStatus.KILLED),
    bad(
        "CPU limit",
        "python",
        "import resource, signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_CPU, (0, resource.getrlimit(resource.RLIMIT_CPU)[1]))\nwhile True: pass",
        TIMEOUT,
    ),
]


def run(sandbox: Sandbox, item: BadInput) -> ToolResult:
    if item.tool == "python":
        return sandbox.run_python(item.code)
    return sandbox.run_bash(item.code)


# How long a bad input may take is judged against a peer measured in the same sandbox just before:
# the plainest call cut off at the call timeout (a sleep). The worst bad inputs (a busy loop that
# ignores the alarm, one that ignores SIGTERM) add the kill grace and a fresh interpreter: 1.4-1.6x
# the peer measured, quiet or with every core busy, locally and through Ray.
PEER_CODE = "import time\ntime.sleep(10 ** 9)"
CONTAINED_WITHIN = 3.0


def peer_seconds(sandbox: Any) -> float:
    """Seconds one call cut off at the call timeout takes in ``sandbox`` (a local or a Ray sandbox)."""
    started = time.monotonic()
    result = sandbox.run_python(PEER_CODE)
    took = time.monotonic() - started
    assert result.status is CallStatus.TIMEOUT, result
    assert sandbox.run_python("'alive'").value == "'alive'"
    return took


@pytest.fixture(scope="module")
def secret_env() -> Iterator[None]:
    os.environ["POSTTRAIN_TEST_SECRET_TOKEN"] = SECRET
    yield
    del os.environ["POSTTRAIN_TEST_SECRET_TOKEN"]


@pytest.fixture(scope="module")
def pool(secret_env: None, sandbox_dir: Path) -> Iterator[SandboxPool]:
    with SandboxPool(CONFIG, data_dir=sandbox_dir) as pool:
        yield pool


def assert_pool_healthy(pool: SandboxPool) -> None:
    """Full size again, every sandbox holding only its zygote and a fresh interpreter."""
    assert pool.wait_ready(30), pool.status()
    status = pool.status()
    assert status.ready == status.size == CONFIG.pool_size, status
    for pid in pool.host_pids():
        assert len(psutil.Process(pid).children(recursive=True)) == 2, "a process outlived its episode"
    for marker in HOST_MARKERS:
        assert not marker.exists(), f"{marker} was written on the host"
    with pool.acquire(timeout=10) as sandbox:
        assert sandbox.run_python("6 * 7").value == "42"
        assert sandbox.run_bash("ls -A /work /tmp | grep -v ':$' | grep . ; true").stdout == ""


@pytest.mark.parametrize("item", BAD_INPUTS, ids=[b.name for b in BAD_INPUTS])
def test_bad_input_is_classified_and_contained(pool: SandboxPool, item: BadInput) -> None:
    with pool.acquire() as sandbox:
        peer = peer_seconds(sandbox)
        started = time.monotonic()
        result = run(sandbox, item)
        took = time.monotonic() - started
        assert took < CONTAINED_WITHIN * peer, (item.name, took, peer)
        assert result.status in item.expected, result
        assert not result.is_infrastructure_failure
        if result.status is CallStatus.OUTPUT_TRUNCATED:
            assert result.truncated and len(result.stdout) <= CONFIG.output_limit_bytes
        # The episode goes on: the sandbox answers the next call.
        assert sandbox.run_python("'alive'").value == "'alive'"
    assert_pool_healthy(pool)


def test_the_host_loopback_is_out_of_reach(pool: SandboxPool) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        port = server.getsockname()[1]
        with pool.acquire() as sandbox:
            result = sandbox.run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=0.5)")
            assert result.status is CallStatus.ERROR and result.error
            assert result.error.type == "ConnectionRefusedError"
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing ever connected


def test_the_host_environment_is_invisible(pool: SandboxPool) -> None:
    assert os.environ["POSTTRAIN_TEST_SECRET_TOKEN"] == SECRET
    with pool.acquire() as sandbox:
        env = sandbox.run_python("import os\ndict(os.environ)")
        procs = sandbox.run_bash("cat /proc/*/environ /proc/*/cmdline | tr '\\0' '\\n'; env")
        home = sandbox.run_bash("ls /root /home 2>&1; cat /proc/1/environ")
    for result in (env, procs, home):
        text = result.to_message_content()
        assert SECRET not in text and "POSTTRAIN_TEST_SECRET_TOKEN" not in text
    assert "PATH" in str(env.value)


def test_writes_outside_the_work_directory_stay_inside(pool: SandboxPool) -> None:
    with pool.acquire() as sandbox:
        assert sandbox.write_file("../posttrain-evil", "x").status is CallStatus.ERROR
        assert sandbox.write_file("/tmp/posttrain-evil", "x").status is CallStatus.ERROR  # tool: work dir only
        assert sandbox.run_bash("echo x > /tmp/posttrain-evil").ok  # the sandbox's private /tmp
        assert sandbox.run_bash("test -f /tmp/posttrain-evil").ok
    assert not Path("/tmp/posttrain-evil").exists()
    assert_pool_healthy(pool)


@pytest.mark.slow
def test_two_hundred_episodes_with_bad_inputs_mixed_in(secret_env: None, sandbox_dir: Path) -> None:
    rng = random.Random(4)
    schedule = [None] * (200 - len(BAD_INPUTS)) + list(BAD_INPUTS)
    rng.shuffle(schedule)
    root = sandbox_dir / "soak"
    tracked: set[psutil.Process] = set()
    counts: dict[str, int] = {}
    with SandboxPool(CONFIG.model_copy(update={"root_dir": root}), data_dir=None) as pool:
        for n, item in enumerate(schedule):
            with pool.acquire(timeout=30) as sandbox:
                if item is None:  # an ordinary multi-turn episode
                    assert sandbox.write_file("sol.py", f"def f(x):\n    return x + {n}\n").ok
                    assert sandbox.run_python("from sol import f\nf(1)").value == str(n + 1)
                    test = sandbox.run_bash(f"python3 -c 'from sol import f; assert f(0) == {n}' && echo pass")
                    assert test.ok and test.stdout == "pass\n", test
                    status = "normal"
                else:
                    result = run(sandbox, item)
                    assert result.status in item.expected, (item.name, result)
                    status = result.status.value
                counts[status] = counts.get(status, 0) + 1
            for pid in pool.host_pids():
                outer = psutil.Process(pid)
                tracked |= {outer, *outer.children(recursive=True)}
        assert_pool_healthy(pool)
        status = pool.status()
        assert status.episodes >= 200 and status.infra_failures == 0 and status.failures == 0
        assert [p.name for p in root.iterdir() if not p.name.startswith("pool-")] == []
    assert counts["normal"] == 200 - len(BAD_INPUTS)
    psutil.wait_procs(list(tracked), timeout=5)
    assert [p for p in tracked if p.is_running()] == []  # no leaked process
    assert list(root.iterdir()) == []  # nothing left in the sandboxes' directory
    for marker in HOST_MARKERS:
        assert not marker.exists()
