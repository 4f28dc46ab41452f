"""Configuration of the sandbox subsystem (:mod:`posttrain.platform.sandbox`): one pydantic model with defaults.

The global settings object nests it as ``settings.sandbox`` (environment
variables ``POSTTRAIN_SANDBOX__POOL_SIZE`` and so on); it lives with the settings, below every floor that reads
them, and every part of the sandbox takes the config explicitly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Backend = Literal["bwrap", "process", "ray"]


class SandboxConfig(BaseModel):
    """Limits, pool size and backend of the tool-call sandboxes.

    ``bwrap`` (bubblewrap namespaces plus rlimits) is the default and the only
    backend that isolates the file system, network and process table.
    ``process`` applies rlimits only: weaker, for hosts without bubblewrap.
    ``ray`` spreads pools over a Ray cluster (``RaySandboxPool``, one pool actor per node,
    each node running bubblewrap); ``make_pool`` also picks it when a Ray address is set.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Backend = "bwrap"
    pool_size: int = Field(4, ge=1, le=256, description="pre-started sandboxes kept warm")

    # Limits of every sandbox. The budget of memory and processes is the sandbox's own cgroup where
    # the host allows one (see limits.py; the pool's status says which holds), else rlimits per process.
    memory_mb: int = Field(
        1024,
        ge=64,
        description="memory of the whole sandbox, its tmpfs files included (cgroup); also the address space "
        "of each process (RLIMIT_AS)",
    )
    cpu_seconds: int = Field(10, ge=1, description="CPU seconds per tool call (RLIMIT_CPU)")
    max_processes: int = Field(
        64, ge=4, description="processes and threads of the whole sandbox (cgroup; RLIMIT_NPROC per uid without one)"
    )
    file_size_mb: int = Field(64, ge=1, description="largest file a sandbox may write (RLIMIT_FSIZE)")
    open_files: int = Field(256, ge=16, description="open file descriptors (RLIMIT_NOFILE)")
    tmp_size_mb: int = Field(64, ge=1, description="size of the private /tmp and /dev/shm (bwrap tmpfs)")
    work_size_mb: int = Field(
        256, ge=1, description="size of the work directory (a tmpfs of its own where the host lets us mount one)"
    )
    use_cgroups: bool = Field(
        True,
        description="one memory and process budget per sandbox in a cgroup where the host allows; "
        "False: rlimits per process only",
    )
    cgroup_parent: Path | None = Field(
        None,
        description="a delegated cgroup v2 directory (memory and pids available, no processes of its own) "
        "to make the sandboxes' cgroups in; default: this process's own cgroup",
    )

    # Limits enforced from outside.
    call_timeout_s: float = Field(10.0, gt=0, description="wall-clock limit of one tool call")
    kill_grace_s: float = Field(
        1.0, ge=0, description="extra wall time before the host kills a call that ignores its timeout"
    )
    output_limit_bytes: int = Field(
        65536, ge=256, description="stdout and stderr kept per call, each; the rest is dropped"
    )
    start_timeout_s: float = Field(30.0, gt=0, description="time a new sandbox may take to start")
    acquire_timeout_s: float = Field(60.0, gt=0, description="time acquire() waits for a free sandbox")

    # Where and how.
    root_dir: Path | None = Field(
        None, description="parent of the sandboxes' work directories; default <data_dir>/sandboxes"
    )
    python_executable: str = Field(
        "/usr/bin/python3", description="interpreter run inside the sandbox (standard library suffices)"
    )
    ro_binds: tuple[str, ...] = Field(
        (), description="extra host paths mounted read-only at the same place (e.g. a virtualenv)"
    )
    sandbox_uid: int = Field(65534, description="uid the sandbox runs as when the host process is root")
    sandbox_gid: int = Field(65534, description="gid the sandbox runs as when the host process is root")
    latency_history: int = Field(2048, ge=1, description="recent calls kept for the console")

    @model_validator(mode="after")
    def _tmpfs_fits_in_memory(self) -> SandboxConfig:
        tmpfs_mb = self.work_size_mb + 2 * self.tmp_size_mb  # /work, /tmp and /dev/shm
        if tmpfs_mb >= self.memory_mb:
            raise ValueError(
                f"work_size_mb + 2 * tmp_size_mb ({tmpfs_mb} MB) must stay below memory_mb ({self.memory_mb} MB): "
                "files in the sandbox's tmpfs count toward its memory; lower them or raise memory_mb"
            )
        return self

    def resolved_root(self, data_dir: Path | None) -> Path | None:
        """The work-directory root, absolute (bubblewrap mounts it from the sandbox's own directory):
        ``root_dir``, else ``data_dir/sandboxes``, else None."""
        if self.root_dir is not None:
            return Path(self.root_dir).absolute()
        if data_dir is not None:
            return (Path(data_dir) / "sandboxes").absolute()
        return None
