"""Training as jobs through the real worker: registered models in and out, metrics and
trajectories in the database, a SIGKILLed run resuming with no gap or duplicate step,
evaluation comparing two models, presets and YAML configs."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import OPERATOR, run_worker_until_idle, start_worker, stop_worker, wait_for
from sqlmodel import select
from test_training_tiny import tiny_policy_dir

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import JobStatus, Metric, Trajectory
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import JobConfigError, validate_config
from posttrain.platform.models.registry import get_model, lineage, register_model
from posttrain.training.config import GRPOConfig
from posttrain.training.evaluate import pass_at_k
from posttrain.training.presets import get_preset, preset_names

STEPS = 14
PER_STEP = 5


def _metric_steps(url: str, job_id: int, name: str) -> list[int]:
    with session(url, read_only=True) as s:
        return sorted(m.step for m in s.exec(select(Metric).where(Metric.job_id == job_id, Metric.name == name)).all())


def crash_after_steps_and_rerun(env: dict[str, str], url: str, job_id: int, steps: int, total: int) -> int:
    """Let ``job_id`` log ``steps`` GRPO steps, then crash the whole machine (the worker and the job's
    process group die at once); run a fresh worker until the queue is empty. Returns the steps done at the kill."""
    first = start_worker(env)
    try:
        wait_for(lambda: len(_metric_steps(url, job_id, "rollout/reward_mean")) >= steps, timeout=300,
                 message=f"{steps} GRPO steps")  # fmt: skip
        job = queue.get_job(job_id)
        first.send_signal(signal.SIGKILL)
        os.killpg(job.pid, signal.SIGKILL)  # type: ignore[arg-type]
        first.wait()
    finally:
        stop_worker(first)
    wait_for(lambda: not queue.process_alive(job.pid, job.proc_started), timeout=15, message="job process gone")  # type: ignore[arg-type]
    done_at_kill = len(_metric_steps(url, job_id, "rollout/reward_mean"))
    assert done_at_kill < total, "the run finished before it was killed; make it longer"
    second = start_worker(env, "--exit-when-idle")
    try:
        assert second.wait(timeout=400) == 0
    finally:
        stop_worker(second)
    return done_at_kill


def _grpo_config(**overrides: object) -> dict[str, object]:
    return {
        "model": "tiny",
        "register_as": "tiny-grpo",
        "domains": ["format.to_hex", "format.from_words"],
        "scheduler": {"batch_size": 2, "seed": 0},
        "group_size": 4,
        "max_new_tokens": 3,
        "lr": 1e-3,
        "max_steps": STEPS,
        "checkpoint_every": 1,
        "device": "cpu",
        "verifier_workers": 1,
        "trajectories_per_step": PER_STEP,
        **overrides,
    }


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_grpo_job_killed_mid_run_resumes_without_gaps(
    platform_env: dict[str, str], db_url: str, tmp_path: Path
) -> None:
    register_model(OPERATOR, "tiny", tiny_policy_dir(tmp_path / "tiny"))
    job_id = queue.submit(OPERATOR, "train_grpo", _grpo_config())
    done_at_kill = crash_after_steps_and_rerun(platform_env, db_url, job_id, 4, STEPS)
    job = queue.get_job(job_id)
    assert job.status is JobStatus.succeeded, job.error
    assert job.attempts == 2
    result = job.result or {}
    assert result["steps"] == STEPS
    assert done_at_kill - 1 <= result["resumed_from"] <= done_at_kill  # checkpoint every step: at most one step redone
    # metrics: every step exactly once, for every metric name
    with session(db_url, read_only=True) as s:
        rows = s.exec(select(Metric).where(Metric.job_id == job_id)).all()
        trajectories = s.exec(select(Trajectory).where(Trajectory.job_id == job_id)).all()
    per_name: dict[str, list[int]] = {}
    for m in rows:
        per_name.setdefault(m.name, []).append(m.step)
    assert sorted(per_name["rollout/reward_mean"]) == list(range(1, STEPS + 1))
    for name in (
        "rollout/pass_rate",
        "time/step_s",
        "pipeline/learner_busy_frac",
        "memory/peak_rss_rollout_gb",
        "memory/peak_rss_gb",
    ):
        assert sorted(per_name[name]) == list(range(1, STEPS + 1)), name
    peaks = {(m.name, m.step): m.value for m in rows if m.name.startswith("memory/")}  # the process's peak so far, GiB
    assert all(
        0.1 < peaks["memory/peak_rss_rollout_gb", n] <= peaks["memory/peak_rss_gb", n] < 64 for n in range(1, STEPS + 1)
    )
    # trajectories: every step, at most PER_STEP each (a redone step replaced, not doubled)
    counts = Counter(t.step for t in trajectories)
    assert sorted(counts) == list(range(1, STEPS + 1))
    assert set(counts.values()) == {PER_STEP}  # 2 groups x 4 completions, capped at 5
    sample = trajectories[0]
    assert sample.domain in ("format.to_hex", "format.from_words")
    assert sample.prompt[0]["role"] == "user" and sample.prompt[0]["content"]
    assert "score" in sample.verdict and "passed" in sample.verdict and 0.0 <= sample.reward <= 1.0
    # the final model: registered, with lineage, servable directory
    assert result["model"] == "tiny-grpo" and result["base_model"] == "tiny"
    produced = get_model("tiny-grpo")
    assert produced.produced_by_job_id == job_id
    assert [m.name for m in lineage("tiny-grpo")] == ["tiny-grpo", "tiny"]
    assert (Path(produced.path) / "config.json").is_file() and (Path(produced.path) / "tokenizer.json").is_file()

    # evaluate both, before and after, as a job
    eval_id = queue.submit(
        OPERATOR,
        "evaluate",
        {
            "models": ["tiny", "tiny-grpo"],
            "domains": ["format.to_hex"],
            "difficulty": 3,
            "tasks_per_domain": 4,
            "samples": 2,
            "ks": [1, 2],
            "max_new_tokens": 3,
            "device": "cpu",
        },
    )
    third = start_worker(platform_env, "--exit-when-idle")
    try:
        assert third.wait(timeout=200) == 0
    finally:
        stop_worker(third)
    evaluated = queue.get_job(eval_id)
    assert evaluated.status is JobStatus.succeeded, evaluated.error
    out = evaluated.result or {}
    row = out["comparison"]["pass@1"]["format.to_hex"]
    assert set(row) == {"tiny", "tiny-grpo", "delta"} and row["delta"] == pytest.approx(row["tiny-grpo"] - row["tiny"])
    assert "pass@2" in out["comparison"]
    assert _metric_steps(db_url, eval_id, "eval/format.to_hex/pass@2") == [0, 1]
    assert _metric_steps(db_url, eval_id, "compare/format.to_hex/delta_pass@1") == [0]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_unknown_model_fails_as_bad_input(platform_env: dict[str, str]) -> None:
    job_id = queue.submit(OPERATOR, "train_grpo", _grpo_config(model="no-such-model", max_steps=1))
    proc = start_worker(platform_env, "--exit-when-idle")
    assert proc.wait(timeout=120) == 0
    job = queue.get_job(job_id)
    assert job.status is JobStatus.failed and job.attempts == 1
    assert "'no-such-model' is neither a registered model name nor a model directory" in (job.error or "")


def test_yaml_config_with_a_preset_validates_and_overrides(tmp_path: Path) -> None:
    assert "cpu-demo" in preset_names()
    text = "preset: cpu-demo\nmodel: demo-sft\nmax_steps: 7\nscheduler: {batch_size: 4}\n"
    config = validate_config("train_grpo", yaml.safe_load(text))
    assert isinstance(config, GRPOConfig)
    demo = get_preset("cpu-demo").grpo
    assert config.max_steps == 7 and config.model == "demo-sft" and config.scheduler.batch_size == 4
    assert (
        config.domains == demo.domains
        and config.optim.lr == demo.optim.lr
        and config.algorithm.group_size == demo.algorithm.group_size
    )
    with pytest.raises(JobConfigError, match="unknown preset 'nope'"):
        validate_config("train_grpo", {"preset": "nope"})
    with pytest.raises(JobConfigError, match="trajectories_per_step"):
        validate_config("train_grpo", {"preset": "cpu-demo", "trajectories_per_step": -1})
    assert validate_config("evaluate", {"preset": "cpu-demo", "models": ["a", "b"]}).model_list == ["a", "b"]  # type: ignore[attr-defined]
    # a domain with no held-out split at the difficulty asked is refused at submit, naming the fix
    with pytest.raises(
        JobConfigError, match=r"'format.to_hex' has about 10 distinct prompts at difficulty 1.*higher difficulty"
    ):
        validate_config("evaluate", {"model": "a", "domains": ["format.to_hex"]})
    with pytest.raises(JobConfigError, match="unknown domain 'nope.nope'"):
        validate_config("evaluate", {"model": "a", "domains": ["nope.nope"]})
    with pytest.raises(JobConfigError, match="ks"):
        validate_config("evaluate", {"model": "a", "domains": ["x"], "ks": [4]})


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    from math import comb

    for n, c, k in [(10, 3, 1), (10, 3, 5), (8, 0, 2), (8, 8, 8), (20, 7, 10), (5, 4, 2)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_train_preset_runs_the_whole_recipe_and_resumes_after_its_finished_stages(
    platform_env: dict[str, str], db_url: str
) -> None:
    """The console's one-click demo: build, SFT, evaluate, GRPO, evaluate in one job; killed during
    GRPO, the next attempt skips the finished stages and continues GRPO from its checkpoint."""
    with pytest.raises(JobConfigError, match="unknown preset 'nope'"):
        queue.submit(OPERATOR, "train_preset", {"preset": "nope"})
    with pytest.raises(JobConfigError, match="group_size"):
        queue.submit(OPERATOR, "train_preset", {"grpo": {"group_size": 1}})
    # cpu-quick with shorter stages: this test is about the stages and their resumption; the gain itself
    # is checked on the whole preset by test_training_learning and the browser test
    sft_steps, grpo_steps = 100, 40
    job_id = queue.submit(OPERATOR, "train_preset", {"preset": "cpu-quick", "name": "quick", "sft": {"max_steps": sft_steps},
                                           "grpo": {"max_steps": grpo_steps}})  # fmt: skip
    preset = get_preset("cpu-quick")
    crash_after_steps_and_rerun(platform_env, db_url, job_id, 25, grpo_steps)  # GRPO checkpoints every 20
    job = queue.get_job(job_id)
    assert job.status is JobStatus.succeeded, job.error
    assert job.attempts == 2
    log = Path(job.log_path or "").read_text()
    assert "continues after the finished stages base, sft, eval_before" in log
    assert "resumes from checkpoint" in log  # GRPO continues from its checkpoint
    result = job.result or {}
    # every stage's metrics exactly once per step
    assert _metric_steps(db_url, job_id, "sft/loss") == list(range(1, sft_steps + 1))
    assert _metric_steps(db_url, job_id, "rollout/reward_mean") == list(range(1, grpo_steps + 1))
    assert _metric_steps(db_url, job_id, "eval/pass@1") == [
        0,
        1,
        2,
    ]  # before (the SFT model), after (GRPO), the control
    assert _metric_steps(db_url, job_id, "control/loss") == list(range(sft_steps + 1, sft_steps + grpo_steps + 1))
    # the models, with their lineage
    assert result["model"] == "quick" and result["sft_model"] == "quick-sft" and result["base_model"] == "quick-base"
    assert [m.name for m in lineage("quick")] == ["quick", "quick-sft", "quick-base"]
    assert [m.name for m in lineage("quick-control")] == ["quick-control", "quick-sft", "quick-base"]
    assert result["gain_points"] == pytest.approx(100 * (result["pass_after"] - result["pass_before"]), abs=0.01)
    # its own comparison: the same held-out tasks before and after, paired task by task (the Compare tab opens it)
    arena = result["arena"]
    assert (arena["a"], arena["b"]) == ("quick-sft", "quick") and arena["domains"]["all"]["tasks"] == result[
        "eval_tasks"
    ]
    assert arena["domains"]["all"]["delta"] == pytest.approx(result["pass_after"] - result["pass_before"])
    assert arena["disagreements_total"] == arena["domains"]["all"]["wins"] + arena["domains"]["all"]["losses"]
    # on prompts no training step drew (GRPO: the steps of the attempt that finished), beside the control
    assert result["eval_tasks"] == preset.eval.tasks_per_domain and result["eval_unseen_fraction"] == 1.0
    assert 0 < result["grpo_steps_checked"] < grpo_steps  # killed part-way: the rerun checked its own steps
    assert result["control_model"] == "quick-control" and result["control_steps"] == grpo_steps
    assert result["gain_over_control_points"] == pytest.approx(
        100 * (result["pass_after"] - result["control_after"]), abs=0.01
    )


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_recipe_that_evaluates_its_model_before_sft_shows_three_models_side_by_side(
    platform_env: dict[str, str], db_url: str
) -> None:
    """``evaluate_base`` (gemma3-base-to-instruct's: a base model is evaluated before SFT too, in the completion
    format): the evaluations of the model before SFT, after SFT and after GRPO log at steps 0, 1 and 2, the result
    names the three models in that order with the figures of the first, and the comparison puts them side by side."""
    job_id = queue.submit(OPERATOR, "train_preset", {
        "preset": "cpu-quick", "name": "three", "sft": {"max_steps": 5}, "grpo": {"max_steps": 2},
        "eval": {"tasks_per_domain": 8}, "control": False, "evaluate_base": True})  # fmt: skip
    run_worker_until_idle(platform_env)
    job = queue.get_job(job_id)
    assert job.status is JobStatus.succeeded, job.error
    assert _metric_steps(db_url, job_id, "eval/pass@1") == [0, 1, 2]
    result = job.result or {}
    assert result["models"] == ["three-base", "three-sft", "three"] and result["pass_base"] is not None
    assert list(result["comparison"]["pass@1"]["all"]) == ["three-base", "three-sft", "three", "delta"]
    assert result["comparison"]["pass@1"]["all"]["three-base"] == result["pass_base"]
    assert result["gain_points"] == pytest.approx(100 * (result["pass_after"] - result["pass_before"]), abs=0.01)
    assert "continues after" not in Path(job.log_path or "").read_text()


def test_job_kinds_store_typed_results_that_read_back_typed() -> None:
    from pydantic import ValidationError

    from posttrain.platform.jobs.registry import get_kind, read_result, result_json
    from posttrain.training.jobs import EvalJobResult, TrainJobResult

    made = TrainJobResult(steps=3, model="m", base_model="b", checkpoint="/runs/x/checkpoints/step_00000003")
    stored = result_json(get_kind("train_grpo"), made)
    assert stored["model"] == "m" and read_result("train_grpo", stored) == made
    evaluation = EvalJobResult(
        models=["a", "b"],
        paths={"a": "/a", "b": "/b"},
        pass_at_1={"a": 0.5, "b": 0.75},
        reports={"a": {"eval/pass@1": 0.5}, "b": {"eval/pass@1": 0.75}},
    )
    stored = result_json(get_kind("evaluate"), evaluation)
    assert stored["pass@1"] == {"a": 0.5, "b": 0.75}  # the key results have always been stored under
    assert read_result("evaluate", stored) == evaluation and read_result("evaluate", None) is None
    with pytest.raises(ValidationError, match="steps"):  # a kind's plain-dict result is checked against its model
        result_json(get_kind("train_sft"), {"steps": "many", "model": "m"})


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_grpo_trains_on_a_stored_task_sets_train_split_and_a_missing_set_fails_at_the_start(
        platform_env: dict[str, str], db_url: str, tmp_path: Path) -> None:  # fmt: skip
    """``task_set``: the run draws the set's train tasks only (its eval split is what evaluation reads); a set
    that is not there, or a domain it does not hold, fails the job at its start as bad input, naming it. A domain
    naming its own ``task_set`` is drawn from that set beside generated domains."""
    from posttrain.platform.tasks import store
    from posttrain.platform.tasks.domains import generate

    register_model(OPERATOR, "tiny", tiny_policy_dir(tmp_path / "tiny"))
    train = generate("format.to_hex", 6, seed=0, difficulty=3, split="train")
    held = generate("format.to_hex", 4, seed=1, difficulty=3, split="eval")
    store.save_tasks("hexes", train + held)
    config = _grpo_config(domains=[], task_set="hexes", max_steps=2, checkpoint_every=0, trajectories_per_step=8)
    good = queue.submit(OPERATOR, "train_grpo", config)
    missing = queue.submit(OPERATOR, "train_grpo", {**config, "task_set": "no-such-set"})
    other = queue.submit(OPERATOR, "train_grpo", {**config, "domains": ["format.zero_pad"]})
    beside = {
        **config,
        "task_set": None,
        "scheduler": {"batch_size": 4, "seed": 0},
        "domains": [{"name": "format.zero_pad", "difficulty": 2}, {"name": "format.to_hex", "task_set": "hexes"}],
    }
    mixed = queue.submit(OPERATOR, "train_grpo", beside)
    mixed_missing = queue.submit(
        OPERATOR,
        "train_grpo",
        {**beside, "domains": ["format.zero_pad", {"name": "format.to_hex", "task_set": "no-such-set"}]},
    )
    run_worker_until_idle(platform_env, timeout=300)
    job = queue.get_job(good)
    assert job.status is JobStatus.succeeded, job.error
    with session(db_url, read_only=True) as s:
        drawn = {t.verdict["task_id"] for t in s.exec(select(Trajectory).where(Trajectory.job_id == good)).all()}
    assert drawn and drawn <= {t.task_id for t in train}  # 2 steps x 2 prompts, none from the eval split
    job = queue.get_job(mixed)
    assert job.status is JobStatus.succeeded, job.error
    with session(db_url, read_only=True) as s:
        rows = s.exec(select(Trajectory).where(Trajectory.job_id == mixed)).all()
    stored = {t.verdict["task_id"] for t in rows if t.verdict["task_id"] in {x.task_id for x in train}}
    generated = [t for t in rows if t.verdict["task_id"] not in {x.task_id for x in train}]
    assert stored and generated, rows  # 2 steps x 4 prompts: both domains drawn, the stored one from its train split
    assert {t.verdict["task_id"] for t in rows} & {t.task_id for t in held} == set()
    for job_id, named in (
        (missing, "task set 'no-such-set' holds no train tasks"),
        (other, "no train tasks in domains ['format.zero_pad']"),
        (mixed_missing, "task set 'no-such-set' holds no train tasks in domains ['format.to_hex']"),
    ):
        failed = queue.get_job(job_id)
        assert (
            failed.status is JobStatus.failed and failed.error_cause == "bad_input" and named in (failed.error or "")
        ), failed.error
    with pytest.raises(JobConfigError, match="list their own tasks"):
        validate_config(
            "train_grpo", {**config, "domains": [{"name": "format.to_hex", "tasks": [t.model_dump() for t in train]}]}
        )
    with pytest.raises(JobConfigError, match="list their own tasks"):
        validate_config(
            "train_grpo",
            {
                **beside,
                "domains": [{"name": "format.to_hex", "task_set": "hexes", "tasks": [t.model_dump() for t in train]}],
            },
        )
