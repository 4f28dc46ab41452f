"""Sandbox pools report their state to the database, so the console can show every pool.

A pool lives inside whichever process uses it (a training job, a verifier, the
console's snippet runner); :func:`publish` writes its status and recent call
latencies into the ``sandbox_pool`` table, and :class:`StatusPublisher` does so
periodically from a daemon thread.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from typing import Any

from sqlmodel import select

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import SandboxPool as SandboxPoolRow
from posttrain.platform.db.models import utcnow
from posttrain.platform.sandbox.pool import SandboxPool

LATENCY_SAMPLES = 500


def default_name(role: str) -> str:
    return f"{role}@{socket.gethostname()}:{os.getpid()}"


def snapshot(pool: SandboxPool) -> dict[str, Any]:
    """Status plus recent per-call latencies, as plain JSON."""
    status = dataclasses.asdict(pool.status())
    calls = pool.recent_calls(LATENCY_SAMPLES)
    status["recent_calls"] = [
        {"tool": c.tool, "status": c.status.value, "ms": round(c.duration_ms, 3), "at": c.at} for c in calls
    ]
    status["recent_acquire_ms"] = [round(x, 4) for x in pool.recent_acquire_ms()[-LATENCY_SAMPLES:]]
    return status


def publish(pool: SandboxPool, name: str, *, url: str | None = None) -> None:
    """Upsert the pool's row (one short transaction)."""
    snap = snapshot(pool)
    with session(url) as s:
        row = s.exec(select(SandboxPoolRow).where(SandboxPoolRow.name == name)).first() or SandboxPoolRow(name=name)
        row.backend = snap["backend"]
        row.host = socket.gethostname()
        row.size = snap["size"]
        row.busy = snap["busy"]
        row.failures = snap["failures"]
        row.config = {"status": snap, "limits": pool.config.model_dump(mode="json")}
        row.updated_at = utcnow()
        s.add(row)


class StatusPublisher:
    """Publish a pool's status every ``interval_s`` seconds until stopped."""

    def __init__(self, pool: SandboxPool, name: str, *, interval_s: float = 5.0, url: str | None = None) -> None:
        self.pool, self.name, self.interval_s, self.url = pool, name, interval_s, url
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sandbox-status-{name}", daemon=True)

    def start(self) -> StatusPublisher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)
        publish(self.pool, self.name, url=self.url)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                publish(self.pool, self.name, url=self.url)
            except Exception:  # the database may be briefly unavailable; the next round retries
                pass
