"""Run an OpenAI-compatible server as a subprocess: start, wait for /health, stream its log, stop.

The command is any argv: ``VllmProfile.to_args()`` (vLLM from its own environment), or the
embedded engine's ``python -m posttrain.platform.serving.server ...``, on a port :func:`free_port` picks.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import httpx

from posttrain.platform.supervise import Supervised

POLL = re.compile(r"\bGET /(?:health|metrics)\b[^\n]*\b200\b")
"""A line an engine's server logs for a health or metrics poll it answered (uvicorn's access log, as the embedded
engine and vLLM write it, and llama-server's request log): the deploy job's own checks and the gateway's, every few
seconds for the deployment's whole life."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` nothing listens on now (the kernel's pick), for a server about to start there."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class LogLines:
    """``on_log`` for a server whose log goes into a job's: every line but the polls it answered (a failed poll is
    kept), which are counted (``polls``) instead."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit, self.polls = emit, 0

    def __call__(self, line: str) -> None:
        if POLL.search(line):
            self.polls += 1
        else:
            self.emit(line)


class LaunchError(RuntimeError):
    """The server exited or never became healthy; the message carries the end of its log."""


class ServerProcess:
    """A server child (:class:`~posttrain.platform.supervise.Supervised`, in a process group of its own so
    :meth:`stop` ends its workers too; SIGKILL when this process dies) that :meth:`start` waits on until
    ``/health`` answers."""

    def __init__(
        self,
        command: list[str],
        base_url: str,
        *,
        env: dict[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        on_log: Callable[[str], None] | None = None,
        cwd: str | None = None,
        die_with_parent: bool = True,
    ) -> None:
        self.command = command
        self.base_url = base_url.rstrip("/")
        self.env = {**os.environ, **(env or {})}
        self.log_path = Path(log_path) if log_path else None
        self.on_log = on_log
        self.cwd = cwd
        self.die_with_parent = die_with_parent
        self.child: Supervised | None = None

    def start(self, timeout_s: float = 600.0, poll_s: float = 0.2) -> ServerProcess:
        self.child = child = Supervised(
            self.command,
            env=self.env,
            cwd=self.cwd,
            log_path=self.log_path,
            on_line=self.on_log,
            own_group=True,
            death_signal=signal.SIGKILL if self.die_with_parent else None,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            code = child.poll()
            if code is not None:
                child.join_output()
                raise LaunchError(
                    f"{self.command[0]} exited with code {code} before becoming healthy; "
                    f"last log lines:\n" + child.last_lines()
                )
            if self.healthy():
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise LaunchError(
                    f"{self.base_url}/health not ready after {timeout_s:.0f}s; last log lines:\n" + child.last_lines()
                )
            time.sleep(poll_s)

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    @property
    def proc(self) -> subprocess.Popen[str] | None:
        return self.child.proc if self.child is not None else None

    @property
    def running(self) -> bool:
        return self.child is not None and self.child.poll() is None

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM the process group, SIGKILL after ``timeout_s``; returns the exit code."""
        return self.child.stop(timeout_s) if self.child is not None else None

    def __enter__(self) -> ServerProcess:
        return self if self.running else self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()
