"""The one process supervisor: commands and Python workers die with whoever started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from posttrain.platform.supervise import Supervised


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


PARENT = textwrap.dedent("""
    import sys, time
    from posttrain.platform.supervise import clean_context, start_worker, worker_context

    if __name__ == "__main__":
        context = {"forkserver": worker_context, "spawn": clean_context}[sys.argv[1]]()
        workers = [start_worker(context, time.sleep, (600,), name=f"sleeper-{i}") for i in range(2)]
        print(" ".join(str(w.pid) for w in workers), flush=True)
        time.sleep(600)
""")


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_workers_die_with_a_parent_killed_with_sigkill(tmp_path: Path, method: str) -> None:
    """SIGKILL leaves no chance for atexit or daemon clean-up: the workers' own watch ends them."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), method], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
        parent.kill()
        parent.wait(timeout=10)
        assert all(_gone(pid, 15) for pid in pids), [p for p in pids if psutil.pid_exists(p)]
    finally:
        parent.kill()


def test_a_supervised_command_is_stopped_with_its_group_and_keeps_its_tail(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    lines: list[str] = []
    child = Supervised(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            "print('ready', flush=True)\ntime.sleep(600)",
        ],
        log_path=log,
        on_line=lines.append,
        own_group=True,
    )
    deadline = time.monotonic() + 30
    while "ready" not in lines and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchildren = psutil.Process(child.pid).children()
    assert lines == ["ready"] and len(grandchildren) == 1
    assert child.stop(grace_s=5) == -signal.SIGTERM
    assert _gone(grandchildren[0].pid, 10), "the command's own child outlived the group's stop"
    assert child.last_lines() == "ready" and log.read_text() == "ready\n"


def test_a_supervised_command_gets_its_death_signal_when_the_starter_dies(tmp_path: Path) -> None:
    script = tmp_path / "starter.py"
    script.write_text(
        "import signal, sys, time\nfrom posttrain.platform.supervise import Supervised\n"
        "child = Supervised([sys.executable, '-c', 'import time; time.sleep(600)'], death_signal=signal.SIGKILL)\n"
        "print(child.pid, flush=True)\ntime.sleep(600)\n"
    )
    starter = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=os.environ)
    try:
        assert starter.stdout is not None
        pid = int(starter.stdout.readline())
        starter.kill()
        starter.wait(timeout=10)
        assert _gone(pid, 10)
    finally:
        starter.kill()
