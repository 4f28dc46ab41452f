"""One sandbox: a running zygote plus its current episode, driven from the host.

A ``Sandbox`` is normally obtained from ``SandboxPool.acquire()``; while held,
its tool methods run in the episode's interpreter, so Python globals and
files persist from call to call. Every method returns a ``ToolResult`` and
never raises for anything the model's code does.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from posttrain.platform.sandbox import _wire as wire
from posttrain.platform.sandbox import seccomp, workdir
from posttrain.platform.sandbox.backends import launch_spec, run_as
from posttrain.platform.sandbox.cgroups import SandboxCgroup
from posttrain.platform.sandbox.limits import confinement
from posttrain.platform.sandbox.result import (
    CallError,
    CallStatus,
    ToolMethods,
    ToolResult,
    infra_failure,
)
from posttrain.platform.settings.sandbox import SandboxConfig
from posttrain.platform.supervise import Supervised

RESET_TIMEOUT_S = 15.0
RESTARTED = "the interpreter was restarted: variables from earlier calls are lost, files in the work directory are kept"
SIGNAL_STATUS = {9: CallStatus.KILLED, 24: CallStatus.TIMEOUT}  # SIGKILL, SIGXCPU


def _force_remove(func: Callable[..., Any], path: str, exc_info: object) -> None:
    """rmtree helper: model code may have removed write permission from its directories."""
    if not os.path.exists(path):
        return
    try:
        os.chmod(os.path.dirname(path), 0o700)
        os.chmod(path, 0o700)
        func(path)
    except OSError:
        pass


class SandboxStartError(RuntimeError):
    """A sandbox process did not come up; the message carries its log."""


class Sandbox(ToolMethods):
    """Host side of one sandbox slot."""

    def __init__(
        self,
        config: SandboxConfig,
        slot: int,
        slot_dir: Path,
        server: Path,
        on_call: Callable[[Sandbox, ToolResult], None] | None = None,
    ) -> None:
        self.config = config
        self.slot = slot
        self.slot_dir = slot_dir
        self._server = server
        self._on_call = on_call
        self._child: Supervised | None = None
        self._ctrl: socket.socket | None = None
        self._data: socket.socket | None = None
        self._next_id = 0
        self._episode_pid = 0
        self._cgroup: SandboxCgroup | None = None  # this start's memory and process budget
        self._oom_seen = 0  # OOM kills in the cgroup already accounted for
        self._work_mounted = False
        self.alive = False
        self.work_dir = slot_dir / "work"

    # ------------------------------------------------------------------ life
    def start(self) -> None:
        """Start the zygote and its first episode; raises SandboxStartError."""
        self.close()
        self.slot_dir.mkdir(parents=True, exist_ok=True)
        for sub in ("work", "tmp"):  # a restarted sandbox starts as empty as a new one
            shutil.rmtree(self.slot_dir / sub, onerror=_force_remove)
            (self.slot_dir / sub).mkdir()
        ctrl_host, ctrl_box = socket.socketpair()
        data_host, data_box = socket.socketpair()
        self._ctrl, self._data = ctrl_host, data_host
        try:
            self._launch(ctrl_box.fileno(), data_box.fileno())
        except (OSError, subprocess.SubprocessError) as exc:
            self.close()
            raise SandboxStartError(
                f"sandbox {self.slot} ({self.config.backend}) could not be launched: {exc}"
            ) from exc
        finally:
            ctrl_box.close()
            data_box.close()
        try:
            msg = self._recv_ctrl(self.config.start_timeout_s)
        except (OSError, ValueError) as exc:
            msg = None
            reason = str(exc)
        else:
            reason = "it exited" if msg is None else f"unexpected message {msg}"
        if msg is None or msg.get("event") != "ready":
            child = self._child
            self.close()  # its output drained, so the log below ends where it did
            log = child.last_lines() if child is not None else ""
            raise SandboxStartError(
                f"sandbox {self.slot} ({self.config.backend}) did not start: {reason}; its log says:\n{log}"
            )
        self._episode_pid = int(msg["episode"])
        self.alive = True

    def _launch(self, ctrl_fd: int, data_fd: int) -> None:
        """Confine the slot (work tmpfs, cgroup, seccomp filter) and start its process inside."""
        confined = confinement(self.config)
        owner = run_as(self.config)
        if confined.work_tmpfs:
            workdir.mount_tmpfs(self.work_dir, self.config.work_size_mb, owner)
            self._work_mounted = True
        if owner is not None:
            for sub in ("work", "tmp"):
                os.chown(self.slot_dir / sub, *owner)
        if confined.cgroups is not None:
            self._cgroup = confined.cgroups.create(self.config.memory_mb << 20, self.config.max_processes)
            self._oom_seen = 0
        opened: list[int] = []
        try:
            filter_fd = seccomp.program_fd(confined.seccomp) if confined.seccomp is not None else None
            if filter_fd is not None:
                opened.append(filter_fd)
            joins = self._cgroup.open_procs() if self._cgroup is not None else []
            opened += joins
            spec = launch_spec(
                self.config,
                self._server,
                self.slot_dir,
                ctrl_fd,
                data_fd,
                seccomp_fd=filter_fd,
                in_cgroup=self._cgroup is not None,
            )
            passed = (ctrl_fd, data_fd) if filter_fd is None else (ctrl_fd, data_fd, filter_fd)
            self._child = Supervised(
                spec.argv,
                env=spec.env,
                cwd=str(self.slot_dir),
                log_path=self.slot_dir / "server.log",
                own_group=True,
                death_signal=signal.SIGKILL,
                run_as=spec.run_as,
                pass_fds=passed,
                cgroup_procs=joins,
            )
        finally:
            for fd in opened:
                os.close(fd)

    def _release_confinement(self) -> None:
        """Remove the cgroup and unmount the work tmpfs (its files go with it)."""
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup = None
        if self._work_mounted:
            workdir.unmount(self.work_dir)
            self._work_mounted = False

    def reset(self, wipe: bool = True) -> bool:
        """Kill every process of the sandbox, optionally wipe /work and /tmp, fork a fresh
        interpreter. Returns False (and marks the sandbox dead) when the zygote does not answer."""
        if not self.alive or self._ctrl is None:
            return False
        token = self._next_id = self._next_id + 1
        try:
            wire.send(self._ctrl, {"cmd": "reset", "wipe": wipe, "token": token})
            deadline = time.monotonic() + RESET_TIMEOUT_S
            while True:
                msg = self._recv_ctrl(max(deadline - time.monotonic(), 0.001))
                if msg is None:
                    raise OSError("sandbox control channel closed")
                if msg.get("event") == "episode" and msg.get("token") == token:
                    break
        except (OSError, ValueError):
            self.kill()
            return False
        self._episode_pid = int(msg["episode"])
        self._oom_killed()  # kills of the previous episode are not the next one's
        self._drain_data()
        return True

    def intact(self) -> bool:
        """Whether the sandbox is as the pool left it: its process running and no event pending on
        its control channel (an interpreter that exited, a zygote that died) since its last reset."""
        if not self.alive or self._ctrl is None or self._child is None or self._child.poll() is not None:
            return False
        try:
            readable, _, _ = select.select([self._ctrl], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def kill(self) -> None:
        """Kill the whole sandbox at once (process group and PID namespace)."""
        self.alive = False
        if self._child is not None:
            self._child.kill()
        if self._cgroup is not None:
            self._cgroup.kill()
        elif self.config.backend == "process":
            self._kill_strays()

    def _kill_strays(self) -> None:
        """Best effort for the process backend without a cgroup, where no PID namespace holds the
        sandbox's processes: kill whatever still runs inside this sandbox's directory."""
        prefix = str(self.slot_dir.resolve()) + os.sep
        for _ in range(3):
            strays = []
            for name in os.listdir("/proc"):
                if name.isdigit():
                    try:
                        if (os.readlink(f"/proc/{name}/cwd") + os.sep).startswith(prefix):
                            strays.append(int(name))
                    except OSError:
                        continue
            if not strays:
                return
            for pid in strays:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
            time.sleep(0.05)

    def close(self) -> None:
        """Stop the sandbox: ask the zygote to kill everything, then kill what is left."""
        if self._ctrl is not None and self.alive:
            try:
                wire.send(self._ctrl, {"cmd": "exit"})
                if self._child is not None:
                    self._child.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for sock in (self._ctrl, self._data):
            if sock is not None:
                sock.close()
        self._ctrl = self._data = None
        if self._child is not None:
            self._child.join_output()
        self._child = None
        self._release_confinement()

    @property
    def pid(self) -> int | None:
        """Host pid of the launched process (bwrap, or the zygote for the process backend)."""
        return None if self._child is None else self._child.pid

    # -------------------------------------------------------------- protocol
    def _call(self, op: str, args: dict[str, Any], timeout: float | None) -> ToolResult:
        started = time.monotonic()
        result = self._exchange(op, args, timeout or self.config.call_timeout_s, started)
        if self._on_call is not None:
            self._on_call(self, result)
        return result

    def _exchange(self, op: str, args: dict[str, Any], timeout: float, started: float) -> ToolResult:
        if not self.alive or self._data is None or self._ctrl is None:
            return infra_failure(op, f"sandbox {self.slot} is not running", started)
        if self._child is not None and self._child.poll() is not None:
            # Its process is gone (killed from outside): what still answers inside is dying with it, and a call it
            # ran now would pass for the model's. On a loaded machine that answer came first.
            return self._after_death(op, started, "the sandbox process has exited")
        self._next_id += 1
        request_id = self._next_id
        try:
            wire.send(self._data, {"id": request_id, "op": op, "timeout": timeout, **args})
        except OSError as exc:
            return self._after_death(op, started, f"could not send the call: {exc}")
        deadline = started + timeout + self.config.kill_grace_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self._restart(op, started, CallStatus.TIMEOUT, f"call exceeded {timeout:g} s; killed")
            readable, _, _ = select.select([self._data, self._ctrl], [], [], remaining)
            if self._data in readable:
                try:
                    reply = self._recv(self._data, max(deadline - time.monotonic(), 0.5))
                except (OSError, ValueError) as exc:
                    return self._restart(op, started, CallStatus.KILLED, f"broken reply from the interpreter: {exc}")
                if reply is None:
                    # End of file: every process holding the sandbox's end is gone, the zygote
                    # included (it keeps that end for the next episode): the sandbox died.
                    return self._after_death(op, started, "the sandbox process died during the call")
                if reply.get("id") == request_id:
                    return self._result(op, reply, started)
                continue  # a stale reply from a call that was abandoned
            if self._ctrl in readable:
                try:
                    event = self._recv_ctrl(5.0)
                except (OSError, ValueError):
                    event = None
                if event is None:
                    return self._after_death(op, started, "the sandbox process died during the call")
                if event.get("event") == "child_exit" and event.get("episode") == self._episode_pid:
                    return self._child_died(op, started, event)

    def _result(self, op: str, reply: dict[str, Any], started: float) -> ToolResult:
        error = reply.get("error")
        return ToolResult(
            tool=op,
            status=CallStatus(reply["status"]),
            stdout=reply.get("stdout", ""),
            stderr=reply.get("stderr", ""),
            value=reply.get("value"),
            exit_code=reply.get("exit_code"),
            error=CallError(error["type"], error["message"], error.get("traceback", "")) if error else None,
            truncated=bool(reply.get("truncated")),
            duration_ms=(time.monotonic() - started) * 1000,
        )

    def _child_died(self, op: str, started: float, event: dict[str, Any]) -> ToolResult:
        if "signal" in event:
            sig = int(event["signal"])
            status = SIGNAL_STATUS.get(sig, CallStatus.KILLED)
            why = f"the interpreter was killed by signal {sig}"
            if sig == 9 and self._oom_killed():
                status = CallStatus.MEMORY
                why += f" (out of memory: the sandbox's {self.config.memory_mb} MB, all its processes together)"
            elif sig == 9:
                why += " (SIGKILL: the memory limit or the model's own code)"
        else:
            status, why = CallStatus.KILLED, f"the interpreter exited with code {event.get('code')}"
        return self._restart(op, started, status, why)

    def _oom_killed(self) -> bool:
        """Whether the OOM killer stopped a process of this sandbox since the last time asked."""
        if self._cgroup is None:
            return False
        seen, self._oom_seen = self._oom_seen, self._cgroup.oom_kills()
        return self._oom_seen > seen

    def _restart(self, op: str, started: float, status: CallStatus, why: str) -> ToolResult:
        """Kill the episode's processes (not its files) and fork a fresh interpreter."""
        if not self.reset(wipe=False):
            return infra_failure(op, f"{why}; then the sandbox did not recover", started)
        return ToolResult(
            tool=op,
            status=status,
            error=CallError(status.name.title(), why),
            duration_ms=(time.monotonic() - started) * 1000,
            detail=f"{why}; {RESTARTED}",
        )

    def _after_death(self, op: str, started: float, why: str) -> ToolResult:
        self.kill()
        if self.config.backend == "process":
            # Model code can kill the zygote itself here: that is the model's doing.
            return ToolResult(
                tool=op,
                status=CallStatus.KILLED,
                error=CallError("Killed", why),
                duration_ms=(time.monotonic() - started) * 1000,
                detail=why,
            )
        return infra_failure(op, why, started)

    def _recv_ctrl(self, timeout: float) -> dict[str, Any] | None:
        assert self._ctrl is not None
        return self._recv(self._ctrl, timeout)

    @staticmethod
    def _recv(sock: socket.socket, timeout: float) -> dict[str, Any] | None:
        sock.settimeout(timeout)
        try:
            return cast("dict[str, Any] | None", wire.recv(sock))
        except TimeoutError as exc:
            raise OSError(f"no answer within {timeout:.1f} s") from exc
        finally:
            sock.settimeout(None)

    def _drain_data(self) -> None:
        assert self._data is not None
        self._data.setblocking(False)
        try:
            while self._data.recv(1 << 16):
                pass
        except (BlockingIOError, OSError):
            pass
        finally:
            self._data.setblocking(True)

    def __repr__(self) -> str:
        state = "alive" if self.alive else "dead"
        return f"Sandbox(slot={self.slot}, backend={self.config.backend!r}, {state})"
