"""A GRPO run's trajectories kept in the database for the console's browser: a few of each step's, round-robin over
its tasks, written in one transaction a step (the ``train_grpo`` and ``train_preset`` jobs' ``on_groups``, and rank 0
of an FSDP run)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import delete
from sqlmodel import col

from posttrain.platform.db.engine import retry_transient, session
from posttrain.platform.db.models import Trajectory

if TYPE_CHECKING:
    from posttrain.training.rollout import RolloutGroup


def pick_trajectories(groups: list[RolloutGroup], limit: int) -> list[tuple[RolloutGroup, int]]:
    """Up to ``limit`` (group, index) pairs, round-robin over groups so every task is represented."""
    picked: list[tuple[RolloutGroup, int]] = []
    depth = max((len(g.trajectories) for g in groups), default=0)
    for j in range(depth):
        for group in groups:
            if len(picked) >= limit:
                return picked
            if j < len(group.trajectories):
                picked.append((group, j))
    return picked


class TrajectoryWriter:
    """``on_groups`` callback: one transaction per step, at most ``limit`` rows, idempotent per step."""

    def __init__(self, url: str, job_id: int, limit: int) -> None:
        self.url, self.job_id, self.limit = url, job_id, limit

    def __call__(self, step: int, groups: list[RolloutGroup]) -> None:
        if self.limit <= 0:
            return

        from posttrain.training.environments.runner import stored_episode  # torch: the job kinds load without it

        rows = []
        for group, j in pick_trajectories(groups, self.limit):
            t = group.trajectories[j]
            verdict: dict[str, Any] = t.verdict.model_dump() if t.verdict is not None else {}
            verdict |= {"task_id": group.task.task_id, "policy_version": group.policy_version, "finished": t.finished}
            episode = stored_episode(t.episode) if t.episode is not None else None
            if episode is not None:
                verdict |= {k: episode[k] for k in ("stop_reason", "error", "attempts", "elapsed_s")}
            rows.append(
                {
                    "job_id": self.job_id,
                    "step": step,
                    "domain": group.task.domain,
                    "prompt": [m.model_dump() for m in group.task.prompt],
                    "completion": t.text,
                    "tool_calls": episode["turns"] if episode is not None else [],
                    "reward": float(t.reward or 0.0),
                    "verdict": verdict,
                }
            )

        def write() -> None:  # one transaction, repeated as a whole when the database was out of reach
            with session(self.url) as s:
                # a step redone after a resume replaces its rows
                s.exec(delete(Trajectory).where(col(Trajectory.job_id) == self.job_id, col(Trajectory.step) == step))
                s.add_all([Trajectory(**row) for row in rows])

        retry_transient(write, what=f"writing the trajectories of step {step}")
