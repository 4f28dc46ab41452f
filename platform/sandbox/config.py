"""Configuration of the sandbox subsystem: one pydantic model with defaults.

The global settings object nests it as ``settings.sandbox`` (environment
variables ``POSTTRAIN_SANDBOX__POOL_SIZE`` and so on); this module imports no
settings itself, and every part of the sandbox takes the config explicitly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

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

    # Limits applied inside every sandbox (rlimits), per process unless noted.
    memory_mb: int = Field(1024, ge=64, description="address space (RLIMIT_AS) per process")
    cpu_seconds: int = Field(10, ge=1, description="CPU seconds per tool call (RLIMIT_CPU)")
    max_processes: int = Field(64, ge=4, description="processes per sandbox (RLIMIT_NPROC)")
    file_size_mb: int = Field(64, ge=1, description="largest file a sandbox may write (RLIMIT_FSIZE)")
    open_files: int = Field(256, ge=16, description="open file descriptors (RLIMIT_NOFILE)")
    tmp_size_mb: int = Field(64, ge=1, description="size of the private /tmp (bwrap tmpfs)")

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

    def resolved_root(self, data_dir: Path | None) -> Path | None:
        """The work-directory root, absolute (bubblewrap mounts it from the sandbox's own directory):
        ``root_dir``, else ``data_dir/sandboxes``, else None."""
        if self.root_dir is not None:
            return Path(self.root_dir).absolute()
        if data_dir is not None:
            return (Path(data_dir) / "sandboxes").absolute()
        return None
