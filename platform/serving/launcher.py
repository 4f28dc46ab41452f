"""Run an OpenAI-compatible server as a subprocess: start, wait for /health, stream its log, stop.

The command is any argv: ``VllmProfile.to_args()`` on a GPU host, or the
embedded engine's ``python -m posttrain.platform.serving.server ...``.
"""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import httpx


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the launching thread's process dies (Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class LaunchError(RuntimeError):
    """The server exited or never became healthy; the message carries the end of its log."""


class ServerProcess:
    def __init__(
        self, command: list[str], base_url: str, *, env: dict[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None, on_log: Callable[[str], None] | None = None,
        cwd: str | None = None, die_with_parent: bool = True,
    ) -> None:
        self.command = command
        self.base_url = base_url.rstrip("/")
        self.env = {**os.environ, **(env or {})}
        self.log_path = Path(log_path) if log_path else None
        self.on_log = on_log
        self.cwd = cwd
        self.die_with_parent = die_with_parent
        self.tail: collections.deque[str] = collections.deque(maxlen=200)
        self.proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def _read_log(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        log = self.log_path.open("a") if self.log_path else None
        try:
            for line in self.proc.stdout:
                line = line.rstrip("\n")
                self.tail.append(line)
                if log:
                    log.write(line + "\n")
                    log.flush()
                if self.on_log:
                    self.on_log(line)
        finally:
            if log:
                log.close()

    def start(self, timeout_s: float = 600.0, poll_s: float = 0.2) -> ServerProcess:
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env,
            cwd=self.cwd, start_new_session=True,  # own process group: stop() ends its children too
            preexec_fn=_die_with_parent if self.die_with_parent else None,
        )
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                self._reader.join(timeout=5)
                raise LaunchError(f"{self.command[0]} exited with code {code} before becoming healthy; "
                                  f"last log lines:\n" + "\n".join(list(self.tail)[-30:]))
            if self.healthy():
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise LaunchError(f"{self.base_url}/health not ready after {timeout_s:.0f}s; last log lines:\n"
                                  + "\n".join(list(self.tail)[-30:]))
            time.sleep(poll_s)

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM the process group, SIGKILL after ``timeout_s``; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if self._reader:
            self._reader.join(timeout=5)
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self if self.running else self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()
