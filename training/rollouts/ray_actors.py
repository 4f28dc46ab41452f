"""The light Ray actors of :mod:`posttrain.training.rollouts.ray`: the weight store and the verifiers.

They import neither torch nor transformers, so their processes start in a fraction of the time a
rollout worker takes, and a lost verifier is back quickly.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from posttrain.platform.verifiers import PoolConfig, TaskSpec, Verdict, VerifierService

# What a verifier gets from a rollout worker: each group's task and completion texts.
ToVerify = Sequence[tuple[TaskSpec, Sequence[str]]]


class WeightStore:
    """The latest published weights, ``(version, [ref])``; the list keeps Ray from resolving the
    reference, so a worker fetches the tensors only when the version is new to it."""

    def __init__(self) -> None:
        self._latest: tuple[int, list[Any]] | None = None

    def put(self, version: int, box: list[Any]) -> None:
        self._latest = (version, box)

    def latest(self) -> tuple[int, list[Any]] | None:
        return self._latest


class VerifierActor:
    """An ordinary VerifierService (a pool of ``workers`` processes) behind a threaded Ray actor:
    the same checks, limits and infrastructure-error verdicts as in one process."""

    def __init__(self, workers: int | None) -> None:
        self._service = VerifierService(PoolConfig(workers=workers))
        self._closed = False

    def ready(self) -> list[int]:
        return [os.getpid(), *self._service.worker_pids]

    def verify(self, groups: ToVerify, timeout_s: float | None) -> list[list[Verdict]]:
        """The verdicts of every completion, group by group. Never raises for a completion; raises
        for configuration the operator must fix (an unknown kind, a spec that does not validate)."""
        tasks = [task for task, texts in groups for _ in texts]
        completions = [text for _, texts in groups for text in texts]
        if self._closed:  # a batch still queued when the run ended
            return infra_verdicts(groups, "the verifier actor was closed")
        try:
            flat = self._service.verify_batch(tasks, completions, timeout_s=timeout_s)
        except Exception:
            if self._closed:  # the service stopped under this batch
                return infra_verdicts(groups, "the verifier actor was closed")
            raise
        out, start = [], 0
        for _, texts in groups:
            out.append(flat[start : start + len(texts)])
            start += len(texts)
        return out

    def close(self) -> None:
        self._closed = True
        self._service.close()


def infra_verdicts(groups: ToVerify, message: str) -> list[list[Verdict]]:
    return [[Verdict.infra(message) for _ in texts] for _, texts in groups]
