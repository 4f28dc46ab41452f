"""The verification service: validate, guard, prepare, dispatch; sync, batch and async APIs.

``verify(task, completion)`` never raises for a completion: a bad completion scores 0 with a
reason and a failing verifier returns an infrastructure-error verdict. It raises only for
configuration the operator must fix: an unknown kind or a spec that does not validate.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from posttrain.platform.verifiers.errors import VerifierSpecError
from posttrain.platform.verifiers.models import TaskSpec, Verdict
from posttrain.platform.verifiers.pool import PoolConfig, ProcessPool, _describe_exception
from posttrain.platform.verifiers.registry import BaseSpec, VerifierKind, VerifyContext, get_verifier, validate_spec

DEFAULT_MAX_COMPLETION_CHARS = 256 * 1024
_NO_CONTEXT = VerifyContext()


class VerifierService:
    """Runs verifications on a pool of worker processes. Use as a context manager or call close()."""

    def __init__(
        self, config: PoolConfig | None = None, *, max_completion_chars: int = DEFAULT_MAX_COMPLETION_CHARS
    ) -> None:
        self.config = config or PoolConfig()
        self.max_completion_chars = max_completion_chars
        self._pool = ProcessPool(self.config)
        self._dispatch = ThreadPoolExecutor(
            max_workers=self._pool.size + self.config.thread_checks, thread_name_prefix="posttrain-verify-dispatch"
        )

    def __enter__(self) -> VerifierService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._pool.close()
        self._dispatch.shutdown(wait=False, cancel_futures=True)

    @property
    def worker_pids(self) -> list[int]:
        return self._pool.worker_pids()

    def prepare(self, task: TaskSpec) -> tuple[VerifierKind, BaseSpec]:
        """The task's kind and validated spec; raises UnknownVerifierError / VerifierSpecError."""
        kind = get_verifier(task.verifier.kind)
        return kind, validate_spec(kind.name, task.verifier.spec)

    def verify(
        self,
        task: TaskSpec,
        completion: str,
        *,
        context: VerifyContext | None = None,
        timeout_s: float | None = None,
    ) -> Verdict:
        kind, spec = self.prepare(task)
        return self._run(kind, spec, task, completion, context or _NO_CONTEXT, timeout_s)

    def verify_batch(
        self,
        tasks: Sequence[TaskSpec],
        completions: Sequence[str],
        *,
        context: VerifierContextArg = None,
        timeout_s: float | None = None,
    ) -> list[Verdict]:
        """Verdicts in input order; all specs are validated before any check runs."""
        prepared = self._prepare_batch(tasks, completions)
        futures = [
            self._dispatch.submit(self._run, kind, spec, task, completion, context or _NO_CONTEXT, timeout_s)
            for (kind, spec), task, completion in zip(prepared, tasks, completions)
        ]
        return [future.result() for future in futures]

    async def averify(
        self,
        task: TaskSpec,
        completion: str,
        *,
        context: VerifierContextArg = None,
        timeout_s: float | None = None,
    ) -> Verdict:
        # the spec's validation too runs off the loop
        call = functools.partial(self.verify, task, completion, context=context, timeout_s=timeout_s)
        return await asyncio.get_running_loop().run_in_executor(self._dispatch, call)

    async def averify_batch(
        self,
        tasks: Sequence[TaskSpec],
        completions: Sequence[str],
        *,
        context: VerifierContextArg = None,
        timeout_s: float | None = None,
    ) -> list[Verdict]:
        # the whole batch off the loop: validating a thousand specs and handing out a thousand calls in the
        # loop's thread, while the first checks already compete for the GIL, kept it silent most of a second
        return await asyncio.to_thread(self.verify_batch, tasks, completions, context=context, timeout_s=timeout_s)

    def _prepare_batch(
        self, tasks: Sequence[TaskSpec], completions: Sequence[str]
    ) -> list[tuple[VerifierKind, BaseSpec]]:
        if len(tasks) != len(completions):
            raise ValueError(f"got {len(tasks)} tasks but {len(completions)} completions; pass one completion per task")
        prepared = []
        for index, task in enumerate(tasks):
            try:
                prepared.append(self.prepare(task))
            except VerifierSpecError as error:
                error.add_note(f"in batch item {index} (domain {task.domain!r}, task_id {task.task_id!r})")
                raise
        return prepared

    def _run(
        self,
        kind: VerifierKind,
        spec: BaseSpec,
        task: TaskSpec,
        completion: str,
        context: VerifyContext,
        timeout_s: float | None,
    ) -> Verdict:
        started = time.monotonic()
        verdict = self._guarded(kind, spec, task, completion, context, timeout_s)
        return verdict.model_copy(update={"kind": kind.name, "elapsed_s": round(time.monotonic() - started, 6)})

    def _guarded(
        self,
        kind: VerifierKind,
        spec: BaseSpec,
        task: TaskSpec,
        completion: str,
        context: VerifyContext,
        timeout_s: float | None,
    ) -> Verdict:
        if not isinstance(completion, str):
            return Verdict.failure(f"the completion is a {type(completion).__name__}, not text")
        if len(completion) > self.max_completion_chars:
            return Verdict.failure(
                f"the completion is {len(completion):,} characters, over the limit of "
                f"{self.max_completion_chars:,}; it was not checked",
                completion_chars=len(completion),
            )
        if kind.prepare is not None:
            try:
                spec = kind.prepare(spec, completion, task, context)
            except Exception as exc:  # noqa: BLE001 - e.g. a page lookup that failed
                return Verdict.infra(f"preparing the check failed: {_describe_exception(exc)}")
        limit = timeout_s or spec.timeout_s or kind.default_timeout_s
        if kind.isolation == "thread":
            if spec.timeout_s != limit:  # the check enforces the limit itself: tell it
                spec = spec.model_copy(update={"timeout_s": limit})
            return self._pool.run_in_thread(kind.check, spec, completion, task, limit + kind.wait_margin_s)
        return self._pool.run_in_process(kind.check, spec, completion, task, limit)


VerifierContextArg = VerifyContext | None

_default: VerifierService | None = None
_default_lock = threading.Lock()


def default_service() -> VerifierService:
    """The process-wide service, started on first use and closed at exit."""
    global _default
    with _default_lock:
        if _default is None:
            _default = VerifierService()
            atexit.register(_default.close)
        return _default


def verify(
    task: TaskSpec, completion: str, *, context: VerifyContext | None = None, timeout_s: float | None = None
) -> Verdict:
    """Check ``completion`` against ``task`` on the default service."""
    return default_service().verify(task, completion, context=context, timeout_s=timeout_s)


def verify_batch(
    tasks: Sequence[TaskSpec],
    completions: Sequence[str],
    *,
    context: VerifyContext | None = None,
    timeout_s: float | None = None,
) -> list[Verdict]:
    return default_service().verify_batch(tasks, completions, context=context, timeout_s=timeout_s)


async def averify(
    task: TaskSpec, completion: str, *, context: VerifyContext | None = None, timeout_s: float | None = None
) -> Verdict:
    return await default_service().averify(task, completion, context=context, timeout_s=timeout_s)


async def averify_batch(
    tasks: Sequence[TaskSpec],
    completions: Sequence[str],
    *,
    context: VerifyContext | None = None,
    timeout_s: float | None = None,
) -> list[Verdict]:
    return await default_service().averify_batch(tasks, completions, context=context, timeout_s=timeout_s)
