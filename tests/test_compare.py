"""Compare two models on the same held-out tasks: the real model against a from-scratch one, through
the head-to-head figures, an evaluate job run by a worker, the CLI and the Models page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import OPERATOR, REPO_ROOT, ImportedRealModel, login_as, run_worker_until_idle
from streamlit.testing.v1 import AppTest
from test_cli import cli

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Job, JobStatus, Model
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import validate_config
from posttrain.platform.models.registry import register_model
from posttrain.platform.tasks.domains import generate
from posttrain.platform.tasks.store import save_tasks
from posttrain.platform.verifiers import TaskSpec
from posttrain.training.config import EvalConfig
from posttrain.training.evaluate import evaluate_models, head_to_head, paired_records
from posttrain.ui.common import beyond_noise

pytestmark = pytest.mark.requires("real model")

# one worked example before each question: zero-shot, this 135M model explains instead of answering
SHOTS = {
    "compare.larger.int": ("Which is larger: 31 or 7?", "31"),
    "compare.smaller.int": ("Which is smaller: 31 or 7?", "7"),
}
DOMAINS = tuple(SHOTS)
PAGE = str(REPO_ROOT / "ui" / "views" / "models.py")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from posttrain.platform.models import TinyModelSpec, build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("cmp") / "tiny",
        TinyModelSpec(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128),
    )


def _task_set(url: str | None = None) -> None:
    """A stored set of held-out questions, each after one worked example (a JSONL import's shape)."""
    specs = []
    for domain, (question, answer) in SHOTS.items():
        for task in generate(domain, 10, seed=3, difficulty=2, split="eval"):
            shot = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            specs.append(
                TaskSpec.model_validate({**task.model_dump(), "prompt": shot + [m.model_dump() for m in task.prompt]})
            )
    save_tasks("numbers", specs, source="jsonl", url=url)


def _records(passed: list[bool], domains: list[str], sources: list[str] | None = None) -> list[dict[str, object]]:
    return [
        {"domain": d, "task_id": f"t{i}", "passed": p, "prompt": "q", "reference": "r", "completion": "c"}
        | ({"source": sources[i]} if sources else {})
        for i, (p, d) in enumerate(zip(passed, domains))
    ]


def test_paired_figures() -> None:
    row = paired_records(
        _records([True, True, False, False, True], ["d"] * 5), _records([True, False, True, True, True], ["d"] * 5)
    )
    assert (row["wins"], row["ties"], row["losses"]) == (2, 2, 1)
    assert row["delta"] == pytest.approx(0.2) and row["a"] == pytest.approx(0.6) and row["b"] == pytest.approx(0.8)
    # differences 0 -1 1 1 0: the paired SE by hand, sqrt(sum((d - 0.2)^2) / 4 / 5)
    assert row["se"] == pytest.approx((2 * 0.04 + 1.44 + 2 * 0.64) ** 0.5 / 2 / 5**0.5)
    assert row["ci_low"] < 0.2 < row["ci_high"] and row["paired"]
    same = paired_records(_records([True, False], ["d"] * 2), _records([True, False], ["d"] * 2))
    assert same["delta"] == same["ci_low"] == same["ci_high"] == 0.0


def test_head_to_head_clusters_by_source_and_reports_the_general_check_apart() -> None:
    domains = ["repair.x"] * 6 + ["general/arith"] * 4
    sources = ["function:f"] * 3 + ["function:g"] * 3 + [f"task:{i}" for i in range(4)]
    a = _records([False] * 6 + [True] * 4, domains, sources)
    b = _records([True, True, True, False, False, False, True, False, False, True], domains, sources)
    out = head_to_head(a, b)
    mine = out["domains"]["all"]
    assert mine["tasks"] == 6 and mine["clusters"] == 2 and mine["delta"] == pytest.approx(0.5)
    # two clusters, sums 3 * 0.5 and 3 * -0.5: sqrt(2 * 2 * 2.25) / 6
    assert mine["se"] == pytest.approx((2 * 2 * 2.25) ** 0.5 / 6)
    assert out["general"]["tasks"] == 4 and out["general"]["delta"] == pytest.approx(-0.5)
    assert "general" not in out["domains"] and "general" not in head_to_head(a[:6], b[:6])


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_head_to_head_of_the_real_model_and_a_tiny_one(
    platform_env: dict[str, str], real_model_dir: ImportedRealModel, tiny_dir: Path
) -> None:
    _task_set()
    config = EvalConfig(models=["tiny", "smol"], task_set="numbers", max_new_tokens=24, device="cpu")
    out = evaluate_models(config, {"tiny": str(tiny_dir), "smol": str(real_model_dir.path)}.__getitem__)
    arena = out["arena"]
    assert (arena["a"], arena["b"]) == ("tiny", "smol") and set(out["domains"]) == set(DOMAINS)
    for domain in DOMAINS:
        row = arena["domains"][domain]
        assert row["tasks"] == 10
        assert row["a"] == out["models"]["tiny"][f"eval/{domain}/pass@1"]
        assert row["b"] == out["models"]["smol"][f"eval/{domain}/pass@1"]
        assert (
            row["wins"] - row["losses"] == round(row["delta"] * 10) and row["wins"] + row["ties"] + row["losses"] == 10
        )
    total = arena["domains"]["all"]
    assert total["b"] > total["a"], total  # a real model beats a random two-layer one
    assert arena["disagreements_total"] == total["wins"] + total["losses"] == len(arena["disagreements"])
    for d in arena["disagreements"]:
        assert d["a_passed"] != d["b_passed"] and d["prompt"] and d["reference"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_stored_domain_beside_generated_ones_and_the_general_checks_flips(
        platform_env: dict[str, str], real_model_dir: ImportedRealModel, tiny_dir: Path) -> None:  # fmt: skip
    """``task_sets``: one domain from a stored set, another generated, in one evaluation; the general check's
    per-task records come back as ``general/<domain>`` rows of the arena (a general-check loss shows its flips),
    and ``all`` stays the evaluation's own tasks."""
    _task_set()
    config = EvalConfig(
        models=["tiny", "smol"],
        domains=["compare.smaller.int", "list.int.sum"],
        difficulty=2,
        task_sets={"compare.smaller.int": "numbers"},
        tasks_per_domain=4,
        max_new_tokens=8,
        device="cpu",
        general={"domains": ["list.int.max"], "tasks_per_domain": 4, "max_new_tokens": 8},
    )
    out = evaluate_models(config, {"tiny": str(tiny_dir), "smol": str(real_model_dir.path)}.__getitem__)
    arena, smol = out["arena"], out["models"]["smol"]
    assert list(arena["domains"]) == ["compare.smaller.int", "list.int.sum", "general/list.int.max", "all"]
    assert arena["domains"]["all"]["tasks"] == 8 and arena["domains"]["all"]["b"] == smol["eval/pass@1"]
    assert arena["domains"]["general/list.int.max"]["tasks"] == 4
    assert arena["domains"]["general/list.int.max"]["b"] == smol["general/list.int.max/pass@1"]
    flips = [d for d in arena["disagreements"] if d["domain"] == "general/list.int.max"]
    assert (
        len(flips)
        == arena["domains"]["general/list.int.max"]["wins"] + arena["domains"]["general/list.int.max"]["losses"]
    )
    stored = {t.prompt_text for t in generate("compare.smaller.int", 10, seed=3, difficulty=2, split="eval")}
    assert all(d["prompt"] in stored for d in arena["disagreements"] if d["domain"] == "compare.smaller.int")
    with pytest.raises(ValueError, match=r"task_sets names \['list.int.min'\]"):
        EvalConfig(model="smol", domains=["list.int.sum"], task_sets={"list.int.min": "numbers"})


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_compare_job_cli_and_console(
    platform_env: dict[str, str], real_model_dir: ImportedRealModel, tiny_dir: Path
) -> None:
    register_model(OPERATOR, "tiny", tiny_dir)
    register_model(OPERATOR, "smollm2-135m-instruct", real_model_dir.path)
    _task_set()
    job_id = queue.submit(OPERATOR, "evaluate", {"models": ["tiny", "smollm2-135m-instruct"], "task_set": "numbers",
                                       "max_new_tokens": 24, "device": "cpu"})  # fmt: skip
    run_worker_until_idle(platform_env, timeout=300)
    job = queue.get_job(job_id)
    assert job.status is JobStatus.succeeded, job.error
    arena = job.result["arena"]
    assert arena["domains"]["all"]["tasks"] == 20
    # each model's per-task records are kept beside the result: paired again later, they give the same figures
    kept = [json.loads(Path(job.result["records"][m]).read_text()) for m in ("tiny", "smollm2-135m-instruct")]
    assert head_to_head(*kept)["domains"] == arena["domains"]
    assert all(r["source"].startswith("task:") and r["held_out_by"] == "prompt" for r in kept[0])

    shown = cli({**platform_env, "COLUMNS": "250"}, "models", "compare", "--job", str(job_id), "--show", "3")
    assert shown.returncode == 0, shown.stderr
    assert "compare.smaller.int" in shown.stdout and "wins/ties/losses" in shown.stdout and "paired SE" in shown.stdout
    assert f"{arena['domains']['all']['delta']:+.1%} ± {arena['domains']['all']['se']:.1%}" in shown.stdout
    assert f"{arena['disagreements_total']} tasks where they disagree" in shown.stdout
    refused = cli(platform_env, "models", "compare", "tiny")
    assert refused.returncode == 2 and "name two models" in refused.stderr

    at = login_as(AppTest.from_file(PAGE, default_timeout=60)).run()
    assert not at.exception
    assert at.selectbox(key="compare_open").index == 0  # the newest comparison opens first
    tables = [df.value for df in at.dataframe]
    figures = next(t for t in tables if "wins/ties/losses" in t.columns)
    order = [*sorted((d for d in arena["domains"] if d != "all"), key=lambda d: -arena["domains"][d]["delta"]), "all"]
    assert list(figures["domain"]) == order  # sorted by the difference, the overall row last
    assert list(figures["smollm2-135m-instruct"]) == [arena["domains"][d]["b"] for d in order]
    assert list(figures[""]) == [beyond_noise(arena["domains"][d]) for d in order]
    assert list(figures["paired SE"]) == [arena["domains"][d]["se"] for d in order]
    if arena["disagreements"]:
        listed = next(t for t in tables if "reference" in t.columns)
        picked = at.selectbox(key="compare_flipped").value
        assert len(listed) == sum(picked in ("(all)", d["domain"]) for d in arena["disagreements"])

    # the compare form queues an evaluate job of the two picked models on the task set
    at.selectbox(key="compare_a").set_value("tiny")
    at.selectbox(key="compare_b").set_value("smollm2-135m-instruct")
    at.selectbox(key="compare_set").set_value("numbers")
    next(b for b in at.button if b.label == "Compare").click().run()
    queued = queue.list_jobs(limit=1)[0]
    assert queued.kind == "evaluate" and queued.config["models"] == ["tiny", "smollm2-135m-instruct"]
    assert queued.config["task_set"] == "numbers"


def test_compare_with_its_base_from_a_run_uses_the_runs_evaluation(platform_env: dict[str, str]) -> None:
    """The link from a finished demo run opens the form on its preset's held-out tasks (prompt format included):
    the arena measures the two models on what the run's gain was measured on."""
    with session() as s:
        s.add_all([Model(name="smollm2-135m-instruct", path="/models/a"), Model(name="quick-job1", path="/models/b")])
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.query_params.update(
        {"compare_a": "smollm2-135m-instruct", "compare_b": "quick-job1", "compare_preset": "smollm2-quick"}
    )
    at = login_as(at).run()
    assert not at.exception
    assert any("held-out evaluation of the run's preset 'smollm2-quick'" in i.value for i in at.info)
    assert (
        at.selectbox(key="compare_a").value == "smollm2-135m-instruct"
        and at.selectbox(key="compare_b").value == "quick-job1"
    )
    assert at.multiselect(key="compare_domains").disabled
    next(b for b in at.button if b.label == "Compare").click().run()
    (queued,) = queue.list_jobs(kind="evaluate")
    expected = validate_config(
        "evaluate", {"preset": "smollm2-quick", "models": ["smollm2-135m-instruct", "quick-job1"], "general": None}
    ).model_dump(mode="json")
    assert queued.config == expected and queued.config["prompt_format"]["answer"] == "boxed"


def test_a_runs_own_comparison_opens_from_its_link(platform_env: dict[str, str]) -> None:
    """A demo run compared its result with its base on its held-out tasks already: the link opens that comparison,
    listed among the others, with the form still there for another."""
    from posttrain.training.evaluate import head_to_head

    def records(passed: list[bool]) -> list[dict[str, object]]:
        return [{"domain": "arith.add.int", "task_id": f"t{i}", "prompt": f"Compute {i} + 1.", "reference": str(i + 1),
                 "completion": f"\\boxed{{{i + 1 if ok else 0}}}", "passed": ok, "score": float(ok), "details": ""}
                for i, ok in enumerate(passed)]  # fmt: skip

    with session() as s:
        s.add_all([Model(name="smollm2-135m-instruct", path="/models/a"), Model(name="quick-job1", path="/models/b")])
    arena = {
        "a": "smollm2-135m-instruct",
        "b": "quick-job1",
        **head_to_head(records([True, False, False]), records([True, True, False])),
    }
    run = queue.submit(OPERATOR, "train_preset", {"preset": "smollm2-quick"})
    other = queue.submit(
        OPERATOR,
        "evaluate",
        {"models": ["smollm2-135m-instruct", "quick-job1"], "domains": ["arith.add.int"], "difficulty": 2},
    )
    with session() as s:
        for job_id, result in (
            (
                run,
                {
                    "model": "quick-job1",
                    "sft_model": "smollm2-135m-instruct",
                    "preset": "smollm2-quick",
                    "models": ["smollm2-135m-instruct", "quick-job1"],
                    "domains": ["arith.add.int"],
                    "gain_points": 33.33,
                    "eval_tasks": 3,
                    "eval_unseen_fraction": 1.0,
                    "arena": arena,
                },
            ),
            (
                other,
                {
                    "models": ["smollm2-135m-instruct", "quick-job1"],
                    "paths": {},
                    "pass_at_1": {},
                    "reports": {},
                    "domains": ["arith.add.int"],
                    "arena": arena,
                },
            ),
        ):
            job = s.get(Job, job_id)
            job.status, job.result = JobStatus.succeeded, result
            s.add(job)
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.query_params.update(
        {
            "compare_a": "smollm2-135m-instruct",
            "compare_b": "quick-job1",
            "compare_preset": "smollm2-quick",
            "compare_open": str(run),
        }
    )
    at = login_as(at).run()
    assert not at.exception
    opened = at.selectbox(key="compare_open")
    assert opened.value == run and len(opened.options) == 2  # the run's, opened, beside the evaluate job's
    assert (
        opened.options[1]
        == f"job {run}: smollm2-135m-instruct vs quick-job1 on run {run}'s held-out tasks (preset 'smollm2-quick')"
    )
    assert any("1 tasks where they disagree" in c.value for c in at.caption)
