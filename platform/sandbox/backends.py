"""How a sandbox process is launched: the bubblewrap and the plain-process backends.

``bwrap``: user, PID, network, IPC, UTS and mount namespaces; the host's /usr
and /etc read-only, a private writable /work and a size-capped /tmp, no
network, a scrubbed environment, ``--die-with-parent``, the zygote as PID 1
so that model code can neither kill it nor leave a process behind, and the
seccomp filter of seccomp.py (``--seccomp FD``).

``process``: rlimits and a scrubbed environment only (plus the sandbox's
cgroup and work tmpfs where the host allows them, see limits.py). Model code
runs with the host's file system view, network and process table (as an
unprivileged uid when the host is root). It is weaker, and says so when it starts.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

from posttrain.platform.sandbox._server import BESIDE
from posttrain.platform.settings.sandbox import SandboxConfig

SERVER_IN_SANDBOX = "/opt/posttrain/server.py"
WORK_IN_SANDBOX = "/work"
TMP_IN_SANDBOX = "/tmp"
PATH = "/usr/local/bin:/usr/bin:/bin"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")


class SandboxUnavailableError(RuntimeError):
    """The host cannot run the configured backend (bubblewrap missing, bad paths)."""


class ProcessBackendWarning(UserWarning):
    """The ``process`` backend isolates far less than bubblewrap."""


@dataclass(frozen=True)
class LaunchSpec:
    argv: list[str]
    env: dict[str, str]
    work_dir: Path  # host path of the work directory
    run_as: tuple[int, int] | None  # (uid, gid) for the launched process, None: as the host


def sandbox_env(home: str, tmp: str) -> dict[str, str]:
    """The whole environment model code sees: nothing of the host's."""
    return {"PATH": PATH, "HOME": home, "TMPDIR": tmp, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}


def run_as(config: SandboxConfig) -> tuple[int, int] | None:
    # RLIMIT_NPROC is not enforced for uid 0, not even mapped into a user namespace.
    return (config.sandbox_uid, config.sandbox_gid) if os.geteuid() == 0 else None


@functools.cache
def bwrap_path() -> str:
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxUnavailableError(
            "bubblewrap (bwrap) is not installed: run `apt-get install bubblewrap` "
            "(or `make system-deps`), or set POSTTRAIN_SANDBOX__BACKEND=process for the weaker backend"
        )
    return found


@functools.cache
def python_prefixes(executable: str) -> tuple[str, ...]:
    """Directories the sandboxed interpreter needs besides the system dirs."""
    real = os.path.realpath(executable)
    if not os.access(real, os.X_OK):
        raise SandboxUnavailableError(f"python_executable {executable!r} is not an executable file")
    out = subprocess.run(
        [executable, "-I", "-c", "import sys, json; print(json.dumps([sys.prefix, sys.base_prefix]))"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": PATH},
    )
    paths = set(json.loads(out.stdout)) if out.returncode == 0 else set()
    paths.add(os.path.dirname(real))
    return tuple(sorted(p for p in paths if not p.startswith(SYSTEM_DIRS)))


def system_mounts() -> list[str]:
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def bwrap_argv(
    config: SandboxConfig, server: Path, work: Path, command: list[str], seccomp_fd: int | None = None
) -> list[str]:
    """A bwrap command line that runs ``command`` in a fresh sandbox (also used by the benchmark's peer),
    under the seccomp program bwrap reads from the inherited descriptor ``seccomp_fd``."""
    argv = [
        bwrap_path(),
        "--unshare-user",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
        "--hostname",
        "sandbox",
        *system_mounts(),
    ]
    for path in (*python_prefixes(config.python_executable), *config.ro_binds):
        argv += ["--ro-bind", path, path]
    argv += [
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--size",
        str(config.tmp_size_mb << 20),
        "--tmpfs",
        TMP_IN_SANDBOX,
        "--bind",
        str(work),
        WORK_IN_SANDBOX,
        "--ro-bind",
        str(server),
        SERVER_IN_SANDBOX,
    ]
    for name in BESIDE:
        argv += ["--ro-bind", str(server.with_name(name)), str(Path(SERVER_IN_SANDBOX).with_name(name))]
    argv += [
        "--size",
        str(config.tmp_size_mb << 20),
        "--tmpfs",
        "/dev/shm",
        "--remount-ro",
        "/",
        "--remount-ro",
        "/dev",
        "--chdir",
        WORK_IN_SANDBOX,
        "--clearenv",
    ]
    for key, value in sandbox_env(WORK_IN_SANDBOX, TMP_IN_SANDBOX).items():
        argv += ["--setenv", key, value]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return argv + ["--", *command]


def server_config(config: SandboxConfig, work: str, tmp: str, ctrl_fd: int, data_fd: int, in_cgroup: bool) -> str:
    return json.dumps(
        {
            "ctrl_fd": ctrl_fd,
            "data_fd": data_fd,
            "work_dir": work,
            "tmp_dir": tmp,
            "memory_mb": config.memory_mb,
            "cpu_seconds": config.cpu_seconds,
            # RLIMIT_NPROC counts every process of the uid, other sandboxes' too: only without a cgroup.
            "max_processes": None if in_cgroup else config.max_processes,
            "file_size_mb": config.file_size_mb,
            "open_files": config.open_files,
            "output_limit_bytes": config.output_limit_bytes,
        }
    )


def launch_spec(
    config: SandboxConfig,
    server: Path,
    slot_dir: Path,
    ctrl_fd: int,
    data_fd: int,
    *,
    seccomp_fd: int | None = None,
    in_cgroup: bool = False,
) -> LaunchSpec:
    """Command line, environment and uid of one sandbox's zygote (``in_cgroup``: it runs in a cgroup
    of its own, which bounds its processes; ``seccomp_fd``: the filter for bwrap)."""
    work = slot_dir / "work"
    if config.backend == "bwrap":
        cfg = server_config(config, WORK_IN_SANDBOX, TMP_IN_SANDBOX, ctrl_fd, data_fd, in_cgroup)
        argv = bwrap_argv(
            config, server, work, [config.python_executable, "-I", "-B", SERVER_IN_SANDBOX, cfg], seccomp_fd
        )
        return LaunchSpec(argv, sandbox_env(WORK_IN_SANDBOX, TMP_IN_SANDBOX), work, run_as(config))
    if config.backend == "process":
        tmp = slot_dir / "tmp"
        cfg = server_config(config, str(work), str(tmp), ctrl_fd, data_fd, in_cgroup)
        argv = [config.python_executable, "-I", "-B", str(server), cfg]
        return LaunchSpec(argv, sandbox_env(str(work), str(tmp)), work, run_as(config))
    raise SandboxUnavailableError(f"backend {config.backend!r} has no local launcher; use RayPool for 'ray'")


def warn_if_weak(config: SandboxConfig) -> None:
    if config.backend == "process":
        warnings.warn(
            "sandbox backend 'process' applies rlimits only: model code can read the host's files, "
            "use the network and see other processes. Install bubblewrap and use backend 'bwrap'.",
            ProcessBackendWarning,
            stacklevel=3,
        )
