"""A real local Ray cluster for tests: nodes started with the ``ray`` CLI as children of the test
process, stopped by pid (and by their temp directory), so that no Ray process outlives a module.

    with local_cluster(head_cpus=2, worker_cpus=[1]) as cluster:
        ray.init(address=cluster.address)

Used by test_sandbox_ray.py (a head and a second node) and test_training_ray.py (a head).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from posttrain.platform.engines.launcher import free_port

RAY = str(Path(sys.executable).with_name("ray"))
START_TIMEOUT_S = 120.0


@dataclass
class RayNode:
    proc: subprocess.Popen[bytes]
    log: Path

    def tree(self) -> set[psutil.Process]:
        try:
            root = psutil.Process(self.proc.pid)
            return {root, *root.children(recursive=True)}
        except psutil.Error:
            return set()

    def raylet(self) -> psutil.Process:
        return next(p for p in self.tree() if p.name() == "raylet")

    def node_id(self) -> str:
        args = self.raylet().cmdline()
        return next(a.split("=", 1)[1] for a in args if a.startswith("--node_id="))


@dataclass
class RayCluster:
    address: str
    temp_dir: Path
    head: RayNode
    workers: list[RayNode] = field(default_factory=list)

    @property
    def worker(self) -> RayNode:
        """The first node after the head."""
        return self.workers[0]


def start_node(args: list[str], log: Path, env: dict[str, str]) -> RayNode:
    """``ray start --block`` as our child, so that its daemons are ours to stop (and to reap)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [RAY, "start", "--block", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    node = RayNode(proc, log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while "Ray runtime started" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_nodes([node], None)
            pytest.fail(f"ray start did not come up: {log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)
    return node


def stop_nodes(nodes: list[RayNode], temp_dir: Path | None) -> None:
    """SIGTERM each ``ray start --block`` (it stops its daemons), then kill whatever is left of
    its process tree or still runs from the cluster's temp directory."""
    tracked: set[psutil.Process] = set()
    for node in nodes:
        tracked |= node.tree()
    if temp_dir is not None:
        for proc in psutil.process_iter(["cmdline"]):
            if any(str(temp_dir) in arg for arg in proc.info["cmdline"] or []):
                tracked.add(proc)
                try:
                    tracked |= set(proc.children(recursive=True))
                except psutil.Error:
                    pass
    for node in nodes:
        if node.proc.poll() is None:
            node.proc.send_signal(signal.SIGTERM)
    for node in nodes:
        try:
            node.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            node.proc.kill()
            node.proc.wait(timeout=10)
    _, alive = psutil.wait_procs(list(tracked), timeout=5)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


@contextlib.contextmanager
def local_cluster(
    *,
    head_cpus: int = 2,
    worker_cpus: Sequence[int] = (),
    head_object_store_bytes: int = 100_000_000,
    worker_object_store_bytes: int = 80_000_000,
    env: dict[str, str] | None = None,
) -> Iterator[RayCluster]:
    """A head (and one node per entry of ``worker_cpus``) on 127.0.0.1; ``env`` is added to the
    nodes' environment, which their actors inherit. Asserts at the end that nothing is left. One cluster at a
    time on this machine (a file lock): a head takes fixed ports besides its own, and the suite runs on two
    pytest-xdist workers."""
    with open(Path(tempfile.gettempdir()) / "posttrain-test-ray-cluster.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with _cluster(
            head_cpus=head_cpus,
            worker_cpus=worker_cpus,
            head_object_store_bytes=head_object_store_bytes,
            worker_object_store_bytes=worker_object_store_bytes,
            env=env,
        ) as cluster:
            yield cluster


@contextlib.contextmanager
def _cluster(
    *,
    head_cpus: int,
    worker_cpus: Sequence[int],
    head_object_store_bytes: int,
    worker_object_store_bytes: int,
    env: dict[str, str] | None,
) -> Iterator[RayCluster]:
    temp_dir = Path(tempfile.mkdtemp(prefix="ptray-", dir="/tmp"))  # short: Ray puts sockets in it
    port = free_port()
    node_env = {
        **os.environ,
        "RAY_health_check_period_ms": "1000",  # notice a lost node within seconds
        "RAY_health_check_failure_threshold": "3",
        "RAY_DISABLE_IMPORT_WARNING": "1",
        # a bare local ray.init() elsewhere on this machine turns token auth on and leaves
        # ~/.ray/auth_token behind; this cluster and its clients (below) say explicitly: no auth
        "RAY_AUTH_MODE": "disabled",
        **(env or {}),
    }
    previous_mode = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    common = ["--disable-usage-stats", "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}"]
    nodes: list[RayNode] = []
    try:
        head = start_node(
            [
                "--head",
                f"--port={port}",
                f"--num-cpus={head_cpus}",
                "--include-dashboard=false",
                f"--object-store-memory={head_object_store_bytes}",
                *common,
            ],
            temp_dir / "head.log",
            node_env,
        )
        nodes.append(head)
        for index, cpus in enumerate(worker_cpus):
            nodes.append(
                start_node(
                    [
                        f"--address=127.0.0.1:{port}",
                        f"--num-cpus={cpus}",
                        f"--object-store-memory={worker_object_store_bytes}",
                        *common,
                    ],
                    temp_dir / f"worker{index}.log",
                    node_env,
                )
            )
        yield RayCluster(f"127.0.0.1:{port}", temp_dir, head, nodes[1:])
    finally:
        if previous_mode is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = previous_mode
        stop_nodes(list(reversed(nodes)), temp_dir)
        leftover = [
            p.pid for p in psutil.process_iter(["cmdline"]) if any(str(temp_dir) in a for a in p.info["cmdline"] or [])
        ]
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert leftover == [], f"Ray processes left behind: {leftover}"
