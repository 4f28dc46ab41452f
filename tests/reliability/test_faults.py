"""Faults: kill each process in turn at random points, restart PostgreSQL, fill the disk, corrupt a checkpoint.

After each fault: no job is left running, no metric step is lost or logged twice, training
resumes from the last good checkpoint, and every stored document and task is still there.

The kill moments come from a seeded random generator: ``POSTTRAIN_RELIABILITY_SEED`` fixes the
seed (a run prints it and records it with every fault, so a failure can be replayed); unset, each
run draws its own. ``POSTTRAIN_RELIABILITY_SOAK=1`` multiplies the number of kill points.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from conftest import OPERATOR, Reliability, start_worker, stop_worker, wait_deployed, wait_for
from required_parts import fail_missing
from sqlmodel import select

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Document, Job, JobStatus, Metric, Trajectory
from posttrain.platform.engines.launcher import free_port
from posttrain.platform.jobs import queue

pytestmark = pytest.mark.slow

BASE_SEED = int(os.environ.get("POSTTRAIN_RELIABILITY_SEED") or random.SystemRandom().randrange(1 << 31))


class SeededRandom(random.Random):
    """A random generator that remembers its seed (recorded with every fault)."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.seed_value = seed


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> SeededRandom:
    """A generator seeded from the run's seed and the test's name (printed, so a failure can be replayed)."""
    seed = BASE_SEED ^ zlib.crc32(request.node.name.encode())
    print(f"\n{request.node.name}: POSTTRAIN_RELIABILITY_SEED={BASE_SEED} (test seed {seed})")
    return SeededRandom(seed)


# --- what must survive every fault -----------------------------------------------------------


@dataclass(frozen=True)
class StoredData:
    documents: dict[int, tuple[str, str]]  # id -> (sha256, storage path)
    tasks: dict[int, tuple[str, str]]  # id -> (task_id, prompt)


def _png(seed: int) -> bytes:
    from PIL import Image

    image = Image.frombytes("RGB", (24, 24), random.Random(seed).randbytes(24 * 24 * 3))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def store_documents_and_tasks(url: str, count: int = 3) -> StoredData:
    """A few documents (their preprocessing cancelled: only the stored originals matter here) and a task set."""
    from posttrain.platform.documents import add_document
    from posttrain.platform.tasks.domains import generate
    from posttrain.platform.tasks.store import load_tasks, save_tasks

    documents = {}
    for i in range(count):
        added = add_document(OPERATOR, _png(i), filename=f"scan-{i}.png", url=url)
        if added.job_id is not None:
            queue.cancel(OPERATOR, added.job_id, url=url)
        documents[int(added.document.id)] = (added.document.sha256, added.document.storage_path)  # type: ignore[arg-type]
    save_tasks("faults", generate("format.to_hex", 4 * count, seed=7), source="reliability", url=url)
    tasks = {t.id: (t.spec.task_id or "", t.spec.prompt[0].content) for t in load_tasks(task_set="faults", url=url)}
    return StoredData(documents, tasks)


def check_stored(reliability: Reliability, stored: StoredData, url: str, after: str) -> None:
    from posttrain.platform.tasks.store import load_tasks

    with session(url, read_only=True) as s:
        rows = {d.id: d for d in s.exec(select(Document)).all()}
    lost_documents = 0
    for doc_id, (sha, path) in stored.documents.items():
        row = rows.get(doc_id)
        intact = (
            row is not None
            and row.sha256 == sha
            and Path(path).is_file()
            and hashlib.sha256(Path(path).read_bytes()).hexdigest() == sha
        )
        lost_documents += not intact
    now = {t.id: (t.spec.task_id or "", t.spec.prompt[0].content) for t in load_tasks(task_set="faults", url=url)}
    lost_tasks = sum(now.get(task_id) != value for task_id, value in stored.tasks.items())
    reliability.data_lost("documents", lost_documents, stored=len(stored.documents), after=after)
    reliability.data_lost("tasks", lost_tasks, stored=len(stored.tasks), after=after)
    assert lost_documents == 0 and lost_tasks == 0, (
        f"after {after}: {lost_documents} documents, {lost_tasks} tasks lost"
    )


def running_jobs(url: str) -> list[int]:
    return [j.id for j in queue.list_jobs(status=JobStatus.running, url=url)]  # type: ignore[misc]


def metric_steps(url: str, job_id: int) -> dict[str, Counter[int]]:
    with session(url, read_only=True) as s:
        rows = s.exec(select(Metric.name, Metric.step).where(Metric.job_id == job_id)).all()
    per_name: dict[str, Counter[int]] = {}
    for name, step in rows:
        per_name.setdefault(name, Counter())[step] += 1
    return per_name


def steps_done(url: str, job_id: int) -> int:
    return len(metric_steps(url, job_id).get("rollout/reward_mean", ()))


def check_metric_steps(reliability: Reliability, url: str, job_id: int, steps: int, names: tuple[str, ...]) -> None:
    """Every step of every metric exactly once, every step's trajectories once."""
    per_name = metric_steps(url, job_id)
    lost = duplicated = 0
    for name in names:
        counts = per_name.get(name, Counter())
        lost += sum(1 for step in range(1, steps + 1) if counts[step] == 0)
        duplicated += sum(n - 1 for n in counts.values() if n > 1) + sum(1 for step in counts if not 1 <= step <= steps)
    with session(url, read_only=True) as s:
        per_step = Counter(s.exec(select(Trajectory.step).where(Trajectory.job_id == job_id)).all())
    bad_trajectory_steps = [step for step in range(1, steps + 1) if per_step[step] != PER_STEP] + [
        step for step in per_step if not 1 <= step <= steps
    ]
    reliability.data_lost("metric steps", lost + duplicated, lost_steps=lost, duplicated_steps=duplicated,
                          bad_trajectory_steps=bad_trajectory_steps)  # fmt: skip
    assert (lost, duplicated, bad_trajectory_steps) == (0, 0, []), (
        f"job {job_id}: {lost} metric steps lost, {duplicated} duplicated; trajectory steps wrong: {bad_trajectory_steps}"
    )


# --- a real training run ---------------------------------------------------------------------

PER_STEP = 4
METRIC_NAMES = ("rollout/reward_mean", "rollout/pass_rate", "time/step_s", "pipeline/learner_busy_frac")


def grpo_config(steps: int, **overrides: object) -> dict[str, object]:
    return {
        "model": "tiny", "domains": ["format.to_hex"], "scheduler": {"batch_size": 2, "seed": 0},
        "group_size": 4, "max_new_tokens": 3, "lr": 1e-3, "max_steps": steps, "checkpoint_every": 1,
        "device": "cpu", "verifier_workers": 1, "trajectories_per_step": PER_STEP, **overrides,
    }  # fmt: skip


def register_tiny(tmp_path: Path) -> None:
    from test_training_tiny import tiny_policy_dir

    from posttrain.platform.models.registry import register_model

    register_model(OPERATOR, "tiny", tiny_policy_dir(tmp_path / "tiny", hidden=32, layers=1))


def checkpoints_of(job_id: int) -> Path:
    from posttrain.platform.settings import get_settings

    return get_settings().jobs_dir / str(job_id) / "run" / "checkpoints"


def wait_steps(url: str, job_id: int, at_least: int, timeout: float = 180) -> int:
    def reached() -> int:
        # the job read before its steps: one that had ended by then had logged every step it ever will (a resumed
        # run can finish its last steps within one poll, and then it did reach the step)
        job = queue.get_job(job_id, url=url)
        done = steps_done(url, job_id)
        if done >= at_least:
            return done
        assert not job.status.finished, (
            f"job {job_id} ended at step {done}, before step {at_least}: {job.status.value} {job.error}"
        )
        return 0

    return wait_for(reached, timeout=timeout, interval=0.1, message=f"job {job_id} to log step {at_least}")


def live_job(url: str, job_id: int) -> Job:
    try:
        return wait_for(lambda: (j := queue.get_job(job_id, url=url)).pid and queue.process_alive(j.pid, j.proc_started) and j,
                        timeout=60, message=f"job {job_id} to run")  # fmt: skip
    except AssertionError as exc:
        job = queue.get_job(job_id, url=url)
        raise AssertionError(
            f"{exc}: {job.status.value} attempt {job.attempts} pid {job.pid} error {job.error}\n"
            + queue.read_log(job, 40)
        ) from None


def gone(pid: int, started: float | None) -> bool:
    """Whether the process is over (exited, or a zombie waiting to be reaped)."""
    if not queue.process_alive(pid, started):
        return True
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def verifier_workers(job_pid: int) -> list[psutil.Process]:
    """The training run's verifier worker processes (spawned ``multiprocessing`` children)."""
    try:
        children = psutil.Process(job_pid).children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in children if "spawn_main" in " ".join(_cmdline(p))]


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


RESUMED = re.compile(r"the run resumes from checkpoint (\S+) \(step (\d+)\)( after skipping)?")


def resumes(job: Job) -> list[tuple[str, int, bool]]:
    """Each attempt's resume as its log tells it: (checkpoint, step, skipped a corrupt one)."""
    return [(m[1], int(m[2]), bool(m[3])) for m in RESUMED.finditer(queue.read_log(job, None))]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_training_run_survives_each_of_its_processes_killed(
    platform_env: dict[str, str], db_url: str, tmp_path: Path, rng: SeededRandom, reliability: Reliability
) -> None:
    """One GRPO run through the real worker; in turn, each at a random step and moment: its process
    group is SIGKILLed, a verifier (rollout-side) worker is SIGKILLed, the worker alone is SIGKILLed,
    and the machine "crashes" (worker and run at once) leaving the newest checkpoint torn. Each time
    the run resumes from the last good checkpoint; in the end every step is logged exactly once."""
    from posttrain.training.checkpoint import list_checkpoints

    stored = store_documents_and_tasks(db_url)
    register_tiny(tmp_path)
    schedule = ["run", "verifier", "worker", "crash"] * int(reliability.budget(1, 6))
    later = schedule[4:]
    rng.shuffle(later)  # the soak variant mixes the order after the first round
    schedule[4:] = later
    # Kill points are drawn by step (a step takes 0.07 s on an idle machine, 1 s on a busy one), the
    # moment within the step by time; the run is long enough to outlast the last one on either.
    spacing = 6
    steps = spacing * (len(schedule) + 2)
    job_id = queue.submit(OPERATOR, "train_grpo", grpo_config(steps), max_attempts=len(schedule) + 1)
    seed = rng.seed_value
    worker = start_worker(platform_env)
    try:
        for index, fault in enumerate(schedule):
            at = wait_steps(db_url, job_id, spacing * index + rng.randint(2, 4))
            time.sleep(rng.uniform(0, 0.3))
            job = live_job(db_url, job_id)
            resumed_before = len(resumes(job))
            if fault == "verifier":
                # the rollout side loses a verifier worker: the run goes on in the same attempt
                pid = job.pid or 0
                victims = wait_for(lambda: verifier_workers(pid), timeout=60, message="verifier workers")
                victims[0].kill()
                after = wait_steps(db_url, job_id, steps_done(db_url, job_id) + 2)
                same = queue.get_job(job_id).attempts == job.attempts
                reliability.fault("kill rollout verifier worker", survived=same, seed=seed, at_step=at, next_step=after)
                assert same, "killing one verifier worker restarted the whole run"
                continue
            corrupted = None
            if fault == "run":  # the run's whole process group; the worker retries it
                os.killpg(job.pid, signal.SIGKILL)  # type: ignore[arg-type]
            elif fault == "worker":  # the worker alone: the run stops with it; a new worker resumes it
                worker.kill()
                worker.wait()
                wait_for(lambda: gone(job.pid, job.proc_started), timeout=15, message="the run to stop")  # type: ignore[arg-type]
                worker = start_worker(platform_env)
            else:  # a crash of the machine that tears the newest checkpoint's weights
                worker.kill()
                os.killpg(job.pid, signal.SIGKILL)  # type: ignore[arg-type]
                worker.wait()
                wait_for(lambda: gone(job.pid, job.proc_started), timeout=15, message="the run gone")  # type: ignore[arg-type]
                found = list_checkpoints(checkpoints_of(job_id))
                assert len(found) >= 2, found
                corrupted, good = found[-1], found[-2]
                weights = corrupted / "model" / "model.safetensors"
                weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
                worker = start_worker(platform_env)
            # the next attempt resumes from the last good checkpoint and makes progress
            last_logged = steps_done(db_url, job_id)
            wait_for(lambda: len(resumes(queue.get_job(job_id))) > resumed_before, timeout=120,
                     message="the run resumed")  # fmt: skip
            checkpoint, step, skipped = resumes(queue.get_job(job_id))[-1]
            after = wait_steps(db_url, job_id, step + 1)
            if corrupted is None:
                good_resume = last_logged - 1 <= step <= last_logged and not skipped  # a checkpoint every step
                reliability.fault(f"kill {'training run' if fault == 'run' else 'worker'}", survived=good_resume, seed=seed,
                                  at_step=at, resumed_from=step, next_step=after)  # fmt: skip
                assert good_resume, f"killed after step {last_logged}, resumed from {checkpoint} (step {step})"
            else:
                fell_back = skipped and Path(checkpoint) == good
                reliability.fault("corrupt newest checkpoint", survived=fell_back, seed=seed, corrupted=corrupted.name,
                                  resumed_from=Path(checkpoint).name, next_step=after)  # fmt: skip
                assert fell_back, f"{corrupted.name} torn: resumed from {checkpoint}, not {good}"
                assert corrupted.name in queue.read_log(queue.get_job(job_id), None)  # the log names the bad one
        wait_for(lambda: queue.get_job(job_id).status.finished, timeout=300, message="the run to finish")
    finally:
        stop_worker(worker)
    job = queue.get_job(job_id)
    assert job.status is JobStatus.succeeded, job.error
    assert job.attempts == 1 + sum(f != "verifier" for f in schedule)
    assert job.result["steps"] == steps  # type: ignore[index]
    assert running_jobs(db_url) == []
    check_metric_steps(reliability, db_url, job_id, steps, METRIC_NAMES)
    check_stored(reliability, stored, db_url, "killing every process of a training run")


# --- the worker, killed again and again ------------------------------------------------------


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_worker_killed_at_random_points_leaves_no_job_behind(
    platform_env: dict[str, str], db_url: str, tmp_path: Path, rng: SeededRandom, reliability: Reliability
) -> None:
    """SIGKILL the worker at random moments while two jobs run, one of which ignores SIGTERM (so the
    parent-death signal does not stop it). Each restart must end the old attempt before the next one
    starts (never two executions of one job at once), and both jobs finish with every step counted once."""
    stored = store_documents_and_tasks(db_url)
    marks = tmp_path / "marks.txt"
    kills = int(reliability.budget(3, 20))
    per_kill = 10
    steps = per_kill * (kills + 2)
    config = {"steps": steps, "sleep_s": 0.2, "mark_file": str(marks)}
    jobs = [queue.submit(OPERATOR, "selftest", config, max_attempts=kills + 1),
            queue.submit(OPERATOR, "selftest", {**config, "ignore_sigterm": True}, max_attempts=kills + 1)]  # fmt: skip
    seed = rng.seed_value

    def counter(job_id: int) -> int:
        return int((queue.get_job(job_id).checkpoint or {}).get("counter", 0))

    worker = start_worker(platform_env)
    try:
        for kill in range(kills):
            target = kill * per_kill + rng.randint(2, per_kill - 2)
            wait_for(lambda: max(map(counter, jobs)) >= target, timeout=60, message=f"step {target}")
            running = [live_job(db_url, j) for j in jobs]
            time.sleep(rng.uniform(0.0, 0.2))
            worker.kill()
            worker.wait()
            worker = start_worker(platform_env)
            # the next attempt of each job must not overlap the previous one
            overlap = []
            for old in running:
                new = wait_for(lambda: (j := queue.get_job(old.id)).attempts > old.attempts and j.pid and j,  # type: ignore[arg-type]
                               timeout=60, message=f"job {old.id} re-run")  # fmt: skip
                if not gone(old.pid, old.proc_started):  # type: ignore[arg-type]
                    overlap.append((old.id, old.pid, new.pid))
            reliability.fault("kill worker", survived=not overlap, seed=seed, kill=kill, at_step=target,
                              overlapping_attempts=overlap)  # fmt: skip
            assert not overlap, f"old attempts still running next to their retries: {overlap}"
        wait_for(lambda: all(queue.get_job(j).status.finished for j in jobs), timeout=120, message="jobs done")
    finally:
        stop_worker(worker)
    for job_id in jobs:
        job = queue.get_job(job_id)
        assert job.status is JobStatus.succeeded, (job.status, job.error)
        assert (job.result or {})["counter"] == steps
        assert job.attempts == kills + 1
    executions = Counter(line.split()[0] for line in marks.read_text().splitlines())
    assert executions == {str(j): kills + 1 for j in jobs}
    assert running_jobs(db_url) == []
    check_stored(reliability, stored, db_url, "killing the worker")


# --- PostgreSQL restarted under a running training job -----------------------------------------


def _wait_quietly(predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    try:
        return bool(wait_for(predicate, timeout=timeout))
    except AssertionError:
        return False


def _stderr(proc: subprocess.Popen[bytes]) -> str:
    """The end of a stopped process's stderr."""
    return (
        proc.stderr.read().decode(errors="replace")[-3000:]
        if proc.stderr is not None and proc.poll() is not None
        else ""
    )


def restart_postgres() -> float:
    """``pg_ctlcluster 15 main restart -m fast`` and wait until it accepts connections; the outage in seconds."""
    import psycopg
    from conftest import _pg_conninfo

    started = time.monotonic()
    subprocess.run(
        ["pg_ctlcluster", "15", "main", "restart", "-m", "fast"], check=True, capture_output=True, timeout=120
    )
    wait_for(lambda: _pg_accepts(psycopg, _pg_conninfo()), timeout=60, interval=0.2, message="PostgreSQL back")
    return time.monotonic() - started


def _pg_accepts(psycopg, conninfo: str) -> bool:  # type: ignore[no-untyped-def]
    try:
        psycopg.connect(conninfo, connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return False


@pytest.mark.postgres
@pytest.mark.restarts_postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_postgres_restart_under_a_training_job(
    platform_env: dict[str, str], db_url: str, tmp_path: Path, rng: SeededRandom, reliability: Reliability
) -> None:
    """``pg_ctlcluster ... restart -m fast`` at a random step of a GRPO run: the worker and the run ride
    it out (their writes are retried until the server is back), the run finishes with every step
    logged once, nothing is left running and nothing stored is lost."""
    stored = store_documents_and_tasks(db_url)
    register_tiny(tmp_path)
    steps = 24
    job_id = queue.submit(OPERATOR, "train_grpo", grpo_config(steps))
    worker = start_worker(platform_env)
    try:
        at = wait_steps(db_url, job_id, rng.randint(1, 4))
        time.sleep(rng.uniform(0, 0.3))
        assert steps_done(db_url, job_id) < steps, "the run finished before PostgreSQL went down; make it longer"
        try:
            outage = restart_postgres()
        finally:
            # up again, whatever happened
            subprocess.run(["pg_ctlcluster", "15", "main", "start"], capture_output=True, timeout=120)
        finished = _wait_quietly(lambda: queue.get_job(job_id).status.finished, timeout=120)
        worker_alive = worker.poll() is None
    finally:
        stop_worker(worker)
    job = queue.get_job(job_id)
    survived = job.status is JobStatus.succeeded and worker_alive
    retried_writes = queue.read_log(job, None).count("the database is out of reach")
    reliability.fault("restart postgres", survived=survived, seed=rng.seed_value, at_step=at, outage_s=round(outage, 2),
                      attempts=job.attempts, worker_survived=worker_alive, job_writes_retried=retried_writes)  # fmt: skip
    assert finished, (
        f"job {job_id} still {job.status.value} (attempt {job.attempts}) two minutes after the restart;"
        f" worker alive: {worker_alive}\n{queue.read_log(job, 30)}\nworker: {_stderr(worker)}"
    )
    assert worker_alive, "the worker died with the database connection: " + _stderr(worker)
    assert job.status is JobStatus.succeeded, f"{job.error}\n{queue.read_log(job, 40)}"
    assert running_jobs(db_url) == []
    check_metric_steps(reliability, db_url, job_id, steps, METRIC_NAMES)
    check_stored(reliability, stored, db_url, "a PostgreSQL restart")


# --- a sandbox, killed mid tool call and while idle ---------------------------------------------


def kill_sandbox_part(pid: int, victim: str) -> list[psutil.Process]:
    """SIGKILL one part of a bubblewrap sandbox: the whole of it (its process group), its zygote, or
    the episode's interpreter. Returns the processes killed."""
    outer = psutil.Process(pid)
    tree = [outer, *outer.children(recursive=True)]
    if victim == "sandbox":
        os.killpg(pid, signal.SIGKILL)
        return tree
    pythons = []
    for p in tree[1:]:
        with contextlib.suppress(psutil.Error):  # an interpreter of the last episode may be on its way out
            if p.name().startswith("python"):
                pythons.append((p.create_time(), p.ppid(), p))
    pythons.sort(key=lambda t: t[0])
    zygote = pythons[0][2]
    # the episode's interpreter: the zygote's newest child
    target = zygote if victim == "zygote" else [p for _, ppid, p in pythons if ppid == zygote.pid][-1]
    target.kill()
    return [target]


@pytest.mark.requires("bubblewrap")
def test_sandbox_killed_mid_call_or_idle_fails_cleanly_and_is_replaced(
    rng: SeededRandom, reliability: Reliability
) -> None:
    """At random moments, SIGKILL the interpreter, the zygote or the whole bubblewrap sandbox, during
    a tool call or while the sandbox waits in the pool. A call in flight ends at once with a clear
    status (never OK, never a hang; INFRA when the sandbox itself died); an idle casualty is never
    lent out; the pool refills; a code verification hit by it is an infrastructure error, not a 0."""
    from posttrain.platform.sandbox import CallStatus, SandboxConfig, SandboxPool, ToolResult
    from posttrain.platform.tasks.domains import generate
    from posttrain.platform.verifiers import Verdict, VerifyContext, verify

    root = Path(tempfile.mkdtemp(prefix="posttrain-faults-"))
    root.chmod(0o755)
    seed = rng.seed_value
    kills = int(reliability.budget(8, 80))
    launched: dict[int, float] = {}  # host pid -> start time

    def note_launched() -> None:
        for pid in pool.host_pids():
            with contextlib.suppress(psutil.Error):
                launched.setdefault(pid, psutil.Process(pid).create_time())

    config = SandboxConfig(pool_size=2, call_timeout_s=10.0, kill_grace_s=0.5)
    try:
        with SandboxPool(config, data_dir=root) as pool:
            for kill in range(kills):
                assert pool.wait_ready(30), pool.status()
                note_launched()
                victim = rng.choice(["interpreter", "zygote", "sandbox"])
                when = rng.choice(["mid-call", "idle"])
                delay = rng.uniform(0.0, 0.8)
                if when == "idle":
                    psutil.wait_procs(kill_sandbox_part(rng.choice(pool.host_pids()), victim), timeout=10)
                    time.sleep(delay)
                    held = [pool.checkout(timeout=30) for _ in range(config.pool_size)]  # the casualty among them
                    try:
                        results = [sandbox.run_python("6 * 7") for sandbox in held]
                    finally:
                        for sandbox in held:
                            pool.release(sandbox)
                    bad = [r for r in results if r.status is not CallStatus.OK or r.value != "42"]
                    reliability.fault(f"kill sandbox {victim} (idle)", survived=not bad, seed=seed, kill=kill,
                                      failed_calls=[r.detail for r in bad])  # fmt: skip
                    assert not bad, f"a sandbox whose {victim} died while idle was lent out: {bad}"
                    continue
                with pool.acquire(timeout=30) as sandbox:
                    assert sandbox.run_python("x = 1").status is CallStatus.OK
                    out: dict[str, ToolResult] = {}
                    slow_call = functools.partial(sandbox.run_python, "import time; time.sleep(5)")
                    call = threading.Thread(target=lambda: out.update(r=slow_call()))
                    started = time.monotonic()
                    call.start()
                    time.sleep(delay)
                    kill_sandbox_part(sandbox.pid, victim)  # type: ignore[arg-type]
                    call.join(timeout=config.call_timeout_s + 5)
                    took = time.monotonic() - started
                    result = out.get("r")
                    expected = CallStatus.KILLED if victim == "interpreter" else CallStatus.INFRA
                    survived = result is not None and result.status is expected and took < delay + 3.0
                    reliability.fault(f"kill sandbox {victim} (mid-call)", survived=survived, seed=seed, kill=kill,
                                      after_s=round(delay, 3), returned_after_s=round(took, 3),
                                      status=getattr(result, "status", None), detail=getattr(result, "detail", None))  # fmt: skip
                    assert survived, f"killing the {victim} mid-call after {delay:.2f}s: {result} after {took:.1f}s"
                    assert result is not None and result.error is not None and result.detail
            # a code verification whose sandbox dies under it: an infrastructure error, never a score
            task = generate("code.add", 1, seed=seed)[0]
            slow = "import time\ntime.sleep(3)\ndef add(a, b):\n    return a + b\n"
            assert pool.wait_ready(30)
            verdicts: list[Verdict] = []
            check = functools.partial(verify, task, f"```python\n{slow}```", context=VerifyContext(sandbox_pool=pool))
            checker = threading.Thread(target=lambda: verdicts.append(check()))
            checker.start()
            wait_for(lambda: pool.status().busy, timeout=10, message="the verification to take a sandbox")
            time.sleep(rng.uniform(0.2, 1.0))
            for pid in pool.host_pids():  # every sandbox, the one running the tests among them
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            checker.join(timeout=30)
            (verdict,) = verdicts
            reliability.fault("kill sandbox under a code verification", survived=verdict.is_infra_error, seed=seed,
                              verdict=verdict.model_dump(exclude={"breakdown"}))  # fmt: skip
            assert verdict.is_infra_error and not verdict.passed, verdict
            # the pool is whole again: every slot runs code
            assert pool.wait_ready(30), pool.status()
            note_launched()
            held = [pool.checkout(timeout=10) for _ in range(config.pool_size)]
            assert all(s.run_python("2 + 2").value == "4" for s in held)
            for sandbox in held:
                pool.release(sandbox)
        leaked = [pid for pid, started in launched.items() if not gone(pid, started)]
        assert not leaked, f"sandbox processes outlived the pool: {leaked}"
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- the embedded serving engine, killed under traffic -------------------------------------------


def _serving_processes(job_pid: int) -> list[psutil.Process]:
    try:
        children = psutil.Process(job_pid).children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in children if "posttrain.platform.serving" in " ".join(_cmdline(p))]


def _deployment(url: str) -> tuple[str, bool]:
    from posttrain.platform.db.models import Deployment

    with session(url, read_only=True) as s:
        (row,) = s.exec(select(Deployment)).all()
        return row.status, row.healthy


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_serving_engine_killed_under_traffic_is_noticed_and_restarted(
    platform_env: dict[str, str], db_url: str, tmp_path: Path, rng: SeededRandom, reliability: Reliability
) -> None:
    """SIGKILL the model server a ``deploy`` job launched, at a random moment while requests flow
    through the gateway: no request hangs, each one either answers or fails fast with a clear 503,
    the deployment turns unhealthy, its job starts the server again on the same address, and
    requests succeed again, all within the same job attempt."""
    import httpx

    from posttrain.platform.serving.gateway import GatewayConfig, create_gateway_app
    from posttrain.platform.serving.jobs import registered_deployments
    from posttrain.platform.serving.server import serve_in_thread

    stored = store_documents_and_tasks(db_url)
    register_tiny(tmp_path)
    seed = rng.seed_value
    deploy_id = queue.submit(OPERATOR, "deploy", {"model": "tiny", "tier": "fast"})
    worker = start_worker(platform_env)
    outcomes: list[tuple[float, float, int, str]] = []  # (sent at, seconds, status, error message)
    stop = threading.Event()
    try:
        wait_deployed(deploy_id, timeout=180)
        gateway = serve_in_thread(create_gateway_app(GatewayConfig(deployments=[], health_interval_s=0.5),
                                                     refresh=registered_deployments))  # fmt: skip
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}

        def traffic() -> None:
            with httpx.Client(base_url=gateway.base_url, timeout=30) as client:
                while not stop.is_set():
                    sent = time.monotonic()
                    try:
                        r = client.post("/v1/chat/completions", json=body, headers={"x-posttrain-tier": "fast"})
                        message = "" if r.status_code == 200 else str(r.json().get("error", {}).get("message"))
                        outcomes.append((sent, time.monotonic() - sent, r.status_code, message))
                    except httpx.HTTPError as exc:
                        outcomes.append((sent, time.monotonic() - sent, 0, repr(exc)))
                    time.sleep(0.05)

        with gateway:
            wait_for(
                lambda: httpx.get(gateway.base_url + "/v1/models").json()["data"], timeout=30, message="gateway routes"
            )
            sender = threading.Thread(target=traffic, daemon=True)
            sender.start()
            wait_for(lambda: any(o[2] == 200 for o in outcomes), timeout=60, message="a first answer")
            time.sleep(rng.uniform(0.0, 2.0))
            job = queue.get_job(deploy_id)
            (server,) = _serving_processes(job.pid)  # type: ignore[arg-type]
            killed_at = time.monotonic()
            server.kill()
            states = []
            wait_for(lambda: states.append(_deployment(db_url)) or states[-1] == ("unhealthy", False), timeout=30,
                     message="the deployment marked unhealthy")  # fmt: skip
            wait_for(lambda: _deployment(db_url) == ("running", True), timeout=180, message="the server restarted")
            back = wait_for(lambda: [o for o in outcomes if o[0] > killed_at and o[2] == 200], timeout=60,
                            message="answers again")  # fmt: skip
            stop.set()
            sender.join(timeout=60)
        job = queue.get_job(deploy_id)
        servers = [(p.pid, p.create_time()) for p in _serving_processes(job.pid)]  # type: ignore[arg-type]
        assert len(servers) == 1, servers
        queue.cancel(OPERATOR, deploy_id)
        wait_for(lambda: queue.get_job(deploy_id).status.finished, timeout=60, message="deploy stopped")
    finally:
        stop.set()
        stop_worker(worker)
    during = [o for o in outcomes if o[0] > killed_at - 30 and o[0] < back[0][0]]
    hung = [o for o in during if o[1] > 10]
    unclear = [o for o in during if o[2] not in (200, 503) or (o[2] == 503 and "tiny" not in o[3])]
    refused = sum(o[2] == 503 for o in during)
    survived = job.status is JobStatus.running and job.attempts == 1 and not hung and not unclear
    reliability.fault("kill serving engine", survived=survived, seed=seed, requests=len(outcomes), failed_fast=refused,
                      hung=len(hung), unclear=unclear[:3], down_s=round(back[0][0] - killed_at, 2))  # fmt: skip
    assert not hung, f"requests hung after the server was killed: {hung[:3]}"
    assert not unclear, f"requests failed without a clear 503: {unclear[:3]}"
    assert job.attempts == 1, "the server's death cost the whole deploy job an attempt"
    assert queue.get_job(deploy_id).status is JobStatus.cancelled
    assert "restarting it" in queue.read_log(queue.get_job(deploy_id), None)
    assert running_jobs(db_url) == []
    assert all(gone(pid, started) for pid, started in servers), "the restarted server outlived its deployment"
    check_stored(reliability, stored, db_url, "killing the serving engine")


# --- the console, killed under a running job -----------------------------------------------------


def _console_up(base: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{base}/_stcore/health", timeout=2).text == "ok"
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_console_killed_under_a_running_job(
    platform_env: dict[str, str], db_url: str, tmp_path: Path, rng: SeededRandom, reliability: Reliability
) -> None:
    """``posttrain up`` with a job running; SIGKILL the console (Streamlit) at a random moment. The
    worker and the job go on as if nothing happened (same process, same attempt, same pace) and
    the console comes back."""
    stored = store_documents_and_tasks(db_url)
    seed = rng.seed_value
    port = free_port()
    env = {
        **os.environ,
        **platform_env,
        "POSTTRAIN_CONSOLE_PORT": str(port),
        "POSTTRAIN_GATEWAY_PORT": str(free_port()),
    }
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "up.log").open("w")
    up = subprocess.Popen(
        [sys.executable, "-m", "posttrain.platform.cli", "up"], env=env, stdout=log, stderr=subprocess.STDOUT
    )

    job_id = 0

    def counter() -> int:
        return int((queue.get_job(job_id).checkpoint or {}).get("counter", 0))

    def pace(seconds: float) -> float:
        first, started = counter(), time.monotonic()
        time.sleep(seconds)
        return (counter() - first) / (time.monotonic() - started)

    try:
        wait_for(lambda: _console_up(base), timeout=120, interval=0.5, message="the console")
        job_id = queue.submit(OPERATOR, "selftest", {"steps": 100, "sleep_s": 0.1})
        job = live_job(db_url, job_id)
        wait_for(lambda: counter() >= 3, timeout=30, message="the job under way")
        before = pace(1.0)
        consoles = [p for p in psutil.Process(up.pid).children() if "streamlit" in " ".join(_cmdline(p))]
        assert len(consoles) == 1, consoles
        time.sleep(rng.uniform(0.0, 1.0))
        consoles[0].kill()
        wait_for(lambda: not _console_up(base), timeout=10, message="the console down")
        after = pace(1.0)
        still_up = up.poll() is None
        came_back = _wait_quietly(lambda: _console_up(base), timeout=120)
        finished = _wait_quietly(lambda: queue.get_job(job_id).status.finished, timeout=60)
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
        log.close()
    end = queue.get_job(job_id)
    unaffected = end.status is JobStatus.succeeded and end.attempts == 1 and after >= 0.5 * before
    reliability.fault("kill console", survived=unaffected and came_back and still_up, seed=seed,
                      steps_per_s_before=round(before, 2), steps_per_s_after=round(after, 2),
                      console_back=came_back, up_survived=still_up)  # fmt: skip
    assert still_up, (
        "`posttrain up` stopped everything when the console died:\n" + (tmp_path / "up.log").read_text()[-2000:]
    )
    assert finished and end.status is JobStatus.succeeded and end.attempts == 1, (end.status, end.attempts, end.error)
    assert end.pid is None and job.pid is not None
    assert after >= 0.5 * before, f"the job slowed from {before:.1f} to {after:.1f} steps/s after the console died"
    assert came_back, "the console did not come back"
    assert running_jobs(db_url) == []
    check_stored(reliability, stored, db_url, "killing the console")


# --- the data directory's disk fills up under a training job --------------------------------------


@contextlib.contextmanager
def small_disk(path: Path, size_mb: int) -> Iterator[Path]:
    """A size-limited filesystem (tmpfs) mounted at ``path``, unmounted afterwards whatever happens.

    Mounting needs root (CAP_SYS_ADMIN), which the suite has in its container and under ``sudo``;
    without it the test fails with that fix, never skips (the README counts this fault as survived)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs", str(path)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        fail_missing("mount rights", f"mount -t tmpfs at {path} failed: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path) -> Path:
    """Grow one file under ``path`` until the disk says no more (again: tops it up)."""
    filler = path / "filler.bin"
    with filler.open("ab", buffering=0) as fh:
        for chunk in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    fh.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == 28, exc
    return filler


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_disk_full_fails_the_job_clearly_and_loses_nothing(
    platform_env: dict[str, str],
    db_url: str,
    tmp_path: Path,
    rng: SeededRandom,
    reliability: Reliability,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The data directory on a 24 MiB filesystem; a GRPO run checkpoints every step; at a random step
    the disk is filled and kept full. The run fails at once with a "disk full ... free space in <dir>" cause (no
    retries burnt, nothing left running), the checkpoints and documents written before are intact,
    and once space is freed a new run continues from the last good checkpoint."""
    from posttrain.platform.documents import add_document
    from posttrain.platform.settings import get_settings
    from posttrain.preprocess.errors import StorageFull
    from posttrain.training.checkpoint import list_checkpoints, load_checkpoint
    from posttrain.training.modeling import load_policy

    seed = rng.seed_value
    with small_disk(tmp_path / "disk", 24) as data:
        env = {**platform_env, "POSTTRAIN_DATA_DIR": str(data)}
        monkeypatch.setenv("POSTTRAIN_DATA_DIR", str(data))
        get_settings.cache_clear()
        stored = store_documents_and_tasks(db_url)
        register_tiny(tmp_path)
        steps = 20
        job_id = queue.submit(OPERATOR, "train_grpo", grpo_config(steps))
        worker = start_worker(env)
        try:
            at = wait_steps(db_url, job_id, rng.randint(2, 4))
            assert steps_done(db_url, job_id) < steps, "the run finished before the disk filled; make it longer"
            filler = fill(data)
            # kept full, as a disk another writer fills stays: what the run frees by removing its oldest checkpoint
            # is taken again at once (filled once, a fill landing between the run's new checkpoint and that removal
            # left it exactly one checkpoint of room a step, and it finished all its steps)
            deadline = time.monotonic() + 90
            while not (failed := queue.get_job(job_id).status.finished) and time.monotonic() < deadline:
                fill(data)
                time.sleep(0.02)
            job = queue.get_job(job_id)
            clear = (job.status is JobStatus.failed and job.error_cause == "disk_full" and "disk full" in (job.error or "")
                     and f"free space in {data}" in (job.error or ""))  # fmt: skip
            reliability.fault("disk full", survived=failed and clear and job.attempts == 1, seed=seed, at_step=at,
                              status=job.status.value, cause=job.error_cause, error=(job.error or "")[:300])  # fmt: skip
            assert failed, (
                f"job {job_id} still {job.status.value} 90 s after the disk filled:\n{queue.read_log(job, 30)}"
            )
            assert clear, (job.status, job.error_cause, job.error)
            assert job.attempts == 1, "a full disk was retried"
            assert running_jobs(db_url) == []
            # an upload meanwhile is refused with the cause and the fix, and leaves no partial file (the failed
            # job cleaned its half-written checkpoint up, freeing a little: fill that too)
            fill(data)
            with pytest.raises(StorageFull, match=f"(?s)no space left.*free space in {data}"):
                add_document(OPERATOR, _png(seed + 1000), filename="while-full.png", url=db_url)
            assert not list((data / "documents" / "incoming").glob(".ingest-*"))
            check_stored(reliability, stored, db_url, "the disk filling up")
            # what was written before the disk filled is whole: each checkpoint left loads
            found = list_checkpoints(checkpoints_of(job_id))
            assert found, "no checkpoint survived"
            model, _ = load_policy(tmp_path / "tiny")
            damaged = []
            for checkpoint in found:
                try:
                    load_checkpoint(checkpoint, model)
                except Exception as exc:  # noqa: BLE001
                    damaged.append(f"{checkpoint.name}: {exc}")
            reliability.data_lost("checkpoints", len(damaged), kept=len(found))
            assert not damaged, damaged
            last_good = int(found[-1].name.split("_")[1])

            # space freed: the platform works again, and the run continues from its last good checkpoint
            filler.unlink()
            again = queue.submit(
                OPERATOR, "train_grpo", grpo_config(steps, output_dir=str(checkpoints_of(job_id).parent))
            )
            wait_for(lambda: queue.get_job(again).status.finished, timeout=240, message="the resumed run")
        finally:
            stop_worker(worker)
        resumed = queue.get_job(again)
        assert resumed.status is JobStatus.succeeded, resumed.error
        assert resumed.result["resumed_from"] == last_good  # type: ignore[index]
        per_name = metric_steps(db_url, again)
        assert all(
            sorted(per_name[name].elements()) == list(range(last_good + 1, steps + 1)) for name in METRIC_NAMES
        ), per_name
        check_stored(reliability, stored, db_url, "freeing the disk")
        get_settings.cache_clear()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_job_that_fails_while_the_disk_is_full_says_so_whatever_its_error(
    platform_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A write on a full disk does not always fail with ENOSPC's text (torch.save says "file write failed", a
    helper process just exits 1), and the job then cannot write its error file or its log either: a job that
    fails while the data directory has no room left is a disk-full failure, not retried, naming where to free
    space, and its exit code survives the log's last flush failing (that flush used to raise, exit 1, and turn
    the disk-full reliability test's GRPO run into a plain "exited with code 1"). The same failure with room left
    stays the job's own error."""
    from posttrain.platform.settings import get_settings

    with small_disk(tmp_path / "disk", 4) as data:
        env = {**platform_env, "POSTTRAIN_DATA_DIR": str(data)}
        monkeypatch.setenv("POSTTRAIN_DATA_DIR", str(data))
        get_settings.cache_clear()
        worker = start_worker(env)
        try:
            failing = {"steps": 2, "sleep_s": 0, "fail_at_step": 1}
            roomy = queue.submit(OPERATOR, "selftest", failing)
            wait_for(lambda: queue.get_job(roomy).status.finished, timeout=60, message="the job with room left")
            job = queue.get_job(roomy)
            assert job.status is JobStatus.failed and job.error_cause == "error", (job.error_cause, job.error)
            assert "selftest failing on purpose" in (job.error or "")

            filler = fill(data)
            full = queue.submit(OPERATOR, "selftest", failing)
            wait_for(lambda: queue.get_job(full).status.finished, timeout=60, message="the job on a full disk")
            job = queue.get_job(full)
            assert job.status is JobStatus.failed and job.error_cause == "disk_full", (job.error_cause, job.error)
            assert "disk full" in (job.error or "") and f"free space in {data}" in (job.error or ""), job.error
            assert job.attempts == 1, "a full disk was retried"
            filler.unlink()
        finally:
            stop_worker(worker)
            get_settings.cache_clear()
