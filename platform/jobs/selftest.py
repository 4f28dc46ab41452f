"""``selftest``: a job kind that exercises the job system itself.

It counts to ``steps``, sleeping ``sleep_s`` per step and checkpointing its
counter, so an interrupted attempt resumes from where it stopped. Options make
it fail, ignore SIGTERM or spawn children, to test failure handling and
process-group cleanup.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from posttrain.platform.failures import TransientError
from posttrain.platform.jobs.context import JobContext
from posttrain.platform.jobs.registry import JobKind, register


class SelftestConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: int = Field(default=10, ge=0, le=1_000_000)
    sleep_s: float = Field(default=0.5, ge=0, le=3600)
    fail_at_step: int | None = Field(default=None, ge=0, description="raise at this step")
    transient_failures: int = Field(default=0, ge=0, description="fail (retryably) on this many first attempts")
    ignore_sigterm: bool = False
    spawn_children: int = Field(default=0, ge=0, le=16, description="sleeping child processes to start")
    mark_file: str | None = Field(default=None, description="append one line per execution (tests)")


def run(ctx: JobContext, config: SelftestConfig) -> dict[str, Any]:
    if config.mark_file:
        with open(config.mark_file, "a") as fh:
            fh.write(f"{ctx.job_id} {ctx.attempt} {os.getpid()}\n")
    if config.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    children = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]) for _ in range(config.spawn_children)
    ]
    if ctx.attempt <= config.transient_failures:
        raise TransientError(f"selftest: transient failure on attempt {ctx.attempt} (on purpose)")
    start = int((ctx.checkpoint or {}).get("counter", 0))
    if start:
        ctx.log.info("resuming from checkpointed counter %d", start)
    counter = start
    for counter in range(start, config.steps):
        if config.fail_at_step is not None and counter == config.fail_at_step:
            raise RuntimeError(f"selftest failing on purpose at step {counter}")
        if config.ignore_sigterm:
            time.sleep(config.sleep_s)
        else:
            ctx.sleep(config.sleep_s)
        ctx.save_checkpoint({"counter": counter + 1})
        ctx.progress(
            (counter + 1) / config.steps, f"step {counter + 1}/{config.steps}", force=counter + 1 == config.steps
        )
        counter += 1
    for child in children:
        child.terminate()
    return {
        "counter": counter if config.steps else 0,
        "resumed_from": start,
        "pid": os.getpid(),
        "threads": int(os.environ["OMP_NUM_THREADS"]),
    }


register(
    JobKind(
        name="selftest",
        config_model=SelftestConfig,
        run=run,
        description="Counts with checkpoints; tests the job system.",
        resumable=True,
        retryable=False,
    )
)
