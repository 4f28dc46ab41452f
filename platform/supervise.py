"""Child processes, started and supervised one way: commands (torchrun, serving engines, sandboxes)
and Python worker processes (rollout, verifier and preprocessing workers).

    child = Supervised(["torchrun", ...], on_line=print, log_path="run.log", own_group=True)
    child.wait(timeout=5)        # None while it runs
    child.stop(grace_s=15)       # SIGTERM (its process group, with own_group), SIGKILL after the grace
    child.tail                   # its last output lines, for an error message

    context = worker_context("posttrain.training.rollouts.process")   # forkserver, that module preloaded
    process = start_worker(context, worker_main, (conn, ...), name="posttrain-rollout-0")

- every child gets SIGTERM or SIGKILL when the process that started it dies (``PR_SET_PDEATHSIG``,
  set before exec by :func:`death_signal_preexec`, or in a forked child by :func:`die_with_parent`;
  a worker started by :func:`start_worker` watches its parent);
- stdout and stderr arrive as one stream of lines on a reader thread, go to a log file and/or a
  callback, and the last ``tail_lines`` are kept;
- stopping is SIGTERM, a grace period, then SIGKILL.

Start methods, one each for one reason: a job is ``os.fork`` of the single-threaded job worker
(it shares the worker's frozen objects); Python workers come from a fork server
(:func:`worker_context`: safe beside threads, and the heavy imports are paid once in the server;
preprocessing forks its caller directly when that runs one thread);
verifier workers are ``spawn`` (:func:`clean_context`), a fresh interpreter, so the address-space
limit they set bounds the check and not libraries the server preloaded; commands are ``Popen``.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return None


def death_signal_preexec(sig: int = signal.SIGTERM) -> Callable[[], object] | None:
    """A ``preexec_fn`` that makes the child get ``sig`` when its parent dies (libc resolved here, before the fork)."""
    prctl = _prctl()
    if prctl is None:  # pragma: no cover - not Linux
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, sig)


def child_setup(death_signal: int | None, cgroup_procs: Sequence[int] = ()) -> Callable[[], object] | None:
    """A ``preexec_fn``: join the cgroups whose ``cgroup.procs`` files are open as ``cgroup_procs`` (so the
    child and all it starts are inside before it executes), then ask for ``death_signal`` when the parent dies."""
    die = death_signal_preexec(death_signal) if death_signal is not None else None
    if not cgroup_procs:
        return die
    fds = tuple(cgroup_procs)

    def setup() -> None:
        for fd in fds:
            os.write(fd, b"0")
        if die is not None:
            die()

    return setup


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
    ``death_signal``: what it gets when this process dies. ``pass_fds``: descriptors it inherits;
    ``run_as``: the (uid, gid) it runs as, with no supplementary groups; ``cgroup_procs``: open ``cgroup.procs``
    files of the cgroups it joins before it executes."""

    def __init__(
        self,
        command: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        log_path: str | os.PathLike[str] | None = None,
        on_line: Callable[[str], None] | None = None,
        own_group: bool = False,
        death_signal: int | None = signal.SIGTERM,
        tail_lines: int = 200,
        pass_fds: Sequence[int] = (),
        run_as: tuple[int, int] | None = None,
        cgroup_procs: Sequence[int] = (),
    ) -> None:
        self.command = command
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._own_group = own_group
        self._log = Path(log_path) if log_path else None
        self._on_line = on_line
        if self._log is not None:
            self._log.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(  # noqa: PLW1509 - the preexec_fn only calls prctl
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=env,
            cwd=cwd,
            start_new_session=own_group,
            pass_fds=tuple(pass_fds),
            user=run_as[0] if run_as else None,
            group=run_as[1] if run_as else None,
            extra_groups=[] if run_as else None,
            preexec_fn=child_setup(death_signal, cgroup_procs),
        )
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

    def kill(self, timeout_s: float = 10.0) -> int | None:
        """SIGKILL at once (its process group, with own_group); the exit code, None if it outlives ``timeout_s``."""
        if self.proc.poll() is None:
            self._signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout_s)
        return self.proc.returncode

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


# ------------------------------------------------------------------ Python worker processes

_preload: set[str] = set()
_main_lock = threading.Lock()


def worker_context(*preload: str) -> BaseContext:
    """The start method of Python worker processes: a fork server that has imported ``preload``
    (with what earlier callers asked for; it takes effect when the server starts, at the first
    worker), so each worker forks from it in milliseconds; ``spawn`` where there is no fork server."""
    try:
        context = multiprocessing.get_context("forkserver")
    except ValueError:  # pragma: no cover - platforms without forkserver
        return multiprocessing.get_context("spawn")
    _preload.update(preload)
    context.set_forkserver_preload(sorted(_preload))
    return context


def clean_context() -> BaseContext:
    """A fresh interpreter per worker (``spawn``): for workers whose limits must measure only their own work."""
    return multiprocessing.get_context("spawn")


@contextlib.contextmanager
def neutral_main() -> Iterator[None]:
    """While active, ``__main__`` is an empty module, so a started worker imports nothing of the
    parent's script (Streamlit swaps ``__main__`` for the page being run, which spawn and the fork
    server would otherwise run again in every worker)."""
    with _main_lock:
        main = sys.modules.get("__main__")
        script = getattr(main, "__file__", None) and getattr(getattr(main, "__spec__", None), "name", None) is None
        if script:
            sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if script and main is not None:
                sys.modules["__main__"] = main


def _watch_parent(parent: Any, death_signal: int) -> None:
    parent.join()  # returns when the process that started us is gone (its end of our pipe closed)
    os.kill(os.getpid(), death_signal)


def _worker_entry(target: Callable[..., Any], death_signal: int, *args: Any) -> None:
    # The parent's sentinel, not PR_SET_PDEATHSIG: that fires when the parent *thread* ends (workers
    # are started from whichever thread first needs one, a console page's script thread), and a fork
    # server's child would watch the server, which outlives the caller while any child runs.
    parent = multiprocessing.parent_process()
    if parent is not None:
        if not parent.is_alive():
            return
        threading.Thread(
            target=_watch_parent, args=(parent, death_signal), name="posttrain-watch-parent", daemon=True
        ).start()
    target(*args)


def start_worker(
    context: BaseContext,
    target: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    name: str,
    death_signal: int = signal.SIGKILL,
) -> Any:
    """Start ``target(*args)`` as a daemon worker process of ``context``, which gets ``death_signal``
    as soon as the process that started it dies, even of SIGKILL; returns the started process (keep
    it: dropping it closes the pipe the worker watches)."""
    process = context.Process(target=_worker_entry, args=(target, death_signal, *args), name=name, daemon=True)  # type: ignore[attr-defined]
    with neutral_main():
        process.start()
    return process
