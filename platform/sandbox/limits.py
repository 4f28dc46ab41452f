"""What confines every sandbox on this host, found out once, with a line for each part.

Three parts, each with a weaker fallback the host may force; a fallback is logged once and shown in
the pool's status (``PoolStatus.limits``), so an operator sees what is not enforced and why:

* ``memory_and_processes``: one cgroup per sandbox (:mod:`.cgroups`), else rlimits per process;
* ``work_dir``: a tmpfs of ``work_size_mb`` per sandbox (:mod:`.workdir`), else the host's disk;
* ``syscalls``: the seccomp filter (:mod:`.seccomp`), bubblewrap backend only.
"""

from __future__ import annotations

import functools
import logging
import platform
from dataclasses import dataclass
from pathlib import Path

from posttrain.platform.sandbox import cgroups, seccomp, workdir
from posttrain.platform.settings.sandbox import SandboxConfig

log = logging.getLogger(__name__)
WEAKER = "weaker: "


@dataclass(frozen=True)
class Confinement:
    cgroups: cgroups.CgroupHost | None
    work_tmpfs: bool
    seccomp: seccomp.Arch | None
    limits: tuple[tuple[str, str], ...]  # (part, one line saying what holds), for the status


def confinement(config: SandboxConfig) -> Confinement:
    """How sandboxes of ``config`` are confined here (checked once per process and setting)."""
    return _confinement(config.backend, config.use_cgroups, config.cgroup_parent, config.memory_mb,
                        config.max_processes, config.work_size_mb, config.file_size_mb)  # fmt: skip


@functools.cache
def _confinement(backend: str, use_cgroups: bool, cgroup_parent: Path | None, memory_mb: int, max_processes: int,
                 work_size_mb: int, file_size_mb: int) -> Confinement:  # fmt: skip
    found = cgroups.detect(cgroup_parent) if use_cgroups else cgroups.Unavailable("turned off (sandbox.use_cgroups)")
    if isinstance(found, cgroups.CgroupHost):
        budget = (f"{found.describe()}: {memory_mb} MB of memory and {max_processes} processes per sandbox, "
                  "all its processes together")  # fmt: skip
    else:
        budget = (f"{WEAKER}rlimits per process only ({memory_mb} MB of address space each, so several together "
                  f"can use more; {max_processes} processes per uid), as cgroups are unavailable: {found.reason}")  # fmt: skip
    no_tmpfs = workdir.tmpfs_support()
    work = (f"tmpfs of {work_size_mb} MB per sandbox, off the host's disk" if no_tmpfs is None else
            f"{WEAKER}no size limit, on the host's disk ({file_size_mb} MB per file only): {no_tmpfs}")  # fmt: skip
    arch = seccomp.native_arch() if backend == "bwrap" else None
    if arch is not None:
        syscalls = (f"seccomp ({arch.name}): new namespaces, mount, ptrace, kexec, bpf, keyrings, perf events "
                    "and kernel modules refused")  # fmt: skip
    elif backend == "bwrap":
        syscalls = f"{WEAKER}no seccomp filter is written for {platform.machine()}"
    else:
        syscalls = f"{WEAKER}no seccomp filter (backend {backend!r})"
    limits = (("memory_and_processes", budget), ("work_dir", work), ("syscalls", syscalls))
    for part, line in limits:
        if line.startswith(WEAKER):
            log.warning("sandbox %s: %s", part, line)
    return Confinement(found if isinstance(found, cgroups.CgroupHost) else None, no_tmpfs is None, arch, limits)
