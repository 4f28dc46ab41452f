"""The many-domain curriculum end to end: the broad preset cut down to four domains whose pass rates are known, run as
``train_preset`` jobs through a real worker, once with its curriculum and once with uniform draws (the peer).

The policy is the tiny random model answering with one character, sampled: its replies are close to uniform over the
99 characters of its tokenizer, so a domain's pass rate is the share of them its verifier accepts. One domain accepts
every reply and one none (their groups never disagree: no learning signal, whatever is sampled), two accept about a
third and a quarter (most of their groups disagree). The curriculum must move its draws to those two; uniform draws
cannot, so the assertions cannot pass by chance."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from conftest import OPERATOR, run_worker_until_idle
from test_training_tiny import CHARS, tiny_policy_dir

from posttrain.platform import metric_names, metrics
from posttrain.platform.db.models import JobStatus
from posttrain.platform.jobs import queue
from posttrain.platform.models.registry import register_model
from posttrain.platform.tasks.store import save_tasks
from posttrain.platform.verifiers.models import TaskSpec
from posttrain.training.preset_recipes import BROAD_CURRICULUM, BROAD_UNIFORM

REPLIES = sorted({c.strip() for c in CHARS})  # what a one-character reply reads as ("" for a space, a newline or none)
ACCEPTS = {  # domain -> the replies it accepts
    "signal.always": REPLIES,
    "signal.never": ["not one character"],
    "signal.lower": list(string.ascii_lowercase + string.digits),  # 36 of 99 characters: most groups of 4 disagree
    "signal.upper": list(string.ascii_uppercase),  # 26 of 99
}
STEPS, BATCH, GROUP = 16, 8, 4


def save_signal_tasks() -> None:
    tasks = [TaskSpec(domain=domain, prompt=f"Say one character ({domain} #{i}).", split=split, task_id=f"{domain}-{split}-{i}",
                      verifier={"kind": "exact", "spec": {"answer": accepted}}, reference=accepted[0] or "a")
             for domain, accepted in ACCEPTS.items() for split in ("train", "eval") for i in range(8)]  # fmt: skip
    save_tasks("signals", tasks)


def run_config(scheduler: dict[str, object] | None = None) -> dict[str, object]:
    """The broad preset cut down: its curriculum (or ``scheduler`` instead), the tiny model, the four domains."""
    grpo: dict[str, object] = {
        "task_set": "signals",
        "domains": [],
        "prompt_format": None,
        "max_new_tokens": 1,
        "temperature": 1.0,
        "group_size": GROUP,
        "max_steps": STEPS,
        "lr": 1e-6,
        "micro_batch_size": 32,
        "checkpoint_every": 0,
        "logprob_check": {"every": 0},
        "max_rollout_batches_per_step": 1,
        "replay": None,  # the curriculum's draws alone
    }
    # a scheduler given replaces the preset's whole: the preset's curriculum is given as it is, at this batch size
    grpo["scheduler"] = (scheduler if scheduler is not None else BROAD_CURRICULUM.model_dump()) | {"batch_size": BATCH}
    return {"preset": "smollm2-broad", "model": "tiny", "grpo": grpo,
            "eval": {"task_set": "signals", "domains": [], "difficulties": {}, "task_sets": {}, "prompt_format": None, "general": None,
                     "tasks_per_domain": 8, "max_new_tokens": 1, "batch_size": 32}}  # fmt: skip


def last(job_id: int, figure: str) -> dict[str, float]:
    found = metrics.latest(job_id, [f"sched/{d}/{figure}" for d in ACCEPTS])
    return {name.split("/")[1]: point.value for name, point in found.items()}


def signal_share(job_id: int) -> float:
    """The share of the run's groups that had a learning signal (their rewards differed), over all its steps."""
    data = metrics.series(job_id, [metric_names.GROUPS, metric_names.GROUPS_SIGNAL], max_points=10**6)
    return sum(v for _, v in data[metric_names.GROUPS_SIGNAL]) / sum(v for _, v in data[metric_names.GROUPS])


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_broad_presets_curriculum_draws_where_the_signal_is_and_uniform_draws_do_not(
        platform_env: dict[str, str], tmp_path: Path) -> None:  # fmt: skip
    register_model(OPERATOR, "tiny", tiny_policy_dir(tmp_path / "tiny"))
    save_signal_tasks()
    curriculum = queue.submit(OPERATOR, "train_preset", run_config())
    uniform = queue.submit(OPERATOR, "train_preset", run_config(BROAD_UNIFORM.model_dump()))
    run_worker_until_idle(platform_env, timeout=600)
    for job_id in (curriculum, uniform):
        job = queue.get_job(job_id)
        assert job.status is JobStatus.succeeded, job.error
        assert job.config["grpo"]["scheduler"]["batch_size"] == BATCH

    print(
        f"\nsignal share: curriculum {signal_share(curriculum):.2f}, uniform {signal_share(uniform):.2f}; draws: curriculum "
        f"{last(curriculum, 'drawn')}, uniform {last(uniform, 'drawn')}"
    )
    # the estimates: groups that never disagree have no signal, whatever the policy samples
    signal = last(curriculum, "signal_rate")
    assert signal["signal.always"] == signal["signal.never"] == 0.0, signal
    assert signal["signal.lower"] > 0.3 and signal["signal.upper"] > 0.3, signal
    # the curriculum: the two domains without signal at the floor, their share of the draws small
    share = last(curriculum, "prob")
    assert share["signal.always"] < 0.06 and share["signal.never"] < 0.06, share
    drawn = last(curriculum, "drawn")
    assert sum(drawn.values()) == STEPS * BATCH
    assert drawn["signal.always"] + drawn["signal.never"] <= 0.25 * STEPS * BATCH, drawn
    # uniform: a quarter each, so about half the draws go to the domains with nothing to learn
    flat = last(uniform, "drawn")
    assert flat["signal.always"] + flat["signal.never"] >= 0.3 * STEPS * BATCH, flat
    assert last(uniform, "prob") == pytest.approx({d: 0.25 for d in ACCEPTS})
    # the benchmark's goal, on a policy whose rates are known: the share of groups with signal is far above uniform's
    assert signal_share(curriculum) >= 1.3 * signal_share(uniform), (signal_share(curriculum), signal_share(uniform))
    # the run's per-domain before/after table: every domain, paired task by task
    arena = queue.get_job(curriculum).result["arena"]
    assert set(arena["domains"]) == {*ACCEPTS, "all"} and all(
        r["tasks"] == 8 for d, r in arena["domains"].items() if d != "all"
    )
