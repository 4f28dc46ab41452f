"""Sandbox pools spread over a Ray cluster: one pool actor per node, one lease per episode.

Example::

    pool = RaySandboxPool(SandboxConfig(backend="ray", pool_size=8), address="ray://head:10001")
    with pool.acquire() as sandbox:        # the least busy node lends a warm sandbox
        sandbox.run_python("x = 2")
        assert sandbox.run_python("x * 21").value == "42"   # same node, same sandbox
    pool.close()

Every alive node runs one ``SandboxPoolActor``: a Ray actor that holds an
ordinary local ``SandboxPool`` (bubblewrap, or the ``process`` backend when the
config asks for it) of ``config.pool_size`` sandboxes. ``acquire()`` takes a
*lease* on one sandbox of one actor; every call of the episode goes to that
actor and that sandbox, so interpreter state and files persist; leaving the
block releases the lease and the actor wipes the sandbox.

Failures of the machinery, not of the model's code, come back as
``CallStatus.INFRA`` results: the actor process died, its node was lost, Ray
did not answer in time, or the actor restarted and no longer knows the lease.
Actors restart (``max_restarts``) and serve the next ``acquire()``; an actor
that is gone for good (its node left the cluster) is dropped, and nodes that
join are given an actor on the next refresh.

Requirements: ``ray`` on the driver and the nodes, and ``posttrain`` importable
by the nodes' workers (installed in their environment). The sandboxes' work
directories live on each node under the same path, ``config.root_dir`` or
``<data_dir>/sandboxes`` as resolved on the driver, else the node's temp dir;
use a node-local path there, not a shared file system.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from posttrain.platform.sandbox.limits import WEAKER
from posttrain.platform.sandbox.pool import PoolClosedError, PoolExhaustedError, SandboxPool, percentile
from posttrain.platform.sandbox.result import PoolStatus, ToolMethods, ToolResult, infra_failure
from posttrain.platform.sandbox.sandbox import RESET_TIMEOUT_S, Sandbox, SandboxStartError
from posttrain.platform.settings.sandbox import SandboxConfig

RPC_TIMEOUT_S = 30.0  # status, release, info: anything that should answer at once
CHECKOUT_RPC_S = 3.0  # what a lease request may take beyond its own wait before that node is skipped
RAY_MARGIN_S = 10.0  # added to a tool call's own limits before the driver gives up on Ray
REFRESH_INTERVAL_S = 30.0  # how often acquire() looks for joined or lost nodes
ACTOR_NAMESPACE = "posttrain"


# ===================================================================== node side
@dataclass
class _Lease:
    sandbox: Sandbox
    last_used: float = field(default_factory=time.monotonic)


class SandboxPoolActor:
    """One node's local pool, served to drivers through leases. Runs as a threaded Ray actor
    (``max_concurrency`` above the pool size), so calls of different leases run in parallel."""

    def __init__(self, config: SandboxConfig, root_dir: str | None, lease_idle_s: float) -> None:
        self._incarnation = uuid.uuid4().hex[:12]
        update = {"root_dir": Path(root_dir) if root_dir else None}
        self.config = config.model_copy(update=update)
        self._pool = SandboxPool(self.config, data_dir=None)
        self._leases: dict[str, _Lease] = {}
        self._lock = threading.Lock()
        self._lease_idle_s = lease_idle_s
        self._expired = 0
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="sandbox-lease-reaper", daemon=True)
        self._reaper.start()

    def info(self) -> dict[str, Any]:
        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "incarnation": self._incarnation,
            "restarted": context.was_current_actor_reconstructed,
            "size": self.config.pool_size,
        }

    def checkout(self, wait_s: float, not_after: float) -> tuple[str, int, str] | None:
        """A lease on a warm sandbox: (lease id, slot, work directory), or None when none became
        free within ``wait_s`` or the driver stopped waiting (``not_after``, wall clock)."""
        try:
            sandbox = self._pool.checkout(timeout=wait_s)
        except PoolExhaustedError:
            return None
        if time.time() > not_after:  # the driver gave up on this request: do not strand the sandbox
            self._pool.release(sandbox)
            return None
        lease = f"{self._incarnation}-{uuid.uuid4().hex[:12]}"
        with self._lock:
            self._leases[lease] = _Lease(sandbox)
        return lease, sandbox.slot, str(sandbox.work_dir)

    def call(self, lease: str, op: str, args: dict[str, Any], timeout: float | None) -> ToolResult:
        started = time.monotonic()
        with self._lock:
            held = self._leases.get(lease)
            if held is not None:
                held.last_used = float("inf")  # a running call is never reaped
        if held is None:
            return infra_failure(
                op, "the sandbox lease is unknown here: its pool actor restarted or the lease expired", started
            )
        try:
            return held.sandbox._call(op, args, timeout)  # the same transport a local sandbox's tools use
        finally:
            held.last_used = time.monotonic()

    def release(self, lease: str) -> bool:
        with self._lock:
            held = self._leases.pop(lease, None)
        if held is None:
            return False
        self._pool.release(held.sandbox)
        return True

    def status(self) -> tuple[PoolStatus, list[float], int]:
        """The local pool's status, its recent call durations (ms) and leases reaped as idle."""
        return self._pool.status(), [r.duration_ms for r in self._pool.recent_calls()], self._expired

    def wait_ready(self, timeout: float) -> bool:
        return self._pool.wait_ready(timeout)

    def host_pids(self) -> list[int]:
        return self._pool.host_pids()

    def close(self) -> None:
        self._stop.set()
        self._pool.close()

    def _reap(self) -> None:
        """Release leases whose driver went quiet (crashed, or forgot to release)."""
        while not self._stop.wait(min(self._lease_idle_s / 4, 30.0)):
            now = time.monotonic()
            with self._lock:
                stale = [k for k, v in self._leases.items() if now - v.last_used > self._lease_idle_s]
            for lease in stale:
                if self.release(lease):
                    self._expired += 1


# =================================================================== driver side
@dataclass
class _Member:
    """The driver's view of one node's actor."""

    node_id: str
    actor: Any  # ray.actor.ActorHandle
    size: int
    leases: int = 0  # held by this driver now
    info: dict[str, Any] = field(default_factory=dict)
    unavailable_until: float = 0.0  # monotonic; skip it for a while after it failed

    @property
    def load(self) -> float:
        return self.leases / max(self.size, 1)


class RaySandbox(ToolMethods):
    """One leased sandbox on one node; the same tool methods as ``Sandbox``, each returning a
    ``ToolResult`` and never raising for what the model's code or the cluster does."""

    def __init__(self, pool: RaySandboxPool, member: _Member, lease: str, slot: int, work_dir: str) -> None:
        self._pool = pool
        self._member = member
        self.config = pool.config
        self.lease = lease
        self.slot = slot
        self.node_id = member.node_id
        self.work_dir = Path(work_dir)  # on the node that runs the sandbox
        self.alive = True
        self.released = False

    def _call(self, op: str, args: dict[str, Any], timeout: float | None) -> ToolResult:
        started = time.monotonic()
        if self.released:
            raise RuntimeError(f"{self!r} was released; acquire a new sandbox")
        if not self.alive:
            result = infra_failure(op, "this episode's sandbox was lost earlier (see the previous call)", started)
        else:
            limit = (timeout or self.config.call_timeout_s) + self.config.kill_grace_s + RESET_TIMEOUT_S + RAY_MARGIN_S
            ref = self._member.actor.call.remote(self.lease, op, args, timeout)
            try:
                result = ray.get(ref, timeout=limit)
            except GetTimeoutError:
                ray.cancel(ref, force=False)
                result = self._lost(op, started, f"Ray did not return the call within {limit:g} s")
            except RayActorError as exc:
                result = self._lost(
                    op, started, f"the sandbox pool actor on node {self.node_id[:12]} died: {_first_line(exc)}"
                )
            except RayError as exc:
                result = self._lost(op, started, f"Ray failed the call: {type(exc).__name__}: {_first_line(exc)}")
            else:
                if result.is_infrastructure_failure and "lease is unknown" in result.detail:
                    self.alive = False
        self._pool._record_call(self, result, (time.monotonic() - started) * 1000)
        return result

    def _lost(self, op: str, started: float, why: str) -> ToolResult:
        self.alive = False
        self._pool._note_member_failure(self._member, why)
        return infra_failure(op, why, started)

    def __repr__(self) -> str:
        state = "alive" if self.alive else "lost"
        return f"RaySandbox(node={self.node_id[:12]}, slot={self.slot}, lease={self.lease}, {state})"


class RaySandboxPool:
    """Sandbox pools on every node of a Ray cluster, behind the ``SandboxPool`` interface.

    ``config.pool_size`` sandboxes are kept warm on each node; ``config.backend`` is "ray"
    (each node then uses bubblewrap) or the local backend each node should use. ``address``
    is passed to ``ray.init`` unless this process is already connected to Ray.
    """

    def __init__(
        self,
        config: SandboxConfig,
        data_dir: Path | None = None,
        *,
        address: str | None = None,
        max_restarts: int = -1,
        lease_idle_s: float = 3600.0,
        actor_options: dict[str, Any] | None = None,
        refresh_interval_s: float = REFRESH_INTERVAL_S,
        start: bool = True,
    ) -> None:
        node_backend = "bwrap" if config.backend == "ray" else config.backend
        self.config = config.model_copy(update={"backend": node_backend})
        root = config.resolved_root(data_dir)
        self._root = str(root.resolve()) if root is not None else None
        self._address = address
        self._owns_ray = False
        self._max_restarts = max_restarts
        self._lease_idle_s = lease_idle_s
        self._actor_options = dict(actor_options or {})
        self._refresh_interval_s = refresh_interval_s
        self._members: dict[str, _Member] = {}
        self._lock = threading.Lock()
        self._round_trip_ms: deque[float] = deque(maxlen=config.latency_history)
        self._acquire_ms: deque[float] = deque(maxlen=config.latency_history)
        self._calls = 0
        self._infra = 0  # infrastructure failures seen only here (the actor could not report them)
        self._failures = 0  # actor deaths and start failures
        self._last_error = ""
        self._last_refresh = 0.0
        self._closed = False
        if start:
            self.start()

    # ------------------------------------------------------------ life cycle
    def start(self) -> None:
        """Connect to Ray and start one pool actor per alive node; waits until they are up.
        Raises SandboxStartError when no node could start its pool."""
        if not ray.is_initialized():
            ray.init(address=self._address, namespace=ACTOR_NAMESPACE, log_to_driver=False, configure_logging=False)
            self._owns_ray = True
        self.refresh(wait=True)
        if not self._members:
            raise SandboxStartError(f"no node of the Ray cluster started a sandbox pool: {self._last_error}")

    def refresh(self, wait: bool = False) -> None:
        """Start actors on nodes that have none, drop actors whose node left the cluster."""
        self._last_refresh = time.monotonic()
        alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
        with self._lock:
            for node_id in [n for n in self._members if n not in alive]:
                self._members.pop(node_id)
                self._note_failure(f"node {node_id[:12]} left the cluster; its sandboxes are gone")
            missing = [n for n in alive if n not in self._members]
        started = {node_id: self._spawn(node_id) for node_id in missing}
        refs = {node_id: m.actor.info.remote() for node_id, m in started.items()}
        if not wait:
            with self._lock:
                self._members.update(started)
            return
        timeout = self.config.start_timeout_s * self.config.pool_size + RAY_MARGIN_S
        for node_id, ref in refs.items():
            member = started[node_id]
            try:
                member.info = ray.get(ref, timeout=timeout)
            except (RayError, GetTimeoutError) as exc:
                self._note_failure(f"node {node_id[:12]}: the sandbox pool did not start: {_first_line(exc, 2000)}")
                with contextlib.suppress(RayError):
                    ray.kill(member.actor, no_restart=True)
                continue
            with self._lock:
                self._members[node_id] = member

    def _spawn(self, node_id: str) -> _Member:
        options: dict[str, Any] = {
            "num_cpus": 0,
            "max_restarts": self._max_restarts,
            "max_task_retries": 0,  # a tool call runs at most once; an actor death is an INFRA result
            "max_concurrency": 2 * self.config.pool_size + 8,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
            **self._actor_options,
        }
        actor = _remote_actor_class().options(**options).remote(self.config, self._root, self._lease_idle_s)
        return _Member(node_id=node_id, actor=actor, size=self.config.pool_size)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until every node's sandboxes are idle and warm (or the timeout passes)."""
        wait = 60.0 if timeout is None else timeout
        refs = [m.actor.wait_ready.options(max_task_retries=-1).remote(wait) for m in self._snapshot()]
        try:
            return all(ray.get(refs, timeout=wait + RAY_MARGIN_S))
        except (RayError, GetTimeoutError):
            return False

    def close(self) -> None:
        """Close every node's pool and end the actors (and the Ray connection this pool opened)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            members = list(self._members.values())
            self._members.clear()
        refs = [m.actor.close.remote() for m in members]
        with contextlib.suppress(RayError, GetTimeoutError):
            ray.wait(refs, num_returns=len(refs), timeout=RPC_TIMEOUT_S)
        for member in members:
            with contextlib.suppress(RayError):
                ray.kill(member.actor, no_restart=True)
        if self._owns_ray:
            ray.shutdown()

    def __enter__(self) -> RaySandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --------------------------------------------------------------- leasing
    @contextlib.contextmanager
    def acquire(self, timeout: float | None = None) -> Iterator[RaySandbox]:
        """Lease a warm sandbox on the least busy node for one episode."""
        sandbox = self.checkout(timeout)
        try:
            yield sandbox
        finally:
            self.release(sandbox)

    def checkout(self, timeout: float | None = None) -> RaySandbox:
        """Lease a sandbox; pair with ``release``. Raises PoolExhaustedError, PoolClosedError."""
        started = time.perf_counter()
        wait = self.config.acquire_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + wait
        while True:
            if self._closed:
                raise PoolClosedError("the sandbox pool is closed")
            if time.monotonic() - self._last_refresh > self._refresh_interval_s:
                self.refresh()
            members = sorted(self._snapshot(), key=lambda m: (m.unavailable_until > time.monotonic(), m.load))
            # First pass: take a free sandbox from the least busy node that has one, without waiting.
            for member in members:
                sandbox = self._try_checkout(member, 0.0)
                if sandbox is not None:
                    break
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PoolExhaustedError(
                        f"no sandbox free within {wait:g} s ({self._describe()}); "
                        "raise sandbox.pool_size, add nodes, or release sandboxes sooner"
                    )
                # All busy (or restarting): wait a little on the least busy, then look again.
                sandbox = self._try_checkout(members[0], min(remaining, 1.0)) if members else None
                if sandbox is None:
                    if not members:
                        time.sleep(min(remaining, 1.0))
                        self.refresh()
                    continue
            self._acquire_ms.append((time.perf_counter() - started) * 1000)
            return sandbox

    def release(self, sandbox: RaySandbox) -> None:
        """End the episode; the node wipes the sandbox and puts it back in the background."""
        if sandbox.released:
            raise ValueError(f"{sandbox!r} was already released")
        sandbox.released = True
        with self._lock:
            sandbox._member.leases = max(sandbox._member.leases - 1, 0)
        if self._closed:
            return
        try:
            ray.get(sandbox._member.actor.release.remote(sandbox.lease), timeout=RPC_TIMEOUT_S)
        except (RayError, GetTimeoutError) as exc:
            if sandbox.alive:
                self._note_member_failure(sandbox._member, f"release failed: {_first_line(exc)}")

    def _try_checkout(self, member: _Member, wait_s: float) -> RaySandbox | None:
        if member.unavailable_until > time.monotonic() and wait_s == 0.0:
            return None
        # A healthy actor answers at once; one that is restarting (or on a node being lost) is
        # skipped for a while instead of stalling the acquire.
        limit = wait_s + CHECKOUT_RPC_S
        # Retried through actor restarts: a checkout is harmless to repeat (not_after drops late ones).
        ref = member.actor.checkout.options(max_task_retries=-1).remote(wait_s, time.time() + limit)
        try:
            granted = ray.get(ref, timeout=limit)
        except ActorDiedError as exc:
            self._drop(member, f"the sandbox pool actor on node {member.node_id[:12]} is gone: {_first_line(exc)}")
            return None
        except GetTimeoutError:
            with contextlib.suppress(RayError, TypeError, ValueError):
                ray.cancel(ref)
            member.unavailable_until = time.monotonic() + 5.0
            return None
        except RayError as exc:
            self._note_member_failure(member, f"checkout failed: {_first_line(exc)}")
            return None
        if granted is None:
            return None
        member.unavailable_until = 0.0
        lease, slot, work_dir = granted
        with self._lock:
            member.leases += 1
        return RaySandbox(self, member, lease, slot, work_dir)

    # ------------------------------------------------------------ monitoring
    def status(self) -> PoolStatus:
        """Totals over all nodes. ``call_*`` latencies are round trips measured here (Ray
        included); ``node_call_*`` are the same calls measured on the nodes."""
        members = self._snapshot()
        refs = [m.actor.status.remote() for m in members]
        ready = busy = failures = infra = episodes = 0
        node_calls: list[float] = []
        last_error = self._last_error
        limits: dict[str, str] = {}
        for _member, ref in zip(members, refs, strict=True):
            try:
                local, durations, reaped = ray.get(ref, timeout=RPC_TIMEOUT_S)
            except (RayError, GetTimeoutError):
                continue  # restarting or lost: its sandboxes count as starting
            ready += local.ready
            busy += local.busy
            failures += local.failures
            infra += local.infra_failures
            episodes += local.episodes
            if reaped:
                last_error = last_error or f"{reaped} lease(s) released after {self._lease_idle_s:g} s idle"
            node_calls += durations
            last_error = last_error or local.last_error
            for part, line in local.limits.items():  # a node that is weaker than the others shows
                if part not in limits or line.startswith(WEAKER):
                    limits[part] = line
        size = sum(m.size for m in members)
        trips, acquires = list(self._round_trip_ms), list(self._acquire_ms)
        return PoolStatus(
            backend="ray",
            size=size,
            ready=ready,
            busy=busy,
            starting=max(size - ready - busy, 0),
            failures=failures + self._failures,
            infra_failures=infra + self._infra,
            episodes=episodes,
            calls=self._calls,
            last_error=last_error,
            limits=limits,
            latency_ms={
                "call_p50": percentile(trips, 0.5),
                "call_p99": percentile(trips, 0.99),
                "acquire_p50": percentile(acquires, 0.5),
                "acquire_p99": percentile(acquires, 0.99),
                "node_call_p50": percentile(node_calls, 0.5),
                "node_call_p99": percentile(node_calls, 0.99),
            },
        )

    def nodes(self) -> list[dict[str, Any]]:
        """One entry per node with a pool actor: node id, host, actor pid, leases held here."""
        out = []
        for member in self._snapshot():
            try:
                member.info = ray.get(member.actor.info.options(max_task_retries=-1).remote(), timeout=RPC_TIMEOUT_S)
            except (RayError, GetTimeoutError):
                pass
            out.append({**member.info, "node_id": member.node_id, "leases": member.leases})
        return out

    def host_pids(self) -> list[int]:
        """Host pids of every node's sandbox processes (meaningful on the node that runs them)."""
        refs = [m.actor.host_pids.options(max_task_retries=-1).remote() for m in self._snapshot()]
        return [pid for pids in ray.get(refs, timeout=RPC_TIMEOUT_S) for pid in pids]

    @property
    def size(self) -> int:
        return sum(m.size for m in self._snapshot())

    # -------------------------------------------------------------- internal
    def _snapshot(self) -> list[_Member]:
        with self._lock:
            return list(self._members.values())

    def _record_call(self, sandbox: RaySandbox, result: ToolResult, round_trip_ms: float) -> None:
        with self._lock:
            self._calls += 1
            if result.is_infrastructure_failure and not sandbox.alive:
                self._infra += 1
        self._round_trip_ms.append(round_trip_ms)

    def _note_member_failure(self, member: _Member, why: str) -> None:
        member.unavailable_until = time.monotonic() + 1.0
        self._note_failure(why)

    def _drop(self, member: _Member, why: str) -> None:
        """The actor is dead for good (restarts used up, node gone): forget it; the next refresh
        starts a new one if its node is still alive."""
        with self._lock:
            if self._members.get(member.node_id) is member:
                del self._members[member.node_id]
        self._last_refresh = 0.0
        self._note_failure(why)

    def _note_failure(self, message: str) -> None:
        self._failures += 1
        self._last_error = message

    def _describe(self) -> str:
        members = self._snapshot()
        held = sum(m.leases for m in members)
        return f"{held} leased here of {sum(m.size for m in members)} on {len(members)} node(s)"


RayPool = RaySandboxPool  # the name the local pool's error message uses


@functools.cache
def _remote_actor_class() -> Any:
    return ray.remote(SandboxPoolActor)


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]
