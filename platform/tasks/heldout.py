"""Held-out checks: does an eval set share a prompt (procedural tasks) or a source span (document
tasks) with what was trained on?

    check = check_held_out(train_tasks, eval_tasks)
    check.unseen_fraction          # 1.0: no eval task was ever a training task
    check.ok, check.seen_examples  # the eval prompts training saw, for the message

Procedural tasks compare normalised prompt hashes; document tasks compare their source span
(``provenance["span"]``: two questions on one table row or one sentence share it). :func:`task_source` names
what a task shares with others beyond that (its document, a repair task's function): the cluster of a paired SE.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from posttrain.platform.tasks.domains import prompt_hash
from posttrain.platform.verifiers.models import TaskSpec


def held_out_key(task: TaskSpec) -> str:
    span = task.provenance.get("span")
    return f"span:{span}" if span else f"prompt:{prompt_hash(task.prompt_text)}"


def task_source(task: TaskSpec) -> str:
    """The source a task shares with the tasks it is not independent of, the cluster of a paired SE
    (:func:`posttrain.platform.stats.paired_difference`): its document (the questions of one document), the
    function a code-repair task is about (its tasks, whatever the defect, stand or fall with the function), else
    the task itself."""
    document = task.provenance.get("document_id")
    if document:
        return f"document:{document}"
    entry = task.verifier.spec.get("entry_point") if task.metadata.get("files") else None
    if entry:
        return f"function:{entry}"
    return f"task:{task.task_id or held_out_key(task)}"


@dataclass(frozen=True)
class HeldOutCheck:
    eval_tasks: int
    unseen: int
    seen_examples: list[str] = field(default_factory=list)  # up to five eval prompts that training saw

    @property
    def unseen_fraction(self) -> float:
        return self.unseen / self.eval_tasks if self.eval_tasks else 0.0

    @property
    def ok(self) -> bool:
        return self.eval_tasks > 0 and self.unseen == self.eval_tasks

    def describe(self) -> str:
        if self.ok:
            return f"all {self.eval_tasks} eval tasks are unseen in training"
        return (
            f"{self.eval_tasks - self.unseen} of {self.eval_tasks} eval tasks were trained on "
            f"(e.g. {'; '.join(repr(p) for p in self.seen_examples)})"
        )


def check_held_out(train: Iterable[TaskSpec], eval_tasks: Iterable[TaskSpec]) -> HeldOutCheck:
    trained = {held_out_key(t) for t in train}
    evals = list(eval_tasks)
    seen = [t for t in evals if held_out_key(t) in trained]
    return HeldOutCheck(len(evals), len(evals) - len(seen), [t.prompt_text[:120] for t in seen[:5]])
