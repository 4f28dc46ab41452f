"""``posttrain worker``: claims jobs and runs each in its own process group.

The worker is one single-threaded loop. Each claimed job runs in a forked
child that leads its own process group, writes its output to the job's log
file, and gets SIGTERM if the worker dies (``PR_SET_PDEATHSIG``), so a job
never outlives the worker that supervises it. The loop wakes on SIGCHLD, so a
finished slot is refilled at once; it heartbeats its jobs, honours cancel
requests (SIGTERM to the group, SIGKILL after the grace period) and wall-clock
limits, and re-queues jobs that lost their worker.
"""

from __future__ import annotations

import errno
import gc
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from pydantic import ValidationError

from posttrain.platform.db.engine import is_transient, reset_engines, retry_transient, session
from posttrain.platform.db.models import Job, utcnow
from posttrain.platform.db.models import Worker as WorkerRow
from posttrain.platform.failures import BadInput, TransientError
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.context import JobContext, JobStopped
from posttrain.platform.jobs.registry import (
    JobConfigError,
    get_kind,
    no_room_left,
    result_json,
    serving_kinds,
    validate_config,
)
from posttrain.platform.settings import Settings, get_settings
from posttrain.platform.supervise import die_with_parent

log = logging.getLogger("posttrain.worker")

EXIT_STOPPED = 143  # 128 + SIGTERM: the job stopped because it was asked to
EXIT_BAD_INPUT = 2
EXIT_DISK_FULL = 28  # errno ENOSPC: the job ran out of disk space (perhaps with no room left to say more)
RESULT_FILE = "result.json"
ERROR_FILE = "error.json"


def job_dir(settings: Settings, job_id: int) -> Path:
    return settings.jobs_dir / str(job_id)


@dataclass
class Running:
    job_id: int
    pid: int
    cpu_slots: int
    gpu_slots: int
    workdir: Path
    deadline: float | None = None  # monotonic wall-clock limit
    serving: bool = False  # a deployment: it holds a serving slot
    term_sent_at: float | None = None
    reason: str | None = None  # why we stopped it: cancel, timeout, shutdown
    extra: dict[str, Any] = field(default_factory=dict)


class Worker:
    def __init__(
        self,
        settings: Settings | None = None,
        *,
        url: str | None = None,
        cpu_slots: int | None = None,
        gpu_slots: int | None = None,
        exit_when_idle: bool = False,
    ) -> None:
        self.settings = settings or get_settings()
        self.url = url or self.settings.resolved_database_url
        self.cpu_slots = cpu_slots or self.settings.worker_cpu_slots
        self.gpu_slots = self.settings.worker_gpu_slots if gpu_slots is None else gpu_slots
        self.serving_slots = self.settings.worker_serving_slots
        self.exit_when_idle = exit_when_idle
        self.id = queue.make_worker_id()
        self.running: dict[int, Running] = {}
        self._finished: list[tuple[Running, int]] = []  # reaped, their exit not yet recorded
        self._stopping = False
        self._last_heartbeat = 0.0
        self._last_cancel_check = 0.0

    # --- slots ------------------------------------------------------------------
    @property
    def free_cpu(self) -> int:
        return self.cpu_slots - sum(r.cpu_slots for r in self.running.values())

    @property
    def free_gpu(self) -> int:
        return self.gpu_slots - sum(r.gpu_slots for r in self.running.values())

    @property
    def free_serving(self) -> int:
        return self.serving_slots - sum(r.serving for r in self.running.values())

    # --- lifecycle --------------------------------------------------------------
    def request_stop(self, *_: Any) -> None:
        self._stopping = True

    def run(self) -> None:
        self.settings.ensure_dirs()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        self._register()
        gc.freeze()  # forked job processes then share, rather than copy, the worker's objects
        recovered = queue.recover_orphans(self.settings.heartbeat_timeout_s, exclude_worker=self.id, url=self.url)
        if recovered:
            log.warning("recovered orphaned jobs %s", recovered)
        log.info("worker %s started: %d cpu slots, %d gpu slots", self.id, self.cpu_slots, self.gpu_slots)
        outage_delay = 0.0
        try:
            while not self._stopping:
                try:
                    self._reap()
                    self._record_finished()
                    claimed = self._fill_slots()
                    self._housekeeping()
                    idle = not self.running and not self._finished and not claimed
                    if self.exit_when_idle and idle and not queue.queued_count(url=self.url):
                        break
                except Exception as exc:
                    if not is_transient(exc):
                        raise
                    # The database is out of reach (a restart, a network blip): the jobs keep running;
                    # claims, heartbeats and exits wait until it is back.
                    outage_delay = min(max(2 * outage_delay, 0.2), 5.0)
                    log.warning(
                        "database unavailable, retrying in %.1fs: %s", outage_delay, str(exc).splitlines()[0][:300]
                    )
                    signal.sigtimedwait({signal.SIGCHLD}, outage_delay)
                    continue
                if outage_delay:
                    log.info("database reachable again")
                    outage_delay = 0.0
                if not claimed:
                    signal.sigtimedwait({signal.SIGCHLD}, self.settings.worker_poll_interval_s)
        finally:
            self._shutdown()

    def _register(self) -> None:
        with session(self.url) as s:
            s.merge(
                WorkerRow(
                    id=self.id,
                    host=queue.HOSTNAME,
                    pid=os.getpid(),
                    cpu_slots=self.cpu_slots,
                    gpu_slots=self.gpu_slots,
                )
            )

    def _shutdown(self) -> None:
        for r in self.running.values():
            if r.term_sent_at is None:
                self._signal(r, signal.SIGTERM, "shutdown")
        deadline = time.monotonic() + self.settings.cancel_grace_s
        while self.running and time.monotonic() < deadline:
            self._reap()
            if self.running:
                signal.sigtimedwait({signal.SIGCHLD}, 0.05)
        for r in list(self.running.values()):
            self._kill_group(r.pid, signal.SIGKILL)
        while self.running:
            self._reap(block=True)

        def stopped() -> None:
            self._record_finished(raise_transient=True)
            with session(self.url) as s:
                row = s.get(WorkerRow, self.id)
                if row is not None:
                    row.stopped_at = utcnow()
                    s.add(row)

        try:
            retry_transient(stopped, what="recording the worker's stop", timeout_s=self.settings.heartbeat_timeout_s)
        except Exception as exc:
            if not is_transient(exc):
                raise
            # the next worker to start finds these jobs orphaned and re-queues them
            log.error(
                "database unavailable: could not record the end of jobs %s", [r.job_id for r, _ in self._finished]
            )
        log.info("worker %s stopped", self.id)

    # --- claiming and spawning --------------------------------------------------
    def _fill_slots(self) -> int:
        claimed = 0
        while not self._stopping and (self.free_cpu > 0 or self.free_serving > 0):
            job = queue.claim(self.id, self.free_cpu, self.free_gpu, self.free_serving, url=self.url)
            if job is None:
                break
            self._spawn(job)
            claimed += 1
        return claimed

    def _spawn(self, job: Job) -> None:
        assert job.id is not None
        workdir = job_dir(self.settings, job.id)
        workdir.mkdir(parents=True, exist_ok=True)
        for stale in (RESULT_FILE, ERROR_FILE):
            (workdir / stale).unlink(missing_ok=True)
        log_path = workdir / "job.log"
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the job process
            code = 1
            try:
                code = _child_main(job, workdir, log_path, parent, self.settings, self.url)
            finally:
                os._exit(code)
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass  # the child already did it
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:
            started = None
        deadline = time.monotonic() + job.timeout_s if job.timeout_s else None
        serving = job.kind in serving_kinds()
        self.running[pid] = Running(job.id, pid, job.cpu_slots, job.gpu_slots, workdir, deadline, serving=serving)
        queue.record_process(job.id, pid, started or 0.0, str(log_path), url=self.url)
        log.info("job %d (%s) attempt %d started as pid %d", job.id, job.kind, job.attempts, pid)

    # --- supervision --------------------------------------------------------------
    def _reap(self, block: bool = False) -> None:
        while self.running:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                self.running.clear()
                return
            if pid == 0:
                return
            r = self.running.pop(pid, None)
            if r is None:
                continue
            # Whatever the job left in its group goes with it.
            self._kill_group(pid, signal.SIGKILL)
            self._finished.append((r, os.waitstatus_to_exitcode(status)))
            if block:
                return

    def _record_finished(self, raise_transient: bool = False) -> None:
        """Record the exits reaped so far; one that cannot be recorded now (the database is out of
        reach) stays in the list and is tried again, so no job is left marked running."""
        while self._finished:
            r, code = self._finished[0]
            try:
                self._finish(r, code)
            except Exception as exc:
                if raise_transient or not is_transient(exc):
                    raise
                log.warning("job %d exited with %d; recording it when the database is back", r.job_id, code)
                return
            self._finished.pop(0)

    def _finish(self, r: Running, code: int) -> None:
        result = _read_json(r.workdir / RESULT_FILE)
        error = _read_json(r.workdir / ERROR_FILE) or {}
        if r.reason == "timeout":
            outcome = queue.Outcome(code, error=f"timed out after its wall-clock limit (exit {code})", cause="timeout")
        elif code == 0:
            outcome = queue.Outcome(0, result=result)
        elif r.reason == "shutdown" or (r.reason is None and code in (EXIT_STOPPED, -signal.SIGTERM)):
            outcome = queue.Outcome(code, interrupted=True, error="interrupted: the worker stopped")
        elif code == EXIT_DISK_FULL and r.reason is None:
            outcome = queue.Outcome(
                code, error=error.get("error") or disk_full_message(self.settings), cause="disk_full"
            )
        elif code == -signal.SIGKILL and r.reason is None:
            outcome = queue.Outcome(
                code, error="killed by SIGKILL, most often the kernel's out-of-memory killer", cause="oom"
            )
        else:
            outcome = queue.Outcome(
                code, error=error.get("error") or f"exited with code {code}", cause=error.get("cause") or "error"
            )
        status = queue.finish(
            r.job_id, outcome, expected_worker=self.id, backoff_s=self.settings.retry_backoff_s, url=self.url
        )
        log.info("job %d exited with %d: %s", r.job_id, code, status.value if status else "already recovered")

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now - self._last_cancel_check >= min(0.5, self.settings.worker_poll_interval_s * 2):
            self._last_cancel_check = now
            by_job = {r.job_id: r for r in self.running.values()}
            for job_id in queue.cancel_requested(list(by_job), url=self.url):
                r = by_job[job_id]
                if r.term_sent_at is None:
                    self._signal(r, signal.SIGTERM, "cancel")
            for r in self.running.values():
                if r.deadline is not None and now > r.deadline and r.term_sent_at is None:
                    self._signal(r, signal.SIGTERM, "timeout")
                if r.term_sent_at is not None and now - r.term_sent_at >= self.settings.cancel_grace_s:
                    self._kill_group(r.pid, signal.SIGKILL)
        if now - self._last_heartbeat >= self.settings.heartbeat_interval_s:
            self._last_heartbeat = now
            queue.heartbeat([r.job_id for r in self.running.values()], url=self.url)
            with session(self.url) as s:
                row = s.get(WorkerRow, self.id)
                if row is not None:
                    row.heartbeat_at = utcnow()
                    s.add(row)
            queue.recover_orphans(self.settings.heartbeat_timeout_s, exclude_worker=self.id, url=self.url)

    def _signal(self, r: Running, sig: signal.Signals, reason: str) -> None:
        r.reason = r.reason or reason
        r.term_sent_at = time.monotonic()
        log.info("job %d: sending %s to its process group (%s)", r.job_id, sig.name, reason)
        self._kill_group(r.pid, sig)

    @staticmethod
    def _kill_group(pgid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


_NO_SPACE = (
    "no space left on device",
    "os error 28",
    "disk quota exceeded",
    "os error 122",
    "database or disk is full",
)


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) says the disk or a quota is full; libraries
    that wrap the OS error (safetensors, tokenizers) keep only its text."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(marker in str(exc).lower() for marker in _NO_SPACE):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def disk_full_message(settings: Settings, detail: str = "") -> str:
    try:
        usage = shutil.disk_usage(settings.data_dir)
        room = f" ({usage.free / 2**20:.1f} MiB free of {usage.total / 2**20:.0f} MiB)"
    except OSError:
        room = ""
    return (
        f"disk full: no space left to write under the data directory {settings.data_dir}{room}; "
        f"free space in {settings.data_dir} (old checkpoints and logs under {settings.jobs_dir}, unused models) "
        "and run the job again" + (f". The write that failed: {detail}" if detail else "")
    )


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


# --- inside the job process ------------------------------------------------------


def _child_main(job: Job, workdir: Path, log_path: Path, parent: int, settings: Settings, url: str) -> int:
    os.setpgid(0, 0)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for sig in (signal.SIGINT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    if not die_with_parent(signal.SIGTERM, parent):
        return EXIT_STOPPED  # the worker died before we were set up
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    reset_engines()  # never reuse the worker's pooled connections
    root = logging.getLogger()
    root.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(settings.log_level)
    logger = logging.getLogger(f"posttrain.job.{job.id}")
    threads = job_threads(settings)
    logger.info(
        "=== job %d (%s) attempt %d, pid %d, %d torch threads ===", job.id, job.kind, job.attempts, os.getpid(), threads
    )
    try:
        return _run_job(job, workdir, settings, url, logger)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:  # the log's disk is full: the exit code, not an exception here, says how the job ended
                pass


def job_threads(settings: Settings) -> int:
    """Sets, and returns, the torch threads of this job process (``Settings.job_threads``): before torch is
    imported through the environment, after through torch itself (a worker that had imported it forks it)."""
    threads = settings.job_threads
    if threads is None:
        inherited = os.environ.get("OMP_NUM_THREADS", "")
        threads = (
            int(inherited)
            if inherited.isdigit() and int(inherited) > 0
            else max(1, (os.cpu_count() or 1) // settings.worker_cpu_slots)
        )
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    return threads


def _run_job(job: Job, workdir: Path, settings: Settings, url: str, logger: logging.Logger) -> int:
    assert job.id is not None

    def write_error(message: str, cause: str) -> None:
        tmp = workdir / f".{ERROR_FILE}.tmp"
        try:
            tmp.write_text(json.dumps({"error": message[:4000], "cause": cause}))
            os.replace(tmp, workdir / ERROR_FILE)
        except OSError as exc:  # a full disk: the exit code carries what it can
            logger.error("could not record the error in %s: %s", workdir, exc)
            tmp.unlink(missing_ok=True)

    try:
        kind = get_kind(job.kind)
        config = validate_config(job.kind, job.config)
    except JobConfigError as exc:
        logger.error("%s", exc)
        write_error(str(exc), "bad_input")
        return EXIT_BAD_INPUT
    ctx = JobContext(job.id, job.kind, config, job.attempts, job.checkpoint, workdir, settings, url=url)

    def on_term(_sig: int, _frame: Any) -> None:
        grace = settings.cancel_grace_s + 1.0
        logger.warning("SIGTERM received: stopping (SIGKILL to the whole group in %.1fs)", grace)
        ctx.request_stop()
        # Should the worker be gone, nobody else would escalate: do it ourselves.
        timer = threading.Timer(grace, os.killpg, args=(0, signal.SIGKILL))
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGTERM, on_term)
    try:
        result = kind.run(ctx, config)
    except JobStopped:
        logger.warning("stopped on request")
        return EXIT_STOPPED
    except (BadInput, ValidationError) as exc:
        logger.error("bad input: %s\n%s", exc, traceback.format_exc())
        write_error(f"{type(exc).__name__}: {exc}", "bad_input")
        return 1
    except TransientError as exc:
        logger.error("transient failure: %s\n%s", exc, traceback.format_exc())
        write_error(f"{type(exc).__name__}: {exc}", "transient")
        return 1
    except MemoryError:
        logger.error("out of memory\n%s", traceback.format_exc())
        write_error("MemoryError: the job ran out of memory", "oom")
        return 1
    except Exception as exc:  # the job's own failure: recorded, never raised into the worker
        logger.error("failed: %s\n%s", exc, traceback.format_exc())
        if is_disk_full(exc) or no_room_left(settings.data_dir):
            write_error(disk_full_message(settings, f"{type(exc).__name__}: {exc}"), "disk_full")
            return EXIT_DISK_FULL
        write_error(f"{type(exc).__name__}: {exc}", "error")
        return 1
    if ctx.should_stop:
        return EXIT_STOPPED
    tmp = workdir / f".{RESULT_FILE}.tmp"
    tmp.write_text(json.dumps(result_json(kind, result), default=str))
    os.replace(tmp, workdir / RESULT_FILE)
    logger.info("succeeded")
    return 0
