"""Interpreter server that runs inside one sandbox. Standard library only.

The host copies this file into the sandbox root and starts it as
``python3 -I -B server.py '<json config>'``. Two processes serve one sandbox:

* the zygote (PID 1 of the sandbox's PID namespace under bubblewrap): it
  never runs model code; on the control socket it forks a fresh episode
  child, kills every other process of the sandbox, wipes the work
  directory and /tmp, and reports children that die;
* the episode child: it runs tool calls on the data socket, keeping Python
  globals between calls, until the host resets the episode.

Wire format on both sockets: a 4-byte big-endian length, then UTF-8 JSON.
"""

from __future__ import annotations

import ast
import builtins
import ctypes
import errno
import gc
import importlib
import importlib.util
import io
import json
import os
import resource
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import traceback
import types

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
MAX_LIST_ENTRIES = 1000
WIRE, WIRE_MODULE = "_wire.py", "posttrain_wire"
GRADER, GRADER_MODULE = "graded.py", "posttrain_graded"
BESIDE = (WIRE, GRADER)
"""The files the host lays beside this one in a sandbox: the framing (required) and the code grader."""


def load_beside(filename: str, module_name: str) -> types.ModuleType:
    """Load the file ``filename`` beside this one as the module ``module_name``."""
    spec = importlib.util.spec_from_file_location(
        module_name, os.path.join(os.path.dirname(os.path.abspath(__file__)), filename)
    )
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]  # a .py path always has a spec
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


if __package__:  # the host
    from posttrain.platform.sandbox._wire import recv, send
else:  # a sandbox (python3 -I: this file's directory is not on sys.path)
    _wire = load_beside(WIRE, WIRE_MODULE)
    send, recv = _wire.send, _wire.recv


def prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(option, arg, 0, 0, 0)


def set_limit(kind: int, value: int) -> None:
    resource.setrlimit(kind, (value, value))


class CallTimeout(BaseException):
    """Raised by the interval timer; a BaseException so `except Exception` in model code cannot swallow it."""


def _alarm(signum: int, frame: object) -> None:
    raise CallTimeout()


class Episode:
    """The episode child: runs tool calls with persistent globals."""

    def __init__(self, cfg: dict, data_fd: int) -> None:
        self.cfg = cfg
        self.pid = os.getpid()
        self.work = cfg["work_dir"]
        self.cap = int(cfg["output_limit_bytes"])
        self.sock = socket.socket(fileno=data_fd)
        self.sock.set_inheritable(False)
        mb = 1 << 20
        set_limit(resource.RLIMIT_AS, int(cfg["memory_mb"]) * mb)
        set_limit(resource.RLIMIT_CORE, 0)
        self.cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        self.out_fd = os.memfd_create("stdout")
        self.err_fd = os.memfd_create("stderr")
        self.stdout = self._stream(1)
        self.stderr = self._stream(2)
        self.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        os.chdir(self.work)
        sys.path[0] = self.work  # like `python` run in the work dir: the model's own modules import
        signal.signal(signal.SIGALRM, _alarm)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self.globals: dict = {"__name__": "__main__", "__builtins__": builtins}

    # ----------------------------------------------------------------- loop
    def serve(self) -> None:
        while True:
            try:
                msg = recv(self.sock)
            except (OSError, ValueError):
                os._exit(3)
            if msg is None:
                os._exit(0)
            reply = self.handle(msg)  # type: ignore[arg-type]  # the host sends dicts
            if os.getpid() != self.pid:  # a fork made by model code came back here
                os._exit(0)
            try:
                try:
                    send(self.sock, reply)
                except ValueError as error:  # over the wire's limit: nothing was sent; say so instead
                    send(
                        self.sock,
                        {
                            "id": reply["id"],
                            "status": "error",
                            "value": None,
                            "exit_code": None,
                            "stdout": "",
                            "stderr": "",
                            "error": {
                                "type": "ValueError",
                                "message": f"the call's result is too large to return: {error}",
                                "traceback": "",
                            },
                        },
                    )
            except OSError:
                os._exit(3)

    def handle(self, msg: dict) -> dict:
        op = msg.get("op")
        timeout = float(msg.get("timeout", 10.0))
        reply: dict = {"id": msg.get("id"), "status": "ok", "value": None, "exit_code": None, "error": None}
        self._begin_output()
        try:
            if op == "python":
                reply["value"] = self.op_python(msg["code"], timeout)
            elif op == "bash":
                reply["exit_code"] = self.op_bash(msg["command"], timeout)
                if reply["exit_code"] != 0:
                    reply["status"] = "error"
                    reply["error"] = self._exit_error(reply["exit_code"])
                    if reply["exit_code"] == -signal.SIGXCPU:
                        reply["status"] = "timeout"
            elif op == "read_file":
                reply["value"], truncated = self.op_read_file(msg["path"], int(msg.get("max_bytes") or self.cap))
                reply["truncated"] = truncated
            elif op == "write_file":
                reply["value"] = self.op_write_file(msg["path"], msg["content"], bool(msg.get("append")))
            elif op == "edit_file":
                reply["value"] = self.op_edit_file(msg["path"], msg["old"], msg["new"])
            elif op == "list_dir":
                reply["value"] = self.op_list_dir(msg.get("path") or ".")
            elif op == "ping":
                reply["value"] = self.pid
            else:
                raise ValueError(f"unknown operation {op!r}")
        except CallTimeout:
            reply["status"] = "timeout"
            reply["error"] = {"type": "TimeoutError", "message": f"call exceeded {timeout:g} s", "traceback": ""}
        except MemoryError:
            reply["status"] = "memory"
            reply["error"] = {"type": "MemoryError", "message": "memory limit reached", "traceback": ""}
        except BaseException as exc:  # noqa: BLE001 - model code may raise anything
            if isinstance(exc, SystemExit) and exc.code in (None, 0):
                pass
            else:
                reply["status"] = "error"
                reply["error"] = self._describe(exc)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            self._end_output(reply)
        except MemoryError:
            reply.update(stdout="", stderr="", status="memory")
        return reply

    # ------------------------------------------------------------ output
    @staticmethod
    def _stream(fd: int) -> io.TextIOWrapper:
        return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors="backslashreplace")

    def _begin_output(self) -> None:
        for fd in (self.out_fd, self.err_fd):
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
        os.dup2(self.out_fd, 1)
        os.dup2(self.err_fd, 2)
        sys.stdout, sys.stderr, sys.stdin = self.stdout, self.stderr, self.stdin

    def _end_output(self, reply: dict) -> None:
        for name in ("stdout", "stderr"):
            try:
                getattr(self, name).flush()
            except (OSError, ValueError):
                # EFBIG: the stream hit the file-size limit; drop what is still buffered.
                setattr(self, name, self._stream(1 if name == "stdout" else 2))
        truncated = bool(reply.get("truncated"))
        for name, fd in (("stdout", self.out_fd), ("stderr", self.err_fd)):
            size = os.fstat(fd).st_size
            data = os.pread(fd, self.cap, 0)
            reply[name] = data.decode("utf-8", "replace")
            reply[f"{name}_bytes"] = size
            truncated = truncated or size > self.cap
            os.ftruncate(fd, 0)
        reply["truncated"] = truncated
        err = reply.get("error") or {}
        if truncated and (reply["status"] == "ok" or err.get("errno") == errno.EFBIG):
            reply["status"] = "output_truncated"

    def _describe(self, exc: BaseException) -> dict:
        tb_obj = exc.__traceback__
        while tb_obj is not None and tb_obj.tb_frame.f_code.co_filename != "<tool>":
            tb_obj = tb_obj.tb_next  # hide the server's own frames from the model
        try:
            tb = "".join(traceback.format_exception(type(exc), exc, tb_obj))
        except Exception:  # noqa: BLE001
            tb = ""
        return {
            "type": type(exc).__name__,
            "message": str(exc)[: self.cap],
            "traceback": tb[-self.cap :],
            "errno": getattr(exc, "errno", None),
        }

    @staticmethod
    def _exit_error(code: int) -> dict:
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            lost_output = -code == signal.SIGXFSZ
            return {
                "type": "Signal",
                "message": f"terminated by {name}",
                "traceback": "",
                "errno": errno.EFBIG if lost_output else None,
            }
        return {"type": "ExitStatus", "message": f"exit status {code}", "traceback": ""}

    # ------------------------------------------------------------- tools
    def _cpu_limit_for_call(self) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(usage.ru_utime + usage.ru_stime) + int(self.cfg["cpu_seconds"]) + 1
        hard = self.cpu_hard
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))

    def op_python(self, code: str, timeout: float) -> str | None:
        tree = ast.parse(code, "<tool>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)  # type: ignore[attr-defined]  # the ast.Expr above
        body = compile(tree, "<tool>", "exec")
        tail = compile(last, "<tool>", "eval") if last is not None else None
        importlib.invalidate_caches()  # files written since the last call must be importable
        self._cpu_limit_for_call()
        signal.setitimer(signal.ITIMER_REAL, timeout)
        exec(body, self.globals)  # noqa: S102 - this is the sandbox
        value = eval(tail, self.globals) if tail is not None else None  # noqa: S307
        signal.setitimer(signal.ITIMER_REAL, 0)
        if value is None:
            return None
        self.globals["_"] = value
        return repr(value)[: self.cap]

    def op_bash(self, command: str, timeout: float) -> int:
        self.stdout.flush()
        self.stderr.flush()
        self._cpu_limit_for_call()
        proc = subprocess.Popen(
            ["/bin/bash", "-c", command], stdin=subprocess.DEVNULL, cwd=self.work, start_new_session=True
        )
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            raise CallTimeout() from None

    def confine(self, path: str) -> str:
        joined = path if os.path.isabs(path) else os.path.join(self.work, path)
        real = os.path.realpath(joined)
        if real != self.work and not real.startswith(self.work.rstrip("/") + "/"):
            raise PermissionError(f"path {path!r} is outside the work directory {self.work}")
        return real

    def op_read_file(self, path: str, max_bytes: int) -> tuple[str, bool]:
        with open(self.confine(path), "rb") as fh:
            data = fh.read(max_bytes + 1)
        return data[:max_bytes].decode("utf-8", "replace"), len(data) > max_bytes

    def op_write_file(self, path: str, content: str, append: bool) -> int:
        target = self.confine(path)
        parent = os.path.dirname(target)
        if parent:
            os.makedirs(parent, exist_ok=True)
        data = content.encode()
        with open(target, "ab" if append else "wb") as fh:
            fh.write(data)
        return len(data)

    def op_edit_file(self, path: str, old: str, new: str) -> str:
        """Replace the one occurrence of ``old`` in the file with ``new``; a ValueError that says how many
        occurrences there are when that is not exactly one (nothing is written then)."""
        if not old:
            raise ValueError("old is empty: give the exact text to replace, copied from the file")
        target = self.confine(path)
        with open(target, encoding="utf-8") as fh:
            text = fh.read()
        count = text.count(old)
        if count != 1:
            where = "is not in" if count == 0 else f"occurs {count} times in"
            raise ValueError(
                f"the old text {where} {path}; it must occur exactly once (copy it from the file, "
                f"with its indentation{', and add lines around it' if count else ''})"
            )
        start = text.index(old)
        with open(target, "w", encoding="utf-8") as fh:
            fh.write(text[:start] + new + text[start + len(old) :])
        first = text.count("\n", 0, start) + 1
        return f"edited {path}: lines {first}-{first + new.count(chr(10))} now hold the new text"

    def op_list_dir(self, path: str) -> list[dict]:
        entries: list[dict] = []
        with os.scandir(self.confine(path)) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                kind = "dir" if stat.S_ISDIR(st.st_mode) else "link" if stat.S_ISLNK(st.st_mode) else "file"
                entries.append({"name": entry.name, "type": kind, "size": st.st_size})
                if len(entries) >= MAX_LIST_ENTRIES:
                    break
        entries.sort(key=lambda e: e["name"])
        return entries


class Zygote:
    """Supervisor of one sandbox: forks episodes, kills and reaps everything else."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.ctrl = socket.socket(fileno=int(cfg["ctrl_fd"]))
        self.data_fd = int(cfg["data_fd"])
        self.is_init = os.getpid() == 1
        self.child = 0
        self.child_fd = -1
        self.work = cfg["work_dir"]
        self.tmp = cfg["tmp_dir"]
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)
        prctl(PR_SET_DUMPABLE, 0)  # model code (same uid) cannot ptrace or read our memory
        if not self.is_init:
            prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of the episode come back to us
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        mb = 1 << 20
        if cfg["max_processes"] is not None:  # else the sandbox's cgroup bounds its processes
            set_limit(resource.RLIMIT_NPROC, int(cfg["max_processes"]))
        set_limit(resource.RLIMIT_NOFILE, int(cfg["open_files"]))
        set_limit(resource.RLIMIT_FSIZE, int(cfg["file_size_mb"]) * mb)
        set_limit(resource.RLIMIT_CORE, 0)

    def run(self) -> None:
        self.fork_episode()
        send(self.ctrl, {"event": "ready", "episode": self.child, "zygote": os.getpid()})
        while True:
            fds = [self.ctrl] + ([self.child_fd] if self.child_fd >= 0 else [])
            readable, _, _ = select.select(fds, [], [], 1.0)
            self.reap()
            if self.ctrl in readable:
                try:
                    msg: dict | None = recv(self.ctrl)  # type: ignore[assignment]  # the host sends dicts
                except (OSError, ValueError):
                    msg = None
                if msg is None or msg.get("cmd") == "exit":
                    self.kill_all()
                    os._exit(0)
                if msg.get("cmd") == "reset":
                    self.kill_all()
                    if msg.get("wipe"):
                        self.wipe(self.work)
                        self.wipe(self.tmp)
                        if self.is_init:
                            self.wipe("/dev/shm")
                    self.fork_episode()
                    send(self.ctrl, {"event": "episode", "episode": self.child, "token": msg.get("token")})

    def fork_episode(self) -> None:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                self.ctrl.close()
                Episode(self.cfg, self.data_fd).serve()
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
                code = 3
            os._exit(code)
        self.child = pid
        self.child_fd = os.pidfd_open(pid)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.child:
                self._child_gone(status)

    def _child_gone(self, status: int) -> None:
        event = {"event": "child_exit", "episode": self.child}
        if os.WIFSIGNALED(status):
            event["signal"] = os.WTERMSIG(status)
        else:
            event["code"] = os.waitstatus_to_exitcode(status)
        os.close(self.child_fd)
        self.child, self.child_fd = 0, -1
        try:
            send(self.ctrl, event)
        except OSError:
            os._exit(0)

    def kill_all(self) -> None:
        """Kill every process of the sandbox but this one, and reap them all."""
        if self.is_init:
            # PID 1 of the namespace: kill(-1) reaches every process in it, and
            # every orphan is our child, so waiting until ECHILD proves they are gone.
            for _ in range(100):
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    while True:
                        os.waitpid(-1, 0)
                except ChildProcessError:
                    break
        else:
            for _ in range(200):
                pids = self.descendants()
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                deadline = time.monotonic() + 0.5
                while time.monotonic() < deadline:
                    try:
                        pid, _ = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        time.sleep(0.001)
        if self.child_fd >= 0:
            os.close(self.child_fd)
        self.child, self.child_fd = 0, -1

    def descendants(self) -> list[int]:
        parents: dict[int, list[int]] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            parents.setdefault(int(fields[1]), []).append(int(name))
        found, todo = [], [os.getpid()]
        while todo:
            for kid in parents.get(todo.pop(), []):
                found.append(kid)
                todo.append(kid)
        return found

    @staticmethod
    def wipe(directory: str) -> None:
        def unlock(func, path, exc_info):  # model code may have removed write permission
            try:
                os.chmod(os.path.dirname(path) or ".", 0o700)
                os.chmod(path, 0o700)
                func(path)
            except OSError:
                pass

        try:
            names = os.listdir(directory)
        except OSError:
            return
        for name in names:
            path = os.path.join(directory, name)
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, onerror=unlock)
                else:
                    os.unlink(path)
            except OSError:
                pass


def load_grader() -> None:
    """Preload the code verifier's grader (graded.py beside this file) as ``posttrain_graded``, so that
    every episode forked from here has it without receiving its code. Optional: without the file (or
    if it does not load) the verifier sends it with each check."""
    if not os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)), GRADER)):
        return
    try:
        load_beside(GRADER, GRADER_MODULE)
    except Exception:  # noqa: BLE001
        traceback.print_exc()


def main() -> None:
    cfg = json.loads(sys.argv[1])
    load_grader()
    try:
        import typing  # noqa: F401 - most graded programs import it: once here, not in every episode
    except ImportError:
        pass

    gc.freeze()  # every episode forks from here: collections there leave these objects (and pages) shared
    Zygote(cfg).run()


if __name__ == "__main__":
    main()
