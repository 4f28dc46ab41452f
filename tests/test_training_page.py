"""The Training page, run by Streamlit's AppTest against a real database (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from conftest import OPERATOR, REPO_ROOT, login_as, run_worker_until_idle
from sqlalchemy import insert
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.errors import AppTestError
from test_metrics import chart_frame, insert_metrics

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Job, JobStatus, Model, Trajectory
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import validate_config
from posttrain.platform.models.importer import DEFAULT_MODEL as REAL_MODEL
from posttrain.platform.settings import get_settings
from posttrain.training.presets import get_preset, preset_names

TRAINING_PAGE = str(REPO_ROOT / "ui" / "views" / "training.py")
GRPO = {"model": "var/models/tiny", "domains": ["arith.add.int", "str.copy.letters"], "max_steps": 40}


def page(role: str = "operator") -> AppTest:
    at = login_as(AppTest.from_file(TRAINING_PAGE, default_timeout=60), role).run()
    assert not at.exception, at.exception
    return at


def in_console(role: str = "operator") -> AppTest:
    """The Training page inside the whole console (its links to other pages need the navigation)."""
    at = login_as(AppTest.from_file(str(REPO_ROOT / "ui" / "app.py"), default_timeout=60), role).run()
    at.switch_page("views/training.py").run()
    assert not at.exception, at.exception
    return at


def trajectory_table(at: AppTest):  # type: ignore[no-untyped-def]
    """The trajectory browser's page of rows (the picked trajectory's verdict table follows it)."""
    return next(t.value for t in at.dataframe if "completion" in t.value.columns)


def all_jobs() -> list:  # type: ignore[type-arg]
    return queue.list_jobs(limit=1000)


def test_renders_with_no_runs(platform_env: dict[str, str]) -> None:
    at = page()
    assert at.title[0].value == "Training"
    assert any("No training runs yet" in i.value for i in at.info)
    assert not at.get("vega_lite_chart")
    assert "preset: " in at.text_area(key="yaml_text").value  # the editor starts from a preset


def test_yaml_launch_creates_a_job_with_the_validated_config(platform_env: dict[str, str]) -> None:
    at = page()
    at.selectbox(key="yaml_kind").set_value("train_sft").run()
    at.text_area(key="yaml_text").set_value(
        "model: var/models/tiny\ndomains: [str.copy.letters]\nmax_steps: 7\nlr: 0.001\n"
    )
    at.button(key="yaml_validate").click().run()
    assert any("Valid `train_sft` config" in s.value for s in at.success)
    assert not all_jobs()  # validating launches nothing

    at.button(key="yaml_launch").click().run()
    assert not at.exception and not at.error
    (job,) = all_jobs()
    assert any(f"job {job.id}" in s.value for s in at.success)
    assert job.kind == "train_sft" and job.submitted_by == "tester"
    assert (
        job.config["domains"] == ["str.copy.letters"]
        and job.config["max_steps"] == 7
        and job.config["optim"]["lr"] == 0.001
    )
    assert job.config["micro_batch_size"] == 4  # stored with every default filled in by SFTConfig
    assert at.selectbox(key="run_id").value == job.id  # the new run opens in the run view


def test_one_click_preset_launch_and_edit_in_yaml(platform_env: dict[str, str]) -> None:
    demo = get_preset("cpu-demo")
    at = page()
    assert any("No model is registered yet" in w.value for w in at.warning)
    assert at.button(key="preset_launch").disabled  # a run needs a model to start from

    with session() as s:
        s.add(Model(name="sft-m1", path="/models/sft-m1", architecture="Qwen2ForCausalLM"))
    at.run()
    at.selectbox(key="preset_name").set_value("cpu-demo").run()
    assert at.selectbox(key="preset_kind").value == "train_grpo"
    assert at.selectbox(key="preset_model").value == "sft-m1"
    at.button(key="preset_launch").click().run()
    assert not at.exception and not at.error
    (job,) = all_jobs()
    assert job.kind == "train_grpo" and job.config["model"] == "sft-m1"
    assert (
        job.config["domains"] == [d if isinstance(d, str) else d.model_dump() for d in demo.grpo.domains]
        and job.config["max_steps"] == demo.grpo.max_steps
    )
    assert job.config["algorithm"]["group_size"] == demo.grpo.algorithm.group_size and job.config["device"] == "cpu"

    # "Edit in the YAML editor" copies the preset's section (and the model) into the editor
    at.selectbox(key="preset_kind").set_value("train_sft").run()
    at.button(key="preset_edit").click().run()
    assert at.selectbox(key="yaml_kind").value == "train_sft"
    text = at.text_area(key="yaml_text").value
    assert "model: sft-m1" in text and f"max_steps: {demo.sft.max_steps}" in text
    at.text_area(key="yaml_text").set_value(text.replace(f"max_steps: {demo.sft.max_steps}", "max_steps: 3"))
    at.button(key="yaml_launch").click().run()
    assert not at.exception and not at.error
    sft = all_jobs()[0]
    assert sft.kind == "train_sft" and sft.config["model"] == "sft-m1" and sft.config["max_steps"] == 3
    assert sft.config["optim"]["lr"] == demo.sft.optim.lr


def test_invalid_yaml_shows_a_clear_error_and_creates_nothing(platform_env: dict[str, str]) -> None:
    at = page()
    editor = at.text_area(key="yaml_text")
    editor.set_value("model: m\ndomains: [arith.add.int\nmax_steps: 5\n")
    at.button(key="yaml_launch").click().run()
    assert "YAML syntax error at line 3, column 10" in at.error[0].value, at.error[0].value

    at.text_area(key="yaml_text").set_value("model: m\ndomains: []\nmax_steps: 0\nlearning_rate: 0.1\n")
    at.button(key="yaml_launch").click().run()
    message = at.error[0].value
    assert "`max_steps`: Input should be greater than or equal to 1 (got 0)" in message
    assert "`learning_rate`: Extra inputs are not permitted" in message
    at.text_area(key="yaml_text").set_value("model: m\ndomains: []\n")
    at.button(key="yaml_launch").click().run()
    assert "GRPOConfig.domains is empty: name at least one task domain" in at.error[0].value

    at.text_area(key="yaml_text").set_value("- just\n- a list\n")
    at.button(key="yaml_validate").click().run()
    assert "must be a YAML mapping" in at.error[0].value and "got a list" in at.error[0].value
    assert not all_jobs()


def _synthetic_run() -> int:
    job = queue.submit(OPERATOR, "train_grpo", GRPO)
    points: list[tuple[int, str, float]] = []
    for step in range(300):
        points += [
            (step, "train/loss", 1.0 / (step + 1)),
            (step, "train/kl", 0.001 * step),
            (step, "train/clip_frac_low", 0.01),
            (step, "train/clip_frac_high", 0.02),
            (step, "rollout/reward_mean", step / 300),
            (step, "rollout/pass_rate", step / 600),
            (step, "rollout/tokens_per_s", 1234.0),
            (step, "pipeline/learner_busy_frac", 0.8),
            (step, "sched/arith.add.int/pass_rate", 0.5),
            (step, "sched/str.copy.letters/pass_rate", 0.25),
        ]
    insert_metrics(job, points)
    now = datetime.now(UTC)
    rows = [
        {
            "job_id": job, "step": i // 5, "domain": "arith.add.int" if i % 3 else "str.copy.letters",
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"What is {i} + 1?"}],
            "completion": f"answer {i + 1}", "tool_calls": [], "reward": float(i % 2),
            "verdict": {"score": float(i % 2), "passed": bool(i % 2), "details": f"expected {i + 1}"}, "created_at": now,
        }
        for i in range(45)
    ]  # fmt: skip
    with session() as s:
        s.execute(insert(Trajectory), rows)
    return job


def test_charts_and_trajectory_browser_show_a_runs_data(platform_env: dict[str, str]) -> None:
    job = _synthetic_run()
    at = page("viewer")  # viewers see everything
    assert at.selectbox(key="run_id").value == job
    titles = [m.value for m in at.markdown]
    for title in ("**Reward**", "**Loss**", "**KL to the initial policy**", "**Clip fraction**", "**Pass rate by domain**",
                  "**Learner busy fraction**", "**Throughput (tokens/s)**"):  # fmt: skip
        assert title in titles, title
    plotted = {m: f[f["metric"] == m] for f in map(chart_frame, at.get("vega_lite_chart")) for m in set(f["metric"])}
    assert set(plotted) == {
        "train/loss", "train/kl", "train/clip_frac_low", "train/clip_frac_high", "rollout/reward_mean", "rollout/pass_rate",
        "rollout/tokens_per_s", "pipeline/learner_busy_frac", "arith.add.int", "str.copy.letters",
    }  # fmt: skip
    assert len(plotted["train/loss"]) == 300 and plotted["str.copy.letters"]["value"].eq(0.25).all()
    tiles = {m.label: m.value for m in at.metric}
    assert (
        tiles["Step"] == "299" and tiles["Reward"] == "0.997" and tiles["Tokens/s"] == "1,234"
    )  # figures that fit a tile

    # trajectories: 45 rows, 20 per page, newest step first
    table = trajectory_table(at)
    assert len(table) == 20 and table["step"].iloc[0] == 8 and table["prompt"].iloc[0].startswith("What is")
    assert "Page (of 3, 45 trajectories)" == at.number_input(key="traj_page").label
    at.number_input(key="traj_page").set_value(3).run()
    assert len(trajectory_table(at)) == 5
    at.multiselect(key="traj_domains").set_value(["str.copy.letters"]).run()
    at.number_input(key="traj_page").set_value(1).run()
    table = trajectory_table(at)
    assert len(table) == 15 and set(table["domain"]) == {"str.copy.letters"}
    picked = int(table["id"].iloc[0])
    at.selectbox(key="traj_pick").set_value(picked).run()
    with session() as s:
        trajectory = s.get(Trajectory, picked)
        assert trajectory is not None
    assert any(c.value == trajectory.completion for c in at.code)
    assert any(c.value == trajectory.verdict["details"] for c in at.caption)
    assert any("Be brief." == t.value for t in at.text)
    # by step range and by reward: full marks only, of steps 2 to 4, in the chosen domain (rows 10-24 with i odd and i % 3 == 0: 15 and 21)
    at.slider(key="traj_steps").set_value((2, 4)).run()
    at.slider(key="traj_rewards").set_value((1.0, 1.0)).run()
    table = trajectory_table(at)
    assert (
        sorted(table["step"]) == [3, 4]
        and set(table["reward"]) == {1.0}
        and "Page (of 1, 2 trajectories)" == at.number_input(key="traj_page").label
    )
    at.slider(key="traj_steps").set_value((0, 0)).run()
    at.slider(key="traj_rewards").set_value((0.5, 0.5)).run()
    assert "No trajectories match" in at.info[-1].value


def test_stop_cancels_and_resume_continues_from_the_same_output_dir(platform_env: dict[str, str]) -> None:
    queued = queue.submit(OPERATOR, "train_grpo", GRPO)
    running = queue.submit(OPERATOR, "train_grpo", GRPO, priority=5)
    assert queue.claim("w", 1, 0).id == running  # type: ignore[union-attr]

    at = page()
    at.selectbox(key="run_id").set_value(queued).run()
    at.button(key=f"stop_{queued}").click().run()
    assert not at.exception
    assert queue.get_job(queued).status is JobStatus.cancelled
    at.selectbox(key="run_id").set_value(running).run()
    at.button(key=f"stop_{running}").click().run()
    job = queue.get_job(running)
    assert job.status is JobStatus.running and job.cancel_requested  # the worker stops it
    at.run()
    assert all(b.key != f"stop_{running}" for b in at.button)
    assert any("Stop requested" in i.value for i in at.info)

    at.selectbox(key="run_id").set_value(queued).run()
    assert "cancelled before it started" in at.error[0].value
    at.button(key=f"resume_{queued}").click().run()
    assert not at.exception
    assert any(f"Resumed job {queued} as job" in s.value for s in at.success)
    resumed = all_jobs()[0]
    assert resumed.id not in (queued, running) and resumed.kind == "train_grpo"
    assert resumed.config["output_dir"] == str(get_settings().jobs_dir / str(queued) / "run")
    assert resumed.config["checkpoint"]["resume"] is True
    assert {k: v for k, v in resumed.config.items() if k != "output_dir"} == {
        k: v for k, v in queue.get_job(queued).config.items() if k != "output_dir"
    }


def test_evaluate_and_deploy_a_finished_run(platform_env: dict[str, str]) -> None:
    # trained at difficulty 2: evaluated on that level's eval split (difficulty 1 of arith.add.int has none)
    run = queue.submit(
        OPERATOR, "train_grpo", {**GRPO, "domains": [{"name": d, "difficulty": 2} for d in GRPO["domains"]]}
    )
    queue.claim("w", 1, 0)
    queue.finish(
        run, queue.Outcome(exit_code=0, result={"steps": 40, "model": "grpo-run-1", "checkpoint": "/x/step_40"})
    )
    at = page()
    at.button(key=f"evaluate_{run}").click().run()
    assert not at.exception and not at.error
    evaluation = queue.list_jobs(kind="evaluate")[0]
    assert evaluation.config["model"] == "grpo-run-1" and evaluation.config["domains"] == GRPO["domains"]
    assert evaluation.config["difficulty"] == 2
    at.button(key=f"deploy_{run}").click().run()
    deployment = queue.list_jobs(kind="deploy")[0]
    assert deployment.config["model"] == "grpo-run-1" and deployment.config["tier"] == "fast"


def test_evaluation_results_table(platform_env: dict[str, str]) -> None:
    job = queue.submit(
        OPERATOR, "evaluate", {"models": ["before", "after"], "domains": ["arith.add.int"], "difficulty": 2}
    )
    insert_metrics(job, [(0, "eval/arith.add.int/pass@1", 0.25), (0, "eval/pass@1", 0.25),
                         (1, "eval/arith.add.int/pass@1", 0.75), (1, "eval/pass@1", 0.75)])  # fmt: skip
    at = page()
    assert "**Evaluation** of before, after" in [m.value for m in at.markdown]  # the models evaluated, by name
    table = at.dataframe[-1].value.set_index("domain")
    assert table.loc["arith.add.int", "before · pass@1"] == 0.25 and table.loc["all", "after · pass@1"] == 0.75
    assert {m.label: m.value for m in at.metric}["Eval pass@1"] == "0.75"


def test_viewer_cannot_launch_or_stop(platform_env: dict[str, str]) -> None:
    queued = queue.submit(OPERATOR, "train_grpo", GRPO)
    at = page("viewer")
    assert any("viewer" in i.value for i in at.info)
    assert at.button(key="yaml_launch").disabled
    assert all(b.key != f"stop_{queued}" for b in at.button)
    with pytest.raises(AppTestError, match="disabled"):
        at.button(key="yaml_launch").click()
    assert queue.get_job(queued).status is JobStatus.queued

    # The role is checked again where the action runs: a click sent by a page rendered for an operator
    # whose role has since become viewer launches and stops nothing.
    at = page("operator")
    at.selectbox(key="run_id").set_value(queued).run()
    launch, stop = at.button(key="yaml_launch"), at.button(key=f"stop_{queued}")
    login_as(at, "viewer")
    launch.click()
    stop.click().run()
    assert not at.exception
    assert [j.id for j in all_jobs()] == [queued]
    assert queue.get_job(queued).status is JobStatus.queued


def test_console_navigation_reaches_the_training_page(platform_env: dict[str, str]) -> None:
    at = login_as(AppTest.from_file(str(REPO_ROOT / "ui" / "app.py"), default_timeout=60)).run()
    assert not at.exception
    at.switch_page("views/training.py").run()
    assert not at.exception
    assert at.title[0].value == "Training"


def register_builtin() -> None:
    """The demo's starting model registered as ``make run`` registers it (a row: nothing loads it here)."""
    with session() as s:
        s.add(Model(name=REAL_MODEL, path="/nonexistent/smollm2", architecture="LlamaForCausalLM"))


def test_the_demo_starts_from_the_real_model_once_it_is_imported(platform_env: dict[str, str]) -> None:
    at = page()
    assert at.selectbox(key="demo_preset").value == "smollm2-quick"
    assert at.button(key="demo_launch").disabled
    assert any(f"model {REAL_MODEL!r}, which is not imported yet" in w.value for w in at.warning), [
        w.value for w in at.warning
    ]
    # the import is a click here, a job the page follows: no command to run elsewhere
    at.button(key="prepare_model").click().run()
    (imported,) = all_jobs()
    assert imported.kind == "import_model" and imported.config["source"] == f"builtin:{REAL_MODEL}"
    assert any(f"Importing {REAL_MODEL} (job {imported.id})" in c.value for c in at.caption)
    queue.cancel(OPERATOR, imported.id)  # the test registers the model itself, faster than converting it
    register_builtin()
    at.run()
    assert not at.button(key="demo_launch").disabled and not at.warning
    at.button(key="demo_launch").click().run()
    (job,) = queue.list_jobs(kind="train_preset")
    assert job.kind == "train_preset" and job.config["preset"] == "smollm2-quick"
    assert any(f"Launched the whole 'smollm2-quick' recipe as job {job.id}." in s.value for s in at.success)
    # the page the click drew already holds the run: a second click would start a second demo beside it, so the
    # button waits (it was submitted before the page was drawn again, not after the button was drawn enabled)
    assert at.button(key="demo_launch").disabled
    at.run()
    assert at.button(key="demo_launch").disabled
    assert any(f"**Run the demo** waits: the demo is queued (job {job.id})" in c.value for c in at.caption), [
        c.value for c in at.caption
    ]
    queue.claim("w", 1, 0)
    at.run()
    assert at.button(key="demo_launch").disabled and any(
        f"the demo is running (job {job.id})" in c.value for c in at.caption
    )
    assert queue.finish(job.id, queue.Outcome(exit_code=1, error="bad config", cause="bad_input")) is JobStatus.failed
    at.run()
    assert not at.button(key="demo_launch").disabled  # it ended: the button is back


def test_each_preset_shows_its_recorded_cost_before_any_estimate(platform_env: dict[str, str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    from posttrain.platform.jobs.presets import preset_records

    at = page()
    at.selectbox(key="demo_preset").set_value("smollm2-arith").run()
    record = preset_records()["smollm2-arith"]  # bench/results/learning-real.json
    assert record.benchmark == "learning-real" and record.runs == 1 and record.minutes > 1
    assert any(c.value.startswith("Recorded by bench learning-real on ") for c in at.caption), [
        c.value for c in at.caption
    ]
    table = next(d.value for d in at.dataframe if "recorded minutes" in d.value)
    assert set(table["preset"]) == set(preset_names())
    assert table.set_index("preset").loc["smollm2-arith", "recorded minutes"] == round(record.minutes, 1)
    at.selectbox(key="demo_preset").set_value("cpu-quick").run()  # no benchmark records it
    assert any(c.value.startswith("No recording of it yet") for c in at.caption)

    # the recordings read: a preset's own learning-* benchmark first; a run of a few steps is no preset's cost
    def recording(name: str, minutes: float, **summary: object) -> None:
        (tmp_path / f"{name}.json").write_text(
            json.dumps({"date": "2026-12-01T00:00:00", "summary": {"minutes": minutes, **summary}})
        )

    recording("forgetting-p", 130.0, preset="p", arms={"none": {}, "replay": {}}, peak_rss_gb=6.9)
    recording("learning-p", 12.0, preset="p", pass_before=0.15, pass_after=0.37, peak_rss_gb=3.9)
    recording("learning-ablation", 0.2, preset="q")
    recording("forgetting-q", 90.0, preset="q", arms={"none": {}, "kl": {}}, peak_rss_gb=5.0)
    found = preset_records(tmp_path)
    assert found["p"].benchmark == "learning-p" and found["p"].describe() == (
        "recorded by bench learning-p on 2026-12-01: 12 min, peak 3.9 GiB; held-out pass@1 15% → 37%"
    )
    assert found["q"].describe() == "recorded by bench forgetting-q on 2026-12-01: 90 min for 2 runs, peak 5.0 GiB"


def test_a_document_preset_s_task_set_is_built_from_one_click(
    platform_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, browser_timers
) -> None:  # type: ignore[no-untyped-def]
    """smollm2-docqa trains on a task set built from Debian's LaTeX News issues: the page says it is missing, and one
    click uploads the documents, follows their preprocessing and then builds the task set, with no script to run."""
    from posttrain.platform.documents import list_documents
    from posttrain.training import preset_recipes

    issues = [f"/usr/share/doc/texlive-doc/latex/base/ltnews0{n}.pdf" for n in (7, 8)]  # two of the 36: quicker
    monkeypatch.setitem(preset_recipes.DOCQA_DOCUMENTS, "paths", issues)
    register_builtin()
    at = page()
    at.selectbox(key="demo_preset").set_value("smollm2-docqa").run()
    assert at.button(key="demo_launch").disabled
    assert any("task set 'smollm2-docqa' is not built yet" in w.value for w in at.warning), [
        w.value for w in at.warning
    ]
    at.button(key="prepare_documents").click().run()
    assert not at.exception and sorted(d.filename for d in list_documents()) == ["ltnews07.pdf", "ltnews08.pdf"]
    assert browser_timers.timed  # the page follows their preprocessing

    run_worker_until_idle(platform_env)
    at = browser_timers.tick(at)  # preprocessed: the page queues the build itself, as the click asked
    (build,) = queue.list_jobs(kind="build_tasks")
    assert build.config["task_set"] == "smollm2-docqa" and len(build.config["source"]["document_ids"]) == 2
    assert build.config["source"]["kinds"] == ["span_recovery"]  # the preset's own way of building it
    run_worker_until_idle(platform_env)
    at = browser_timers.tick(at)
    assert not at.button(key="demo_launch").disabled and not at.warning


ESTIMATE = {
    "wall_s": 372.0,
    "steps": 8,
    "trajectories": 256,
    "generated_tokens": 5632,
    "eval_tasks": 256,
    "calibration_s": 95.0,
    "stages": [
        {"stage": "job", "seconds": 8.0, "how": "the job process's start and its imports, as this job's: 8.0 s"},
        {"stage": "grpo", "seconds": 300.0, "how": "setup 9.0 s + 8 steps x 36.0 s (1 measured after a warm-up step)"},
        {"stage": "eval_before", "seconds": 32.0, "how": "load 2.0 s + 64 tasks x 0.25 s"},
        {"stage": "eval_after", "seconds": 32.0, "how": "load 2.0 s + 64 tasks x 0.25 s"},
    ],
}


def test_estimate_before_launch_then_estimate_against_actual(platform_env: dict[str, str]) -> None:
    register_builtin()
    at = in_console()
    assert any("Not estimated yet" in c.value for c in at.caption)
    at.button(key="estimate_demo").click().run()
    assert not at.exception and not at.error
    (estimate,) = queue.list_jobs(kind="estimate")
    # the run's config exactly as the run's job will store it: that is how the run finds its estimate
    assert estimate.config["kind"] == "train_preset" and estimate.submitted_by == "tester"
    assert estimate.config["config"] == validate_config("train_preset", {"preset": "smollm2-quick"}).model_dump(
        mode="json"
    )
    at.run()
    assert at.button(key="estimate_demo").disabled  # one estimate at a time
    assert any(f"Estimating (job {estimate.id})" in p.proto.text for p in at.get("progress"))

    assert queue.claim("w", 1, 0).id == estimate.id  # type: ignore[union-attr]
    queue.finish(
        estimate.id,
        queue.Outcome(exit_code=0, result={"kind": "train_preset", "config": estimate.config["config"], **ESTIMATE}),
    )  # type: ignore[arg-type]
    at.run()
    assert any(
        f"**Estimate** (job {estimate.id}): about 6.2 min on this host: 8 training steps, 256 trajectories, about "
        "5,632 generated tokens, 256 eval tasks, measured by a 1.6 min calibration." in i.value
        for i in at.info
    ), [i.value for i in at.info]
    stages = next(d.value for d in at.dataframe if "stage" in d.value)
    assert (
        list(stages["stage"]) == ["job", "grpo", "eval_before", "eval_after"]
        and list(stages["estimate"])[1] == "5.0 min"
    )

    at.button(key="demo_launch").click().run()
    run = queue.list_jobs(kind="train_preset")[0]
    assert queue.claim("w", 1, 0).id == run.id  # type: ignore[union-attr]
    queue.finish(
        run.id,
        queue.Outcome(
            exit_code=0,
            result={  # type: ignore[arg-type]
                "model": "q",
                "sft_model": REAL_MODEL,
                "models": [REAL_MODEL, "q"],
                "domains": ["arith.add.int"],
                "gain_points": 10.0,
                "eval_tasks": 64,
                "eval_unseen_fraction": 1.0,
            },
        ),
    )
    with session() as s:  # it took 400 s
        row = s.get(Job, run.id)
        row.started_at = row.finished_at - timedelta(seconds=400)  # type: ignore[union-attr, operator]
    at.selectbox(key="run_id").set_value(run.id).run()
    assert not at.exception
    # 400 s against an estimate of 372: the run went 8% past it (the wording says which way, of the estimate)
    assert any(
        f"Estimate against actual: estimated 6.2 min (job {estimate.id}), took 6.7 min: 8% longer than estimated."
        in i.value
        for i in at.info
    ), [i.value for i in at.info]


def test_viewer_cannot_estimate(platform_env: dict[str, str]) -> None:
    register_builtin()
    assert page("viewer").button(key="estimate_demo").disabled
    at = page("operator")
    button = at.button(key="estimate_demo")
    login_as(at, "viewer")
    button.click().run()
    assert not at.exception and queue.list_jobs(kind="estimate") == []


def test_one_click_demo_launches_the_whole_recipe_and_shows_the_gain(platform_env: dict[str, str]) -> None:
    at = in_console()
    at.selectbox(key="demo_preset").set_value("cpu-quick").run()
    at.button(key="demo_launch").click().run()
    assert not at.exception and not at.error
    job = all_jobs()[0]
    assert job.kind == "train_preset" and job.config["preset"] == "cpu-quick" and job.submitted_by == "tester"
    assert at.selectbox(key="run_id").value == job.id

    # while it runs: the warmed-up model's figure; when done: before -> after, evaluate and deploy
    queue.claim("w", 1, 0)
    insert_metrics(
        job.id, [(0, "eval/pass@1", 0.4), (1, "sft/loss", 2.0), (2, "sft/loss", 1.5), (1, "rollout/reward_mean", 0.2)]
    )
    at.run()
    assert any("before GRPO: 40.0%" in i.value for i in at.info)
    assert "**SFT warm-up loss**" in [m.value for m in at.markdown]
    insert_metrics(job.id, [(1, "eval/pass@1", 0.78), (2, "eval/pass@1", 0.7)])
    queue.finish(
        job.id,
        queue.Outcome(
            exit_code=0,
            result={  # type: ignore[arg-type]
                "model": "q",
                "sft_model": "q-sft",
                "models": ["q-sft", "q"],
                "domains": ["format.zero_pad"],
                "gain_points": 38.0,
                "eval_tasks": 100,
                "eval_unseen_fraction": 1.0,
                "control_model": "q-control",
                "control_steps": 60,
            },
        ),
    )
    at.run()
    # what was measured, exactly: unseen eval tasks, the gain, and the control that trained as long
    assert any(
        "Held-out pass@1 on 100 eval tasks, 100% unseen in training: q-sft 40.0% → q 78.0% (+38.0 points); "
        "SFT control (60 more SFT steps from the same warm-up) 70.0%, GRPO +8.0 points over it" in s.value
        for s in at.success
    ), [s.value for s in at.success]
    at.button(key=f"evaluate_{job.id}").click().run()
    evaluation = queue.list_jobs(kind="evaluate")[0]
    assert (
        evaluation.config["models"] == ["q-sft", "q"]
        and evaluation.config["domains"] == get_preset("cpu-quick").eval.domains
    )
    at.button(key=f"deploy_{job.id}").click().run()
    assert queue.list_jobs(kind="deploy")[0].config["model"] == "q"


def test_viewer_cannot_run_the_demo(platform_env: dict[str, str]) -> None:
    register_builtin()
    at = page("viewer")
    assert at.button(key="demo_launch").disabled
    at = page("operator")
    button = at.button(key="demo_launch")
    login_as(at, "viewer")
    button.click().run()
    assert not at.exception and all_jobs() == []


def test_a_finished_run_links_to_the_arena_against_its_base(platform_env: dict[str, str]) -> None:
    job_id = queue.submit(OPERATOR, "train_grpo", GRPO)
    claimed = queue.claim("w", 1, 0)
    assert claimed is not None and claimed.id == job_id
    queue.finish(job_id, queue.Outcome(exit_code=0, result={"steps": 40, "model": "tuned", "base_model": "tiny"}))
    running = queue.submit(OPERATOR, "train_grpo", GRPO)
    at = in_console("viewer")
    at.selectbox(key="run_id").set_value(job_id).run()
    (link,) = at.get("page_link")  # in-app navigation: the same session, still logged in
    assert link.proto.label == "Compare tuned with its base tiny" and link.proto.page == "models"
    assert (
        link.proto.query_string
        == "compare_a=tiny&compare_b=tuned&compare_domains=arith.add.int%2Cstr.copy.letters&compare_difficulty=1"
    )
    at.selectbox(key="run_id").set_value(running).run()
    assert not at.get("page_link")  # nothing to compare before the run has registered its model
