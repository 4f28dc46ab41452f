"""Task sets, domains and tasks in the database.

Builders, importers and procedural generators produce :class:`TaskSpec` lists;
this module persists them (one transaction per task set), reads them back as
specs for training and evaluation, and keeps per-task running statistics.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from sqlalchemy import case, func, update
from sqlmodel import col, select

from posttrain.platform.auth import AUDITED_CHARS, Identity, action, audit
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Domain, Role, Split, Task, TaskSet
from posttrain.platform.tasks.domains import get_domain
from posttrain.platform.tasks.domains.registry import UnknownDomainError
from posttrain.platform.verifiers import TaskSpec, Verdict, verify


@dataclass(frozen=True)
class StoredTask:
    id: int
    task_set: str
    spec: TaskSpec
    attempts: int
    passes: int


@dataclass(frozen=True)
class DomainStats:
    name: str
    family: str
    weight: float
    priority: int
    tasks: int
    train: int
    eval: int
    attempts: int
    passes: int

    @property
    def pass_rate(self) -> float | None:
        return self.passes / self.attempts if self.attempts else None


def _domain_row(s, name: str, cache: dict[str, Domain]) -> Domain:
    if name in cache:
        return cache[name]
    row = s.exec(select(Domain).where(Domain.name == name)).first()
    if row is None:
        try:
            info = get_domain(name)
            row = Domain(name=name, family=info.family, description=info.description, params=dict(info.params))
        except UnknownDomainError:
            row = Domain(name=name, family=name.split(".", 1)[0])
        s.add(row)
        s.flush()
    cache[name] = row
    return row


def save_tasks(
    task_set: str, specs: Sequence[TaskSpec], *, source: str = "", description: str = "", url: str | None = None
) -> int:
    """Add ``specs`` to the task set named ``task_set`` (created if new); returns its id."""
    with session(url) as s:
        ts = s.exec(select(TaskSet).where(TaskSet.name == task_set)).first()
        if ts is None:
            ts = TaskSet(name=task_set, source=source, description=description)
            s.add(ts)
            s.flush()
        assert ts.id is not None  # given by the flush
        domains: dict[str, Domain] = {}
        for spec in specs:
            domain = _domain_row(s, spec.domain, domains)
            assert domain.id is not None  # given by the flush
            s.add(
                Task(
                    task_set_id=ts.id,
                    domain_id=domain.id,
                    prompt=[m.model_dump(mode="json") for m in spec.prompt],
                    verifier_kind=spec.verifier.kind,
                    verifier_spec=spec.verifier.spec,
                    reference=spec.reference,
                    split=Split(spec.split),
                    provenance={**spec.provenance, "task_id": spec.task_id, "metadata": spec.metadata},
                )
            )
        return ts.id


def _to_spec(task: Task, domain: str) -> TaskSpec:
    prov = dict(task.provenance)
    return TaskSpec(
        domain=domain,
        prompt=task.prompt,
        verifier={"kind": task.verifier_kind, "spec": task.verifier_spec},
        reference=task.reference,
        split=task.split.value,
        task_id=prov.pop("task_id", None) or f"task-{task.id}",
        metadata=prov.pop("metadata", {}) or {},
        provenance=prov,
    )


def load_tasks(
    *,
    task_set: str | None = None,
    domains: Iterable[str] | None = None,
    split: str | None = None,
    limit: int | None = None,
    offset: int = 0,
    url: str | None = None,
) -> list[StoredTask]:
    with session(url, read_only=True) as s:
        stmt = (
            select(Task, Domain.name, TaskSet.name)
            .join(Domain, col(Domain.id) == col(Task.domain_id))
            .join(TaskSet, col(TaskSet.id) == col(Task.task_set_id))
        )
        if task_set is not None:
            stmt = stmt.where(TaskSet.name == task_set)
        if domains is not None:
            stmt = stmt.where(col(Domain.name).in_(list(domains)))
        if split is not None:
            stmt = stmt.where(Task.split == Split(split))
        stmt = stmt.order_by(col(Task.id)).offset(offset)
        if limit is not None:
            stmt = stmt.limit(limit)
        rows = s.exec(stmt).all()
    # stored tasks: their ids are set
    return [StoredTask(cast(int, t.id), ts, _to_spec(t, d), t.attempts, t.passes) for t, d, ts in rows]


def get_task(task_id: int, *, url: str | None = None) -> StoredTask:
    with session(url, read_only=True) as s:
        row = s.exec(
            select(Task, Domain.name, TaskSet.name)
            .join(Domain, col(Domain.id) == col(Task.domain_id))
            .join(TaskSet, col(TaskSet.id) == col(Task.task_set_id))
            .where(Task.id == task_id)
        ).first()
    if row is None:
        raise LookupError(f"no task with id {task_id}")
    t, d, ts = row
    assert t.id is not None  # a stored task
    return StoredTask(t.id, ts, _to_spec(t, d), t.attempts, t.passes)


@action("task.verify", Role.operator)
def try_answer(identity: Identity, task_id: int, answer: str, *, url: str | None = None) -> Verdict:
    """Check ``answer`` against stored task ``task_id``'s verifier, as training does: a code task's tests
    run the answer in a sandbox, which is why this needs an operator. Audited before it runs."""
    task = get_task(task_id, url=url)
    audit(identity.username, "task.verify", target=f"task:{task_id}",
          details={"verifier": task.spec.verifier.kind, "answer": answer[:AUDITED_CHARS], "chars": len(answer)}, url=url)  # fmt: skip
    return verify(task.spec, answer)


def record_results(results: Iterable[tuple[int, bool]], *, url: str | None = None) -> None:
    """Add attempts (and passes) to tasks' running statistics."""
    with session(url) as s:
        for task_id, passed in results:
            s.exec(
                update(Task)
                .where(col(Task.id) == task_id)
                .values(attempts=Task.attempts + 1, passes=Task.passes + (1 if passed else 0))
            )


def task_sets(*, url: str | None = None) -> list[tuple[TaskSet, int]]:
    with session(url, read_only=True) as s:
        rows = s.exec(
            select(TaskSet, func.count(col(Task.id)))
            .join(Task, col(Task.task_set_id) == col(TaskSet.id), isouter=True)
            .group_by(col(TaskSet.id))
            .order_by(col(TaskSet.id).desc())
        ).all()
    return [(ts, int(n)) for ts, n in rows]


def domain_stats(*, task_set: str | None = None, url: str | None = None) -> list[DomainStats]:
    with session(url, read_only=True) as s:
        stmt = (
            select(  # type: ignore[call-overload]  # sqlmodel's overloads stop at four columns
                Domain,
                func.count(col(Task.id)),
                func.sum(case((col(Task.split) == Split.train, 1), else_=0)),
                func.coalesce(func.sum(Task.attempts), 0),
                func.coalesce(func.sum(Task.passes), 0),
            )
            .join(Task, col(Task.domain_id) == col(Domain.id))
            .group_by(col(Domain.id))
            .order_by(Domain.name)
        )
        if task_set is not None:
            stmt = stmt.join(TaskSet, col(TaskSet.id) == col(Task.task_set_id)).where(TaskSet.name == task_set)
        rows = s.exec(stmt).all()
    return [
        DomainStats(
            d.name, d.family, d.weight, d.priority, int(n), int(train or 0), int(n) - int(train or 0), int(a), int(p)
        )
        for d, n, train, a, p in rows
    ]
