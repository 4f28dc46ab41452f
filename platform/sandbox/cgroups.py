"""One memory and process budget per sandbox: a cgroup of its own.

Rlimits are per process: ``RLIMIT_AS`` lets each of many processes use ``memory_mb``. A cgroup
counts the sandbox as a whole, its tmpfs files included: the kernel's OOM killer stops a process of
that sandbox once all of them together reach ``memory_mb`` (swap not counting as a way out), and
``fork`` fails with EAGAIN once it holds ``max_processes`` tasks.

Where the cgroups come from, checked once per process (:func:`detect`):

* cgroup v2, in ``cgroup_parent`` when configured, else in this process's own cgroup, when that
  cgroup offers the ``memory`` and ``pids`` controllers and can enable them for its children (a
  delegated cgroup with no processes of its own, or the root of the hierarchy);
* else cgroup v1, under this process's own cgroups of the ``memory`` and ``pids`` hierarchies,
  when those are mounted and writable (root in a container on a v1 or hybrid host);
* else none: the caller falls back to rlimits and says why (:attr:`Unavailable.reason`).

Each sandbox start gets a fresh cgroup (``posttrain-<pid>-<n>``); its launcher joins it before it
executes (:meth:`SandboxCgroup.open_procs`), so every process of the sandbox is inside from the
first. Cgroups left by a process that died are removed by the next one that looks.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "posttrain-"
CONTROLLERS = ("memory", "pids")
REMOVE_TIMEOUT_S = 5.0
_names = itertools.count()


@dataclass(frozen=True)
class Limit:
    directory: Path
    file: str
    value: int
    required: bool = True  # optional files (swap accounting) are written only where they exist


@dataclass(frozen=True)
class SandboxCgroup:
    """The cgroup(s) of one running sandbox: one directory in v2, one per controller in v1."""

    version: int
    directories: tuple[Path, ...]
    oom_file: Path  # memory.events (v2) or memory.oom_control (v1): its ``oom_kill`` line counts kills

    def open_procs(self) -> list[int]:
        """Descriptors of the ``cgroup.procs`` files, for the launcher to write ``0`` to between its
        fork and exec (the kernel checks the opener's rights, so this works after dropping root)."""
        return [os.open(d / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC) for d in self.directories]

    def oom_kills(self) -> int:
        """Processes the OOM killer stopped in this sandbox so far."""
        with contextlib.suppress(OSError, ValueError):
            for line in self.oom_file.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def pids(self) -> set[int]:
        found: set[int] = set()
        for directory in self.directories:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        return found

    def kill(self) -> None:
        """SIGKILL every process in the sandbox (``cgroup.kill`` in v2; v1 signals each listed pid)."""
        kill_file = self.directories[0] / "cgroup.kill"
        if self.version == 2 and kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
            return
        for pid in self.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, timeout_s: float = REMOVE_TIMEOUT_S) -> bool:
        """Kill what is left and remove the cgroup; False if processes outlived ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        remaining = list(self.directories)
        while remaining:
            self.kill()
            for directory in list(remaining):
                try:
                    directory.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        return False
                    continue
                remaining.remove(directory)
            if remaining:
                time.sleep(0.005)
        return True


@dataclass(frozen=True)
class CgroupHost:
    """Where this process makes its sandboxes' cgroups (in v2 both parents are the same directory)."""

    version: int
    memory_parent: Path
    pids_parent: Path

    def describe(self) -> str:
        where = self.memory_parent if self.version == 2 else f"{self.memory_parent} and {self.pids_parent}"
        return f"cgroup v{self.version} under {where}"

    def create(self, memory_bytes: int, max_pids: int) -> SandboxCgroup:
        """A fresh cgroup with these limits; raises OSError (nothing left behind)."""
        name = f"{PREFIX}{os.getpid()}-{next(_names)}"
        memory_dir, pids_dir = self.memory_parent / name, self.pids_parent / name
        directories = tuple(dict.fromkeys((memory_dir, pids_dir)))
        if self.version == 2:
            oom_file = memory_dir / "memory.events"
            limits = [Limit(memory_dir, "memory.max", memory_bytes), Limit(memory_dir, "memory.swap.max", 0, False)]
        else:
            oom_file = memory_dir / "memory.oom_control"
            limits = [Limit(memory_dir, "memory.limit_in_bytes", memory_bytes),
                      Limit(memory_dir, "memory.memsw.limit_in_bytes", memory_bytes, False)]  # fmt: skip
        limits.append(Limit(pids_dir, "pids.max", max_pids))
        cgroup = SandboxCgroup(self.version, directories, oom_file)
        try:
            for directory in directories:
                directory.mkdir()
            for limit in limits:
                path = limit.directory / limit.file
                if limit.required or path.exists():
                    path.write_text(str(limit.value))
        except OSError:
            cgroup.remove(timeout_s=0)
            raise
        return cgroup

    def sweep_stale(self) -> None:
        """Remove the empty cgroups of posttrain processes that no longer exist (their sandboxes died
        with them; one that still holds processes is left alone: its pid may be another namespace's)."""
        for parent in dict.fromkeys((self.memory_parent, self.pids_parent)):
            for entry in parent.glob(f"{PREFIX}*-*"):
                pid = entry.name[len(PREFIX) :].split("-")[0]
                if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                    with contextlib.suppress(OSError):
                        entry.rmdir()


@dataclass(frozen=True)
class Unavailable:
    reason: str


@dataclass(frozen=True)
class Mount:
    fstype: str
    root: str  # the cgroup at the mount point
    point: Path
    options: frozenset[str]  # super options: a v1 hierarchy's controllers


def own_cgroups(text: str) -> dict[str, str]:
    """``/proc/self/cgroup`` as {controller: path}; the v2 hierarchy under the key ``""``."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            found[controller.removeprefix("name=")] = path
    return found


def cgroup_mounts(text: str) -> list[Mount]:
    """The cgroup and cgroup2 mounts of ``/proc/self/mountinfo``."""
    mounts = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, (fstype, _, options) = left.split(), right.split()
        if fstype in ("cgroup", "cgroup2"):
            point = Path(fields[4].replace("\\040", " "))
            mounts.append(Mount(fstype, fields[3], point, frozenset(options.split(","))))
    return mounts


def directory_of(mount: Mount, cgroup_path: str) -> Path | None:
    """Where the cgroup ``cgroup_path`` appears under ``mount``, None if outside it."""
    relative = os.path.relpath(cgroup_path, mount.root)
    return None if relative.startswith("..") else (mount.point / relative).resolve()


def can_create_children(parent: Path) -> str | None:
    """None if a child cgroup can be made (and removed) under ``parent``, else why not."""
    probe = parent / f"{PREFIX}{os.getpid()}-probe"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        return f"cannot create a cgroup under {parent} ({exc.strerror})"
    return None


def detect_v2(mounts: list[Mount], cgroups: dict[str, str], parent: Path | None) -> CgroupHost | Unavailable:
    if parent is None:
        mount = next((m for m in mounts if m.fstype == "cgroup2"), None)
        parent = directory_of(mount, cgroups[""]) if mount is not None and "" in cgroups else None
        if parent is None:
            return Unavailable("cgroup v2 is not mounted")
    try:
        offered = set((parent / "cgroup.controllers").read_text().split())
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
    except OSError as exc:
        return Unavailable(f"{parent} is not a cgroup v2 directory ({exc.strerror})")
    missing = [c for c in CONTROLLERS if c not in offered]
    if missing:
        return Unavailable(f"cgroup v2 at {parent} offers no {' or '.join(missing)} controller "
                           "(bound to cgroup v1, or not delegated)")  # fmt: skip
    if not enabled.issuperset(CONTROLLERS):
        try:
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in CONTROLLERS))
        except OSError as exc:
            why = (
                "it holds processes; set sandbox.cgroup_parent to a delegated cgroup that holds none"
                if exc.errno == errno.EBUSY
                else exc.strerror
            )
            return Unavailable(f"cgroup v2 at {parent} cannot hand memory and pids to child cgroups ({why})")
    problem = can_create_children(parent)
    return Unavailable(f"cgroup v2: {problem}") if problem else CgroupHost(2, parent, parent)


def detect_v1(mounts: list[Mount], cgroups: dict[str, str]) -> CgroupHost | Unavailable:
    parents: list[Path] = []
    for controller in CONTROLLERS:
        found = [directory_of(m, cgroups[controller]) for m in mounts
                 if m.fstype == "cgroup" and controller in m.options and controller in cgroups]  # fmt: skip
        directory = next((d for d in found if d is not None), None)
        if directory is None:
            return Unavailable(f"cgroup v1 has no {controller} hierarchy mounted")
        problem = can_create_children(directory)
        if problem:
            return Unavailable(f"cgroup v1: {problem}")
        parents.append(directory)
    return CgroupHost(1, parents[0], parents[1])


@functools.cache
def detect(parent: Path | None = None) -> CgroupHost | Unavailable:
    """Where this process can give sandboxes cgroups (``parent``: a delegated v2 cgroup to use),
    or why it cannot. Checked once per process; stale cgroups of dead processes are removed."""
    try:
        mounts = cgroup_mounts(Path("/proc/self/mountinfo").read_text())
        cgroups = own_cgroups(Path("/proc/self/cgroup").read_text())
    except OSError as exc:
        return Unavailable(f"cannot read this process's cgroups ({exc.strerror})")
    v2 = detect_v2(mounts, cgroups, parent)
    if isinstance(v2, CgroupHost) or parent is not None:
        found = v2
    else:
        v1 = detect_v1(mounts, cgroups)
        found = v1 if isinstance(v1, CgroupHost) else Unavailable(f"{v2.reason}; {v1.reason}")
    if isinstance(found, CgroupHost):
        found.sweep_stale()
    return found
