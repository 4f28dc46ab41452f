"""The gate before deploy (issue 47, item 5): a trained model whose general check fell beyond 2 paired SEs below the
model it was trained from is stated with the figure (``models list``, the Models page), and deploying it is refused
by the platform action that queues deploys (the console, the CLI and a job config all go through it) unless the
deploy says ``allow_regression``; the override is audited under the name of whoever made it. Real databases (SQLite
and PostgreSQL), the real CLI in a subprocess, the real page in Streamlit's AppTest; the regressed model is a tiny
model registered with the figure its run would have stored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import OPERATOR, REPO_ROOT, login_as
from sqlmodel import select
from streamlit.testing.v1 import AppTest

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import AuditLog, Job
from posttrain.platform.jobs import queue
from posttrain.platform.models.general_check import NOT_MEASURED, GeneralCheck, regressed
from posttrain.platform.models.registry import get_model, record_general_check, register_model
from posttrain.platform.serving.jobs import DeployConfig, RegressionRefused, check_regression

PAGE = str(REPO_ROOT / "ui" / "views" / "models.py")
# what a run's head_to_head(...)["general"] holds (posttrain.platform.stats.Difference.as_dict()): 16.4 points down
FELL = {"a": 0.5, "b": 0.336, "delta": -0.164, "se": 0.031, "tasks": 128, "paired": True, "clusters": None,
        "unpaired_se": 0.06, "wins": 3, "ties": 100, "losses": 25, "ci_low": -0.225, "ci_high": -0.103}  # fmt: skip
WITHIN = FELL | {"b": 0.45, "delta": -0.05, "se": 0.031}  # a drop inside 2 SE: noise, not a regression
DROP = "16.4 ± 3.1 points below start (paired SE, 128 tasks)"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from posttrain.platform.models import TinyModelSpec, build_tiny_model

    spec = TinyModelSpec(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
    return build_tiny_model(tmp_path_factory.mktemp("gate") / "tiny", spec)


def registered(tiny_dir: Path, url: str | None = None) -> None:
    """``start`` (never measured), ``trained`` from it (fell 16.4 ± 3.1 points) and ``steady`` from it (fell 5.0 ± 3.1,
    within noise), as a run records them."""
    register_model(OPERATOR, "start", tiny_dir, url=url)
    for name, figure in (("trained", FELL), ("steady", WITHIN)):
        register_model(OPERATOR, name, tiny_dir, base="start", produced_by_job_id=None, url=url)
        record_general_check(name, GeneralCheck.from_difference("start", figure, job_id=7), by="job:7", url=url)


def overrides(url: str) -> list[AuditLog]:
    with session(url, read_only=True) as s:
        return list(s.exec(select(AuditLog).where(AuditLog.action == "deploy.allow_regression")).all())


def deploy_jobs(url: str) -> list[Job]:
    with session(url, read_only=True) as s:
        return list(s.exec(select(Job).where(Job.kind == "deploy")).all())


def test_the_rule_beyond_two_paired_ses() -> None:
    assert regressed(-0.164, 0.031) and regressed(-0.063, 0.031)  # 2.03 SE below
    assert not regressed(-0.061, 0.031) and not regressed(-0.05, 0.031) and not regressed(0.10, 0.031)
    assert regressed(-0.01, 0.0) and not regressed(0.0, 0.0)  # no spread to measure: any drop
    check = GeneralCheck.from_difference("start", FELL, job_id=7)
    assert check.regressed and check.as_meta()["regressed"] is True
    assert check.describe() == f"general check fell {DROP}"
    steady = GeneralCheck.from_difference("start", WITHIN)
    assert not steady.regressed and steady.describe().endswith("within 2 SE")
    assert GeneralCheck.from_meta({"general_check": check.as_meta()}) == check
    assert GeneralCheck.from_meta({}) is None and NOT_MEASURED == "general check: not measured"


def test_deploy_of_a_regressed_model_is_refused_unless_allowed_and_the_override_is_audited(
        platform_env: dict[str, str], db_url: str, tiny_dir: Path) -> None:  # fmt: skip
    registered(tiny_dir)
    with pytest.raises(RegressionRefused) as refused:
        queue.submit(OPERATOR, "deploy", {"model": "trained", "tier": "fast"})
    message = str(refused.value)
    assert "'trained'" in message and DROP in message and "--allow-regression" in message
    assert "allow_regression: true" in message
    with pytest.raises(RegressionRefused):  # many at once: the same gate
        queue.submit_many(OPERATOR, "deploy", [{"model": "steady"}, {"model": "trained"}], [0, 0])
    assert deploy_jobs(db_url) == [] and overrides(db_url) == []  # nothing written

    assert queue.submit(OPERATOR, "deploy", {"model": "steady"})  # within noise, and never measured: no gate
    assert queue.submit(OPERATOR, "deploy", {"model": "start"})
    assert overrides(db_url) == []

    job_id = queue.submit(OPERATOR, "deploy", {"model": "trained", "tier": "fast", "allow_regression": True})
    (audit,) = overrides(db_url)
    assert (audit.username, audit.target) == (OPERATOR.username, "trained")
    assert audit.details["job"] == job_id and audit.details["drop"] == DROP
    assert audit.details["general_check"]["delta"] == pytest.approx(-0.164)
    assert queue.get_job(job_id).config["allow_regression"] is True

    # the job itself checks again: a deploy queued before the run measured the drop is refused when it starts
    with pytest.raises(RegressionRefused):
        check_regression(DeployConfig(model="trained"), get_model("trained"))
    assert check_regression(DeployConfig(model="trained", allow_regression=True), get_model("trained")) is not None


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "posttrain.platform.cli", *args], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_cli_lists_the_figure_and_refuses_the_deploy_without_the_flag(platform_env: dict[str, str],
                                                                       tiny_dir: Path) -> None:  # fmt: skip
    url = platform_env["POSTTRAIN_DATABASE_URL"]
    registered(tiny_dir)
    listed = cli(platform_env, "models", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    trained, steady, start = rows["trained"], rows["steady"], rows["start"]
    assert trained["general_regressed"] is True and trained["general_against"] == "start"
    assert trained["general_delta"] == pytest.approx(-0.164) and trained["general_se"] == pytest.approx(0.031)
    assert trained["general_tasks"] == 128 and trained["general_check"] == f"general check fell {DROP}"
    assert steady["general_regressed"] is False
    assert start["general_regressed"] is None and start["general_delta"] is None
    assert start["general_check"] == "general check: not measured"
    table = cli(platform_env, "models", "list").stdout
    assert "-16.4 ± 3.1 pts REGRESSED" in table and "not measured" in table

    for refused in (cli(platform_env, "models", "deploy", "trained"),
                    cli(platform_env, "jobs", "submit", "deploy", "--config", '{"model": "trained"}')):  # fmt: skip
        assert refused.returncode == 2, (refused.stdout, refused.stderr)
        line = " ".join(refused.stderr.split())
        assert "'trained'" in line and DROP in line and "--allow-regression" in line, line
    assert deploy_jobs(url) == [] and overrides(url) == []

    allowed = cli(platform_env, "models", "deploy", "trained", "--tier", "fast", "--allow-regression")
    assert allowed.returncode == 0, allowed.stderr
    by_config = cli(
        platform_env, "jobs", "submit", "deploy", "--config", '{"model": "trained", "allow_regression": true}'
    )
    assert by_config.returncode == 0, by_config.stderr
    audits = overrides(url)
    assert len(audits) == 2 and all(a.username.startswith("cli:") and a.target == "trained" for a in audits)
    assert sorted(a.details["job"] for a in audits) == sorted(j.id for j in deploy_jobs(url))


def test_the_models_page_states_the_drop_and_deploys_only_after_confirming(platform_env: dict[str, str],
                                                                           tiny_dir: Path) -> None:  # fmt: skip
    url = platform_env["POSTTRAIN_DATABASE_URL"]
    registered(tiny_dir)
    at = login_as(AppTest.from_file(PAGE, default_timeout=60)).run()
    assert not at.exception
    table = at.dataframe[0].value.set_index("model")
    assert table.loc["trained", "general check"] == "-16.4 ± 3.1 pts REGRESSED"
    assert table.loc["start", "general check"] == "not measured"
    assert any(DROP in w.value and "trained" in w.value for w in at.warning), [w.value for w in at.warning]

    at.selectbox(key="deploy_model").set_value("trained")
    at.button[3].click().run()  # Deploy (after Import, Build and Register)
    assert not at.exception and deploy_jobs(url) == []  # not submitted: asked first
    asking = [w.value for w in at.warning if "Deploy it anyway" in w.value]
    assert asking and DROP in asking[0], [w.value for w in at.warning]
    at.button(key="deploy_pending_confirm").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    (job,) = deploy_jobs(url)
    assert job.config["model"] == "trained" and job.config["allow_regression"] is True
    (audit,) = overrides(url)
    assert (audit.username, audit.details["job"]) == ("tester", job.id)
    assert "deploy_pending" not in at.session_state


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_run_stores_each_trained_model_s_general_check_beside_the_model_it_was_trained_from(
        platform_env: dict[str, str], db_url: str) -> None:  # fmt: skip
    """A whole recipe with the general check on (the model before SFT evaluated too): the GRPO result's figure beside
    the SFT model, and the SFT model's beside the model before it, as the run's own paired comparison computed them;
    the model it started from was never trained here, so it stays not measured."""
    from conftest import run_worker_until_idle

    from posttrain.platform.models.general_check import describe
    from posttrain.training.evaluate import head_to_head

    job_id = queue.submit(OPERATOR, "train_preset", {
        "preset": "cpu-quick", "name": "gated", "sft": {"max_steps": 3}, "grpo": {"max_steps": 1}, "control": False,
        "evaluate_base": True, "eval": {"tasks_per_domain": 4, "general": {"tasks_per_domain": 4}}})  # fmt: skip
    run_worker_until_idle(platform_env)
    job = queue.get_job(job_id)
    assert job.status.value == "succeeded", job.error
    general = (job.result or {})["arena"]["general"]
    check = GeneralCheck.of(get_model("gated"))
    assert check is not None and (check.against, check.job_id, check.tasks) == ("gated-sft", job_id, 16)
    assert (check.before, check.after, check.delta, check.se) == pytest.approx(
        (general["a"], general["b"], general["delta"], general["se"])
    )
    assert check.regressed == regressed(general["delta"], general["se"])
    warm_up = GeneralCheck.of(get_model("gated-sft"))
    run_dir = Path(job.log_path or "").parent / "run"
    records = [json.loads((run_dir / f"{stage}.records.json").read_text()) for stage in ("eval_base", "eval_before")]
    assert warm_up is not None and warm_up.against == "gated-base"
    assert warm_up.delta == pytest.approx(head_to_head(*records)["general"]["delta"])
    assert describe(get_model("gated-base")) == NOT_MEASURED


def test_the_training_page_s_deploy_asks_to_confirm_the_drop(platform_env: dict[str, str], db_url: str,
                                                            tiny_dir: Path) -> None:  # fmt: skip
    """A finished run's Deploy button on the Training page: for a result whose general check regressed it asks first,
    naming the drop, and deploys (with the override audited) only from the confirmation."""
    from test_training_page import GRPO, page

    registered(tiny_dir)
    run = queue.submit(
        OPERATOR, "train_grpo", {**GRPO, "domains": [{"name": d, "difficulty": 2} for d in GRPO["domains"]]}
    )
    queue.claim("w", 1, 0)
    queue.finish(run, queue.Outcome(exit_code=0, result={"steps": 40, "model": "trained", "checkpoint": "/x/step_40"}))
    at = page()
    at.button(key=f"deploy_{run}").click().run()
    assert not at.exception and deploy_jobs(db_url) == []
    asking = [w.value for w in at.warning if "Deploy it anyway" in w.value]
    assert asking and DROP in asking[0], [w.value for w in at.warning]
    at.button(key=f"deploy_despite_{run}").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    (job,) = deploy_jobs(db_url)
    assert job.config["model"] == "trained" and job.config["allow_regression"] is True
    (audit,) = overrides(db_url)
    assert (audit.username, audit.details["job"]) == ("tester", job.id)


def test_a_deploy_of_a_name_no_model_can_have_is_queued_for_the_job_to_refuse(platform_env: dict[str, str]) -> None:
    """The gate looks the model up when the job is submitted: a name holding a NUL byte (no stored name can, and
    PostgreSQL refuses to be asked) is simply unknown, left to the job to name, never a database error at submit."""
    from posttrain.platform.models.registry import ModelNotFound

    with pytest.raises(ModelNotFound, match="no model named"):
        get_model("\x00")
    assert queue.get_job(
        queue.submit(OPERATOR, "deploy", {"model": "\x00", "vllm_overrides": {"gpu_memory_utilization": 0.5}})
    )
