"""``rollout: {backend: process, workers: N}``: pipelined GRPO rollouts in local worker processes.

    train_grpo(GRPOConfig(model="runs/sft/model", domains=["str.copy.letters"],
                          rollout={"backend": "process", "workers": 1}))  # threads / learner_threads: an even split

A rollout thread in the learner's process (:mod:`~posttrain.training.rollouts.thread`) competes
with the update for the interpreter lock and shares torch's thread pool with it; Ray actors
(:mod:`~posttrain.training.rollouts.ray`) bring daemons of their own. :class:`ProcessRollouts`
is the local middle: the same contract (``next_batch``, ``publish``, ``close``) and the same
staleness accounting (:func:`~posttrain.training.rollouts.base.assemble_batch`), with

- ``workers`` worker processes (from a ``forkserver`` that imported torch once: forking the learner
  after torch started its threads is unsafe), each a
  :class:`~posttrain.training.rollouts.base.PolicySampler` with its own frozen copy of the
  policy (loaded from the model directory, or the learner's model shipped once at start when no
  directory holds it, e.g. with LoRA) and its own torch thread count (:func:`thread_split`);
- :class:`SharedWeights`: after every update the learner copies its weights into shared memory,
  tagged with the policy version; each worker loads the latest version before each batch (never a
  half-written copy) and tags its groups with the version it really loaded;
- a pump thread in the learner's process that hands task batches from the scheduler to the
  workers, receives the generated groups (token ids and behaviour log-probs) and submits each group
  to the learner's VerifierService at once. It asks for no more batches than the learner can take
  before they go stale (``max_off_policy_steps``, see :func:`~posttrain.training.rollouts.base.in_flight_limit`),
  at most ``workers + queue_size`` and two per worker (one sampling, one waiting): a worker that
  ran further ahead would only sample batches the learner drops, on cores the learner needs;
- a worker process that dies (killed, out of memory) is replaced and its batches go to its
  successor, a few times at most (then the run fails with the exit code); an exception inside a
  worker (a bad model directory, a bug) fails the run with the worker's traceback. ``close`` stops
  every worker process, and a worker whose learner disappears exits on its own.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import signal
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing  # registers the shared-memory reductions of tensors

from posttrain.platform import metric_names as names
from posttrain.platform.supervise import start_worker, worker_context
from posttrain.platform.verifiers import TaskSpec
from posttrain.training.config import GRPOConfig, ProcessRollout
from posttrain.training.modeling import frozen_copy
from posttrain.training.rollout import SamplingConfig, submit_verification
from posttrain.training.rollouts.base import (
    Generated,
    PolicySampler,
    ReadyBatches,
    RolloutBatch,
    RolloutSetup,
    assemble_batch,
    in_flight_limit,
)

BATCHES_PER_WORKER = 2  # one sampling, one waiting behind it
LOCK_TIMEOUT_S = 30.0  # the weights' lock is held for a few integer operations; longer means a holder died
STOP_GRACE_S = 2.0  # close(): a worker between batches exits at once; one mid-batch is terminated after this
_ALIGN = 64  # byte alignment of each tensor in the shared buffer


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def thread_split(config: GRPOConfig, cores: int | None = None) -> tuple[int, int]:
    """``(torch threads of each rollout process, the learner's)``: the config's, else the cores split evenly
    between the learner and the rollout processes (at least one each; 2 cores, 1 process: 1 and 1)."""
    cores = cores or available_cores()
    spec = config.rollout
    assert isinstance(spec, ProcessRollout), "thread_split is for the process backend"
    processes = spec.workers
    rollout = spec.threads or max(1, cores // (processes + 1))
    learner = spec.learner_threads or max(1, cores - processes * rollout)
    return rollout, learner


# ===================================================================== weights in shared memory
class SharedWeights:
    """The learner's latest weights in shared memory, readable by worker processes at any time.

    Two copies (slots), each one shared byte buffer holding every tensor of the state dict, and per
    slot a sequence number (odd while the learner writes it) and the policy version it holds. The
    learner writes the slot that is not the latest, then makes it the latest: a reader copies the
    latest slot and reads again if that slot's sequence number changed meanwhile (the learner
    published twice during the copy), so a worker never samples with half-written weights. The small
    metadata is read and written under a lock (which also orders the memory accesses), never held
    during a copy, so neither side waits for the other's copy.
    """

    def __init__(self, state: dict[str, torch.Tensor], lock: Any) -> None:
        self.layout: list[tuple[str, int, tuple[int, ...], torch.dtype]] = []
        offset = 0
        for key, tensor in state.items():
            self.layout.append((key, offset, tuple(tensor.shape), tensor.dtype))
            offset += -(-tensor.numel() * tensor.element_size() // _ALIGN) * _ALIGN
        self.buffer = torch.zeros(2, max(offset, _ALIGN), dtype=torch.uint8).share_memory_()
        self.meta = torch.tensor([-1, 0, -1, 0, -1], dtype=torch.int64).share_memory_()  # latest; seq, version per slot
        self.lock = lock
        self._views: list[dict[str, torch.Tensor]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_views": None}

    def _slot_views(self, slot: int) -> dict[str, torch.Tensor]:
        if self._views is None:
            self._views = [
                {
                    key: self.buffer[s, off : off + _numel(shape) * dtype.itemsize].view(dtype).view(shape)
                    for key, off, shape, dtype in self.layout
                }
                for s in (0, 1)
            ]
        return self._views[slot]

    @contextlib.contextmanager
    def _locked(self) -> Any:
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise RuntimeError(
                f"the shared weights' lock was held for over {LOCK_TIMEOUT_S:g} s: a rollout worker "
                "process died holding it"
            )
        try:
            yield
        finally:
            self.lock.release()

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Copy ``state`` (the learner's state dict, on any device) in as ``version`` (learner side)."""
        with self._locked():
            latest = int(self.meta[0])
            slot = 0 if latest < 0 else 1 - latest
            self.meta[1 + 2 * slot] += 1  # odd: being written
        views = self._slot_views(slot)
        with torch.no_grad():
            for key, tensor in state.items():
                views[key].copy_(tensor.detach())
        with self._locked():
            self.meta[1 + 2 * slot] += 1
            self.meta[2 + 2 * slot] = version
            self.meta[0] = slot

    def latest_version(self) -> int:
        with self._locked():
            latest = int(self.meta[0])
            return -1 if latest < 0 else int(self.meta[2 + 2 * latest])

    def load_latest(self, sampler: PolicySampler) -> None:
        """Load the latest published weights into ``sampler`` unless it holds them already (worker side)."""
        while True:
            with self._locked():
                slot = int(self.meta[0])
                if slot < 0:
                    return
                seq, version = int(self.meta[1 + 2 * slot]), int(self.meta[2 + 2 * slot])
            if version == sampler.version:
                return
            sampler.load(self._slot_views(slot), version)
            with self._locked():
                if int(self.meta[1 + 2 * slot]) == seq:
                    return
            sampler.version = -1  # overwritten during the copy: read the newer one


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# ===================================================================== the worker process
def _worker_main(
    conn: Connection,
    tasks: Any,
    weights: SharedWeights,
    recipe: str | tuple[Any, Any],
    group_size: int,
    sampling: SamplingConfig,
    device: str,
    seed: int,
    threads: int,
) -> None:
    """A rollout worker process: ``(batch id, tasks)`` in from ``tasks``, ``("done", batch id, Generated)`` out
    on ``conn``; ``None`` stops it, and so does its learner's end of ``conn`` closing."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the learner, which stops the workers
    torch.set_num_threads(threads)
    try:
        sampler = PolicySampler.from_recipe(recipe, group_size, sampling, device, seed)
        conn.send(("ready", os.getpid()))
        while True:
            try:
                job = tasks.get(timeout=1.0)
            except queue.Empty:
                if conn.poll():  # the learner never writes here: readable means its end closed
                    return
                continue
            if job is None:
                return
            batch_id, batch = job
            weights.load_latest(sampler)
            conn.send(("done", batch_id, sampler.sample(batch)))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the learner is gone
    except BaseException:  # noqa: BLE001 - reported to the learner, which fails the run with it
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc()))


# ===================================================================== learner side
def _context() -> Any:
    """Worker processes come from a fork server that has imported torch, transformers and this module once:
    forking the learner itself after torch started its threads is unsafe, and a fresh interpreter per
    worker (``spawn``) pays those imports, seconds, for every worker and every replacement."""
    return worker_context(__name__)


@dataclass
class _Worker:
    slot: int
    incarnation: int
    process: Any
    conn: Connection
    tasks: Any  # a multiprocessing queue: puts never block the pump
    pending: dict[int, list[TaskSpec]] = field(default_factory=dict)  # batch id -> tasks, sent and not answered
    pid: int | None = None
    version: int = -1  # the version of its last batch


@dataclass
class ProcStats:
    replaced_workers: int = 0
    requeued_batches: int = 0
    publish_s: float = 0.0


class ProcessRollouts:
    """Rollout worker processes fed from shared-memory weights; see the module docstring."""

    def __init__(self, setup: RolloutSetup) -> None:
        config, model, source = setup.config, setup.model, setup.source
        if not isinstance(config.rollout, ProcessRollout):
            raise ValueError("ProcessRollouts needs rollout: {backend: process}")
        assert setup.service is not None and setup.executor is not None
        self.scheduler, self.service, self.executor, self.config = (
            setup.scheduler,
            setup.service,
            setup.executor,
            config,
        )
        self.bound = config.rollout
        self.stats = ProcStats()
        self.rollout_threads, self.learner_threads = thread_split(config)
        self._context = _context()
        self._device = str(next(model.parameters()).device)
        if isinstance(source, (str, Path)) and config.lora is None and config.chat_template is None:
            self._recipe: str | tuple[Any, Any] = str(Path(source).resolve())
        else:  # no directory holds these weights' architecture (a given model, LoRA) or the run's template: ship the model once
            self._recipe = (frozen_copy(model).to("cpu"), setup.tokenizer)
        self.weights = SharedWeights(model.state_dict(), self._context.Lock())
        self.weights.publish(model.state_dict(), setup.version)
        self._max_replacements = max(4, 2 * self.bound.workers)
        self._ids = itertools.count()
        # sampled, verification submitted, not yet taken
        self.ready = ReadyBatches("the rollout worker processes", lambda: self._pump_thread.is_alive())
        self._retry: deque[list[TaskSpec]] = deque()
        self._wake_r, self._wake_w = self._context.Pipe(duplex=False)
        self._stop = threading.Event()
        self._closed = False
        self._workers: list[_Worker] = []
        self._previous_threads = torch.get_num_threads()
        torch.set_num_threads(self.learner_threads)
        try:
            self._workers = [self._spawn(slot, 0) for slot in range(self.bound.workers)]
        except BaseException:
            self.close()
            raise
        self._pump_thread = threading.Thread(target=self._pump, name="posttrain-rollout-pump", daemon=True)
        self._pump_thread.start()

    # ------------------------------------------------------------ processes (pump thread)
    def _spawn(self, slot: int, incarnation: int) -> _Worker:
        parent, child = self._context.Pipe(duplex=True)
        tasks = self._context.Queue()
        process = start_worker(
            self._context,
            _worker_main,
            name=f"posttrain-rollout-{slot}.{incarnation}",
            args=(
                child,
                tasks,
                self.weights,
                self._recipe,
                self.config.algorithm.group_size,
                self.config.sampling,
                self._device,
                self.config.seed + 1 + slot + 1000 * incarnation,
                self.rollout_threads,
            ),
        )
        child.close()
        return _Worker(slot, incarnation, process, parent, tasks)

    def _retire(self, worker: _Worker) -> None:
        with contextlib.suppress(Exception):
            worker.tasks.put(None)
        worker.process.join(timeout=STOP_GRACE_S)
        if worker.process.is_alive():
            worker.process.terminate()
            worker.process.join(timeout=5)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(timeout=5)
        worker.conn.close()
        worker.tasks.cancel_join_thread()  # what it never read must not hold up this process's exit
        worker.tasks.close()

    def _lost(self, worker: _Worker) -> None:
        """``worker``'s process died: give its batches to a new process in its slot (a few times per run)."""
        if self._workers[worker.slot] is not worker:
            return
        worker.process.join(timeout=5)
        code = worker.process.exitcode
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        self.stats.replaced_workers += 1
        if self.stats.replaced_workers > self._max_replacements:
            raise RuntimeError(
                f"rollout worker processes keep dying ({self._max_replacements} replaced); "
                f"the last ({worker.process.name}, pid {worker.pid}) ended: {how}"
            )
        self._retry.extend(worker.pending.values())
        self.stats.requeued_batches += len(worker.pending)
        worker.pending.clear()
        self._retire(worker)
        self._workers[worker.slot] = self._spawn(worker.slot, worker.incarnation + 1)

    def _limit(self) -> int:
        """How many batches may be out now (:func:`~posttrain.training.rollouts.base.in_flight_limit`)."""
        return in_flight_limit(self.bound, self.ready.waiting, len(self._workers) + self.bound.queue_size)

    def _fill(self) -> None:
        """Hand out task batches, up to :meth:`_limit` and two per worker."""
        with self.ready.cond:  # the learner's state and the ready batches as one
            while sum(len(w.pending) for w in self._workers) + len(self.ready) < self._limit():
                worker = min(self._workers, key=lambda w: len(w.pending))
                if len(worker.pending) >= BATCHES_PER_WORKER:
                    return
                tasks = self._retry.popleft() if self._retry else list(self.scheduler.next_batch())
                batch_id = next(self._ids)
                worker.pending[batch_id] = tasks
                worker.tasks.put((batch_id, tasks))

    def _receive(self, worker: _Worker) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            self._lost(worker)
            return
        if message[0] == "ready":
            worker.pid = message[1]
        elif message[0] == "done":
            _, batch_id, generated = message
            if worker.pending.pop(batch_id, None) is None:
                return  # already handed to a successor
            worker.version = generated.version
            for group in generated.groups:
                submit_verification(self.executor, self.service, group, self.config.verifier_timeout_s)
            self.ready.put(generated)
        elif message[0] == "error":
            raise RuntimeError(f"a rollout worker process ({worker.process.name}) failed:\n{message[1]}")

    def _pump(self) -> None:
        try:
            while not self._stop.is_set():
                self._fill()
                conns = {w.conn: w for w in self._workers}
                ended = {w.process.sentinel: w for w in self._workers}
                ready = wait([self._wake_r, *conns, *ended], timeout=1.0)
                if self._wake_r in ready:
                    while self._wake_r.poll():
                        self._wake_r.recv_bytes()
                for conn in conns:
                    if conn in ready and not self._stop.is_set():
                        self._receive(conns[conn])
                for sentinel, worker in ended.items():
                    if sentinel in ready and not self._stop.is_set():
                        while self._workers[worker.slot] is worker and worker.conn.poll():
                            self._receive(worker)  # what it sent before it died
                        self._lost(worker)
        except BaseException as exc:  # noqa: BLE001 - handed to the learner, which raises it
            self.ready.fail(exc)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send_bytes(b"")

    # ------------------------------------------------------------ the loop's interface (learner thread)
    def _take(self) -> Generated:
        item = self.ready.take(on_waiting=self._wake)
        self._wake()  # the next batch may be asked for
        return item

    def next_batch(self, version: int) -> RolloutBatch:
        out = RolloutBatch(queue_depth=len(self.ready))
        assemble_batch(out, self._take, version, self.config, self.scheduler)
        out.extra = {
            names.BATCHES_IN_FLIGHT: float(sum(len(w.pending) for w in self._workers)),
            names.PUBLISH_S: self.stats.publish_s,
            names.WORKERS_REPLACED: float(self.stats.replaced_workers),
            names.BATCHES_REDONE: float(self.stats.requeued_batches),
        }
        return out

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """Copy the new weights into shared memory; each worker loads them before its next batch."""
        started = time.perf_counter()
        self.weights.publish(model.state_dict(), version)
        self.stats.publish_s = time.perf_counter() - started

    def worker_versions(self) -> list[int]:
        """The policy version of each worker's last batch (-1: none yet)."""
        return [w.version for w in self._workers]

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.process.pid is not None]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake()
        pump = getattr(self, "_pump_thread", None)
        if pump is not None:
            pump.join(timeout=30)
        for worker in self._workers:  # ask all first, so they stop side by side
            with contextlib.suppress(Exception):
                worker.tasks.put(None)
        for worker in self._workers:
            self._retire(worker)
        self._wake_r.close()
        self._wake_w.close()
        torch.set_num_threads(self._previous_threads)
