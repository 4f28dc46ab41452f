"""Child processes, started and supervised one way: the job runner's torchrun, serving launches, jobs.

    child = Supervised(["torchrun", ...], on_line=print, log_path="run.log", own_group=True)
    child.wait(timeout=5)        # None while it runs
    child.stop(grace_s=15)       # SIGTERM (its process group, with own_group), SIGKILL after the grace
    child.tail                   # its last output lines, for an error message

- every child gets SIGTERM or SIGKILL when the process that started it dies (``PR_SET_PDEATHSIG``,
  set before exec by :func:`death_signal_preexec`, or in a forked child by :func:`die_with_parent`);
- stdout and stderr arrive as one stream of lines on a reader thread, go to a log file and/or a
  callback, and the last ``tail_lines`` are kept;
- stopping is SIGTERM, a grace period, then SIGKILL.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return None


def death_signal_preexec(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get ``sig`` when its parent dies (libc resolved here, before the fork)."""
    prctl = _prctl()
    if prctl is None:  # pragma: no cover - not Linux
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, sig)  # type: ignore[misc]


def die_with_parent(sig: int = signal.SIGTERM, parent: int | None = None) -> bool:
    """In a started child: get ``sig`` when the parent dies. False when the parent (``parent``, else the
    current one) is already gone, so the caller can exit at once."""
    expected = parent if parent is not None else os.getppid()
    prctl = _prctl()
    if prctl is not None:
        with contextlib.suppress(OSError):
            prctl(PR_SET_PDEATHSIG, sig)
    return os.getppid() == expected and expected != 1


class Supervised:
    """A started child process whose output lines are pumped to ``log_path`` and ``on_line``.

    ``own_group``: the child leads a new session, and :meth:`stop` signals its whole process group
    (a server's workers end with it); else it stays in ours (a job's cancel reaches it too).
    ``death_signal``: what it gets when this process dies."""

    def __init__(self, command: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
                 log_path: str | os.PathLike[str] | None = None, on_line: Callable[[str], None] | None = None,
                 own_group: bool = False, death_signal: int | None = signal.SIGTERM, tail_lines: int = 200) -> None:
        self.command = command
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._own_group = own_group
        self._log = Path(log_path) if log_path else None
        self._on_line = on_line
        if self._log is not None:
            self._log.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(  # noqa: PLW1509 - the preexec_fn only calls prctl
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="replace", env=env, cwd=cwd, start_new_session=own_group,
            preexec_fn=death_signal_preexec(death_signal) if death_signal is not None else None)
        self._reader = threading.Thread(target=self._pump, name=f"output-of-{Path(command[0]).name}", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        log = self._log.open("a") if self._log is not None else None
        try:
            for raw in self.proc.stdout:
                line = raw.rstrip("\n")
                self.tail.append(line)
                with contextlib.suppress(Exception):  # a sink that fails must not stop the pump
                    if log is not None:
                        log.write(line + "\n")
                        log.flush()
                    if self._on_line is not None:
                        self._on_line(line)
        finally:
            if log is not None:
                log.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def last_lines(self, n: int = 30) -> str:
        return "\n".join(list(self.tail)[-n:])

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self._own_group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)

    def stop(self, grace_s: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace_s``; waits for the output to drain; the exit code."""
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.join_output()
        return self.proc.returncode

    def join_output(self, timeout_s: float = 5.0) -> None:
        self._reader.join(timeout=timeout_s)
