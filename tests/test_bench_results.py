"""README's figures table is what bench/results.py makes from the committed bench/results/*.json, and
every benchmark in bench/ has a results file that states its peer's setting."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def load_results_module():
    spec = importlib.util.spec_from_file_location("bench_results", BENCH / "results.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


results = load_results_module()
MAKEFILE = (ROOT / "Makefile").read_text()
# what `make bench` runs: BENCHMARKS, each bench/<name>.py unless BENCH_<name> gives the command
BENCHMARKS = sorted(re.search(r"^BENCHMARKS \?= (.+)$", MAKEFILE, re.M).group(1).split())  # type: ignore[union-attr]
COMMANDS = {name: (re.search(rf"^BENCH_{re.escape(name)} := (.+)$", MAKEFILE, re.M) or [None, f"bench/{name}.py"])[1]
            for name in BENCHMARKS}  # fmt: skip


def test_every_benchmark_has_a_row_function_and_make_bench_runs_it() -> None:
    assert sorted(results.ROWS) == BENCHMARKS
    scripts = sorted(p.name for p in BENCH.glob("*.py") if p.name != "results.py")
    assert sorted({c.split()[0].removeprefix("bench/") for c in COMMANDS.values()}) == scripts


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_has_a_results_file_with_its_peer(name: str) -> None:
    path = BENCH / "results" / f"{name}.json"
    assert path.exists(), f"no {path.relative_to(ROOT)}: run `make bench BENCHMARKS={name}`"
    result = json.loads(path.read_text())
    assert result["benchmark"] == name and COMMANDS[name] in result["command"]
    assert len(result["commit"]) == 40 and result["date"]
    assert {"cores", "memory_gib", "cpu", "python", "torch"} <= set(result["machine"])
    peer = result["summary"].get("peer")
    assert isinstance(peer, dict) and peer.get("name"), f"{name}'s summary states no peer setting"


@pytest.mark.parametrize("block", sorted(results.BLOCKS))
def test_the_generated_blocks_are_made_from_the_results(block: str) -> None:
    home = results.HOMES[block]
    assert results.block_text(home.read_text(), block) == results.BLOCKS[block](results.RESULTS), (
        f"{home.relative_to(ROOT)}'s {block} block is stale: run .venv/bin/python bench/results.py readme"
    )


def test_readme_leads_with_the_headline_rows_and_the_docs_hold_every_row() -> None:
    """README's headline block is the figures table's rows of the headline benchmarks, word for word, and the full
    table in docs/benchmarks.md holds every benchmark."""
    full = results.block_text(results.BENCHMARKS_DOC.read_text(), "figures").splitlines()
    head = results.block_text((ROOT / "README.md").read_text(), "headline").splitlines()
    rows = [line for line in head if line.startswith("| ") and not line.startswith("| benchmark")]
    assert rows and all(row in full for row in rows)
    assert {row.split("`")[1] for row in rows} >= {
        json.loads((BENCH / "results" / f"{n}.json").read_text())["command"] for n in results.HEADLINE
    }


def test_record_saves_the_last_json_line_with_provenance_and_rewrites_the_table(tmp_path: Path) -> None:
    summary = {
        "figure": "queue",
        "jobs": 10,
        "workers": 4,
        "slots": 2,
        "sqlite_claims_per_s": 12.5,
        "postgres_claims_per_s": 10.0,
        "sqlite_claims_per_s_1_worker": 25.0,
        "postgres_claims_per_s_1_worker": 5.0,
        "peer": {"name": "1 worker"},
    }
    script = f"import json; print('progress'); print(json.dumps({{'figure': 'x'}})); print(json.dumps({summary!r}))"
    assert results.record("queue", [sys.executable, "-c", script], results=tmp_path) == 0
    saved = json.loads((tmp_path / "queue.json").read_text())
    assert saved["summary"] == summary and saved["exit_status"] == 0
    assert saved["machine"]["cores"] >= 1 and len(saved["commit"]) == 40

    table = results.table(tmp_path)
    row = next(line for line in table.splitlines() if line.startswith("| job queue"))
    assert "SQLite 12.5, PostgreSQL 10 claims/s" in row and "SQLite 25 (0.50×), PostgreSQL 5 (2.00×)" in row
    assert "no result recorded yet" in table  # the other benchmarks, which have no file here

    readme, doc = tmp_path / "README.md", tmp_path / "benchmarks.md"
    homes = {**dict.fromkeys(results.BLOCKS, doc), "headline": readme}
    (begin, end), (rbegin, rend), (fbegin, fend), (hbegin, hend) = map(
        results.markers, ("figures", "reliability", "forgetting", "headline")
    )
    readme.write_text(f"# y\n{hbegin}\n{hend}\n")
    doc.write_text(f"# x\n\nbefore\n{begin}\nold table\n{end}\nbetween\n{fbegin}\n{fend}\n{rbegin}\n{rend}\nafter\n")
    assert results.stale_blocks(tmp_path, homes) == ["headline", "figures", "reliability", "forgetting"]
    assert results.write_blocks(tmp_path, homes) is True
    assert results.block_text(readme.read_text(), "headline").count("| job queue") == 0  # not a headline benchmark
    readme = doc
    assert results.block_text(readme.read_text()) == table
    assert "No reliability run recorded yet" in results.block_text(readme.read_text(), "reliability")
    assert "No forgetting run recorded yet" in results.block_text(readme.read_text(), "forgetting")
    text = readme.read_text()
    assert text.startswith("# x\n\nbefore\n") and f"{end}\nbetween\n" in text and text.endswith(f"{rend}\nafter\n")
    assert results.stale_blocks(tmp_path, homes) == [] and results.write_blocks(tmp_path, homes) is False


def test_record_saves_nothing_when_the_run_dies_before_its_summary(tmp_path: Path) -> None:
    script = "import json; print(json.dumps({'figure': 'sqlite_claims_per_s', 'value': 1})); raise SystemExit(3)"
    assert results.record("queue", [sys.executable, "-c", script], results=tmp_path) == 3
    assert not (tmp_path / "queue.json").exists()


def test_record_from_a_saved_log_keeps_the_runs_own_minutes_and_says_so(tmp_path: Path) -> None:
    summary = {
        "figure": "learning-tools",
        "preset": "smollm2-tools",
        "model": "m",
        "pass_before": 0.0,
        "pass_after": 0.5,
        "gain_points": 50.0,
        "gain_se_points": 6.0,
        "steps": 10,
        "minutes": 42.0,
        "general_before": 0.25,
        "general_after": 0.25,
        "peak_rss_gb": 7.5,
        "eval_tasks": 64,
        "peer": {"name": "the model before training"},
    }
    log = tmp_path / "run.log"
    log.write_text("warming up\n" + json.dumps({"curve": "grpo", "step": 1}) + "\n" + json.dumps(summary) + "\nrc=0\n")
    assert (
        results.record(
            "learning-tools",
            ["python", "bench/learning.py", "--preset", "smollm2-tools"],
            results=tmp_path,
            from_log=log,
        )
        == 0
    )
    saved = json.loads((tmp_path / "learning-tools.json").read_text())
    assert saved["summary"] == summary and saved["minutes"] == 42.0 and "run.log" in saved["recorded_from"]
    assert saved["command"] == "python bench/learning.py --preset smollm2-tools"
    row = next(line for line in results.table(tmp_path).splitlines() if "smollm2-tools preset" in line)
    assert "0.0% → 50.0% (+50.0 ± 6.0 points, unpaired SE, 10 steps) in 42 min" in row


def load_reliability_module():
    spec = importlib.util.spec_from_file_location("bench_reliability", BENCH / "reliability.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reliability_report_counts_every_part_and_names_the_categories() -> None:
    reliability = load_reliability_module()
    records = [
        {"test": "t1", "kind": "fault", "name": "kill worker", "survived": True},
        {
            "test": "t2",
            "kind": "inputs",
            "surface": "reward_integrity.code",
            "tried": 12,
            "refused_cleanly": 12,
            "accepted": 0,
            "mishandled": 0,
            "category": "reward_integrity",
        },
        {
            "test": "t3",
            "kind": "inputs",
            "surface": "tool_parser",
            "tried": 5,
            "refused_cleanly": 3,
            "accepted": 1,
            "mishandled": 1,
        },
        {"test": "t4", "kind": "data", "what": "jobs", "lost": 0, "category": "durability"},
        {
            "test": "t5",
            "kind": "inputs",
            "surface": "reward_integrity.tool_use",
            "tried": 2,
            "refused_cleanly": 2,
            "accepted": 0,
            "mishandled": 0,
            "category": "reward_integrity",
        },
        {
            "test": "t6[engine-whole]",
            "kind": "load",
            "name": "request_lifetime.client_leaving",
            "requests": 9,
            "errors": 0,
            "p50_ms": 7.5,
            "p95_ms": 11.9,
            "p99_ms": 11.9,
            "max_ms": 11.9,
            "mean_ms": 7.6,
            "decode_steps": {"p50": 1, "max": 2, "bound": 32},
            "steps_to_abort": [0, 1],
        },
        {
            "test": "t7",
            "kind": "load",
            "name": "jobs.all",
            "requests": 3,
            "errors": 1,
            "p50_ms": 1.0,
            "p95_ms": 2.0,
            "p99_ms": 2.0,
            "max_ms": 2.0,
            "steps_bound": 2.0,
        },
    ]
    summary = reliability.summarize(records)
    assert summary["load"] == {  # decode steps where a load counted them, beside its milliseconds; no other detail
        "request_lifetime.client_leaving [engine-whole]": {"requests": 9, "errors": 0, "p50_ms": 7.5, "p95_ms": 11.9,
                                                           "p99_ms": 11.9, "max_ms": 11.9,
                                                           "decode_steps": {"p50": 1, "max": 2, "bound": 32}},
        "jobs.all": {"requests": 3, "errors": 1, "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 2.0, "max_ms": 2.0},
    }  # fmt: skip
    assert summary["categories"] == ["durability", "reward_integrity"]
    assert (
        summary["inputs_tried"] == 19 and summary["inputs_refused_cleanly"] == 17 and summary["inputs_mishandled"] == 1
    )
    assert summary["faults_injected"] == 1 and summary["faults_survived"] == 1 and summary["data_lost"] == 0
    last = reliability.final_line(records, soak=False, minutes=1.5, counts={"passed": 4, "failed": 1})
    for key in (
        "faults_injected",
        "faults_survived",
        "inputs_tried",
        "inputs_refused_cleanly",
        "inputs_mishandled",
        "data_lost",
        "categories",
        "surfaces",
        "load",
        "tests_passed",
        "tests_failed",
        "peer",
    ):
        assert key in last, key
    assert last["categories"] == ["durability", "reward_integrity"] and last["tests_failed"] == 1
    assert reliability.summarize([])["categories"] == []


@pytest.mark.parametrize(
    ("record", "refusal"),
    [
        (
            {
                "test": "t::roles",
                "kind": "inputs",
                "surface": "admin-rendered actions clicked by a viewer",
                "tried": 21,
                "refused_cleanly": 20,
                "accepted": 0,
                "mishandled": ["Jobs (queue): button cancel"],
            },
            r"record 1 \(t::roles, inputs 'admin-rendered actions clicked by a viewer'\): 'mishandled' must be a whole "
            r"number, not list \['Jobs \(queue\): button cancel'\]",
        ),
        (
            {"test": "t::kill", "kind": "fault", "name": "kill worker", "survived": "yes"},
            r"record 1 \(t::kill, fault 'kill worker'\): 'survived' must be true or false, not str 'yes'",
        ),
        ({"test": "t::data", "kind": "data", "what": "jobs"}, r"record 1 \(t::data, data 'jobs'\): it has no 'lost'"),
        (
            {
                "test": "t::load",
                "kind": "load",
                "name": "jobs.all",
                "requests": 10,
                "errors": 0,
                "p50_ms": "fast",
                "p95_ms": 1.0,
                "p99_ms": 1.0,
                "max_ms": 1.0,
            },
            r"'p50_ms' must be milliseconds or null, not str 'fast'",
        ),
        (
            {
                "test": "t::leave",
                "kind": "load",
                "name": "request_lifetime.client_leaving",
                "requests": 9,
                "errors": 0,
                "p50_ms": 1.0,
                "p95_ms": 1.0,
                "p99_ms": 1.0,
                "max_ms": 1.0,
                "decode_steps": {"p50": 1, "max": "2"},
            },
            r"'decode_steps' must be an object of decode steps, p50, max and bound, each a number, not dict",
        ),
        (
            {
                "test": "t::odd",
                "kind": "inputs",
                "surface": "s",
                "tried": True,
                "refused_cleanly": 1,
                "accepted": 0,
                "mishandled": 0,
            },
            r"'tried' must be a whole number, not bool True",
        ),
        (
            {"test": "t::other", "kind": "latency"},
            r"record 1 \(t::other, latency\): kind must be one of fault, inputs, load, data",
        ),
    ],
)
def test_the_reliability_report_refuses_a_malformed_record_by_naming_it(record: dict, refusal: str) -> None:
    reliability = load_reliability_module()
    good = {"test": "t0", "kind": "data", "what": "documents", "lost": 0}
    with pytest.raises(reliability.MalformedRecord, match=refusal):
        reliability.summarize([good, record])
    with pytest.raises(reliability.MalformedRecord, match=refusal):
        reliability.final_line([good, record], soak=False, minutes=1.0, counts={"passed": 1})
    assert reliability.summarize([good])["data_checked"] == 1


def test_a_reliability_record_keeps_its_own_counts_apart_from_its_details(monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import Reliability

    monkeypatch.delenv("POSTTRAIN_RELIABILITY_REPORT", raising=False)  # this record stays out of any report
    recorder = Reliability("t::roles")
    with pytest.raises(
        TypeError, match=r"inputs record: the detail \['mishandled'\] would replace the record's own field"
    ):
        recorder.inputs("clicks", tried=3, refused_cleanly=2, mishandled=["Jobs: cancel"])
    recorder.inputs("clicks", tried=3, refused_cleanly=2, mishandled_actions=["Jobs: cancel"])
    assert recorder.records == [
        {
            "test": "t::roles",
            "kind": "inputs",
            "surface": "clicks",
            "tried": 3,
            "refused_cleanly": 2,
            "accepted": 0,
            "mishandled": 1,
            "mishandled_actions": ["Jobs: cancel"],
        }
    ]
    assert load_reliability_module().summarize(recorder.records)["inputs_mishandled"] == 1


def load_learning_module():
    spec = importlib.util.spec_from_file_location("bench_learning", BENCH / "learning.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def repair_report(functions: float, modules: float, humaneval: float) -> dict[str, float]:
    """An evaluation report of the repair preset with these held-out groups' pass@1."""
    return {
        "eval/pass@1": 0.0,
        "general/pass@1": 0.25,
        "eval/episodes/turns": 5.0,
        "eval/episodes/tool_calls": 4.0,
        "eval/episodes/tool_errors": 0.5,
        "eval/episodes/tested_before_reply": 0.75,
        "eval/repair.off_by_one/held_out_by/function/pass@1": functions,
        "eval/repair.off_by_one/held_out_by/function/tasks": 20.0,
        "eval/repair.off_by_one/held_out_by/prompt/pass@1": modules,
        "eval/repair.off_by_one/held_out_by/prompt/tasks": 10.0,
        "eval/repair.missing_case/held_out_by/prompt/pass@1": modules,
        "eval/repair.missing_case/held_out_by/prompt/tasks": 10.0,
        "eval/repair.humaneval/held_out_by/problem/pass@1": humaneval,
        "eval/repair.humaneval/held_out_by/problem/tasks": 8.0,
        "eval/repair.humaneval/held_out_by/prompt/pass@1": humaneval,
        "eval/repair.humaneval/held_out_by/prompt/tasks": 2.0,
    }


def weights(directory: Path, content: bytes) -> Path:
    """A model directory whose one weight file holds ``content`` (beside a config that is no weight file)."""
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(content)
    (directory / "config.json").write_text("{}")
    return directory


def write_repair_arms(workdir: Path, learning, digests: dict[str, str | None]) -> None:  # type: ignore[no-untyped-def]
    """The repair preset's stages and arm results as ``run_arm`` leaves them, each arm started from ``digests[arm]``
    (None: an arm file from before arms recorded their starting weights)."""
    (workdir / "stages").mkdir(parents=True, exist_ok=True)
    (workdir / "arms").mkdir(exist_ok=True)
    (workdir / "stages" / "base.json").write_text(
        json.dumps({"model": "m", "params": 1, "minutes": 5.0, "report": repair_report(0, 0, 0)})
    )
    (workdir / "stages" / "sft.json").write_text(
        json.dumps({"model": "s", "steps": 32, "demonstrations": 96, "minutes": 20.0})
    )
    for arm, rates in {"cold": (0.0, 0.0, 0.0), "sft": (0.2, 0.5, 0.0), "sft-grpo": (0.6, 0.7, 0.1)}.items():
        figures = {
            "arm": arm,
            "starts_from": learning.ARMS["smollm2-repair"][arm][0],
            "steps": 8,
            **learning.arm_figures(repair_report(*rates)),
            "minutes": 30.0,
            "minutes_alone": 50.0,
            "cpu_minutes": 55.0,
            "peak_rss_gb": 5.5,
            "reward_curve": [0.5, 0.6],
            "groups_used_mean": 1.5,
        }
        if digests[arm] is not None:
            figures["start_weights_sha256"] = digests[arm]
        (workdir / "arms" / f"{arm}.json").write_text(json.dumps(figures))


def test_the_repair_arms_combine_into_one_summary_and_its_rows(tmp_path: Path) -> None:
    """``bench/learning.py --combine``: the arms' results and the shared stages as one summary, each held-out
    group's pass@1 and standard error from the evaluation reports, and a README row per arm."""
    import subprocess

    learning = load_learning_module()
    base, warmup = (
        learning.weights_digest(weights(tmp_path / "w" / name, name.encode())) for name in ("base", "warmup")
    )
    write_repair_arms(tmp_path, learning, {"cold": base, "sft": warmup, "sft-grpo": warmup})
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH / "learning.py"),
            "--preset",
            "smollm2-repair",
            "--combine",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["figure"] == "learning-repair" and summary["eval_tasks"] == {
        "unseen_functions": 20,
        "unseen_modules": 20,
        "humaneval": 10,
    }
    assert summary["arms"]["sft-grpo"]["pass_after"]["unseen_functions"] == 0.6
    assert summary["arms"]["sft"]["pass_after_se"]["unseen_functions"] == round((0.2 * 0.8 / 20) ** 0.5, 4)
    assert summary["sft_grpo_over_sft_unseen_functions_points"] == 40.0 and summary["goal_met"]
    assert summary["minutes"] == 5 + 20 + 3 * 30 and summary["peer"]["name"] == "the SFT-only arm"
    assert (
        summary["arms"]["sft"]["start_weights_sha256"] == summary["arms"]["sft-grpo"]["start_weights_sha256"] == warmup
    )
    assert warmup[:12] in summary["peer"]["setting"]
    rows = results.learning_repair_rows(summary)
    assert len(rows) == 3 and "unseen functions 60.0%" in rows[2].result and "+40.0" in rows[2].peer
    assert summary["peer"]["same_warm_up"] is True and "NOT a same-run pair" not in rows[2].peer
    # a summary whose arms did not share a warm-up (recorded before --combine checked) says so in its row
    apart = summary | {
        "peer": {
            "name": "the SFT-only arm, from another warm-up",
            "same_warm_up": False,
            "differs": "the SFT-only arm from one warm-up, SFT+GRPO from another",
        }
    }
    assert results.learning_repair_rows(apart)[2].peer.startswith(
        "NOT a same-run pair: the SFT-only arm from one warm-up, SFT+GRPO from another; SFT alone"
    )
    (tmp_path / "arms" / "cold.json").unlink()
    missing = subprocess.run(
        [
            sys.executable,
            str(BENCH / "learning.py"),
            "--preset",
            "smollm2-repair",
            "--combine",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert missing.returncode != 0 and "arms ['cold'] have no result" in missing.stderr


def test_the_repair_arms_are_refused_when_their_warm_ups_differ(tmp_path: Path) -> None:
    """Arms that start from one stage are one comparison only when they started from the same weights: ``--combine``
    refuses an SFT-only arm and an SFT+GRPO arm made from two warm-ups (the stage made again between them), naming
    both arms and both digests; an arm file that records no starting weights is refused with how to fix it; a stage
    made again after its arms ran is refused too."""
    import argparse

    learning = load_learning_module()
    first = weights(tmp_path / "w" / "warmup", b"the first warm-up")
    again = weights(tmp_path / "w" / "warmup-again", b"the warm-up made again with changed code")
    same = weights(tmp_path / "w" / "warmup-copy", b"the first warm-up")
    one, other = learning.weights_digest(first), learning.weights_digest(again)
    assert one != other and learning.weights_digest(same) == one and len(one) == 64
    (first / "config.json").write_text('{"changed": true}')  # only weight files count
    assert learning.weights_digest(first) == one
    with pytest.raises(SystemExit, match="no weight files"):
        learning.weights_digest(tmp_path / "w")
    assert learning.stage_weights({"checkpoint": "/c/step_00000032", "path": None}) == Path("/c/step_00000032/model")
    assert learning.stage_weights({"path": "/models/m"}) == Path("/models/m")

    base = learning.weights_digest(weights(tmp_path / "w" / "base", b"as it ships"))
    workdir = tmp_path / "run"
    args = argparse.Namespace(workdir=workdir)
    write_repair_arms(workdir, learning, {"cold": base, "sft": one, "sft-grpo": other})
    with pytest.raises(SystemExit) as refused:
        learning.combine_arms("smollm2-repair", args)
    message = str(refused.value)
    assert "arms 'sft' and 'sft-grpo' both start from stage 'sft' but from different weights" in message
    assert f"sft from sha256 {one}" in message and f"sft-grpo from sha256 {other}" in message

    write_repair_arms(workdir, learning, {"cold": base, "sft": None, "sft-grpo": other})
    with pytest.raises(
        SystemExit, match=r"arms \['sft'\] record no start_weights_sha256 .* delete those files and run each again"
    ):
        learning.combine_arms("smollm2-repair", args)

    write_repair_arms(workdir, learning, {"cold": base, "sft": one, "sft-grpo": one})
    learning.combine_arms("smollm2-repair", args)  # one warm-up: combined
    made_again = json.loads((workdir / "stages" / "sft.json").read_text()) | {"weights_sha256": other}
    (workdir / "stages" / "sft.json").write_text(json.dumps(made_again))
    with pytest.raises(
        SystemExit,
        match=rf"stage 'sft' .* is sha256 {other}, but arms \['sft', 'sft-grpo'\] started from "
        rf"sha256 {one}",
    ):
        learning.combine_arms("smollm2-repair", args)


def test_a_base_model_s_stages_combine_into_one_summary(tmp_path: Path) -> None:
    """``bench/learning.py --preset gemma3-base-to-instruct --combine``: the three stages (as it ships, after SFT,
    after GRPO) side by side, the gains between them with their standard errors, and whether the goal holds."""
    import subprocess

    (tmp_path / "arms").mkdir()
    for stage, p in {"base": 0.02, "sft": 0.30, "grpo": 0.45}.items():
        (tmp_path / "arms" / f"{stage}.json").write_text(
            json.dumps(
                {
                    "stage": stage,
                    "model": f"m-{stage}",
                    "pass_at_1": p,
                    "pass_at_1_se": round((p * (1 - p) / 100) ** 0.5, 4),
                    "general": {"pass_at_1": 0.2, "pass_at_1_se": 0.02},
                    "minutes": 20.0,
                    "minutes_alone": 40.0,
                    "peak_rss_gb": 6.0,
                }
            )
        )
    args = [
        sys.executable,
        str(BENCH / "learning.py"),
        "--preset",
        "gemma3-base-to-instruct",
        "--combine",
        "--workdir",
        str(tmp_path),
    ]
    summary = json.loads(
        subprocess.run(args, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    )
    assert list(summary["stages"]) == ["base", "sft", "grpo"] and summary["stages"]["sft"]["pass_at_1"] == 0.30
    assert summary["grpo_over_sft_points"] == 15.0 and summary["sft_over_base_points"] == 28.0
    se = round(100 * ((0.3 * 0.7 / 100) + (0.45 * 0.55 / 100)) ** 0.5, 2)
    assert summary["grpo_over_sft_se_points"] == pytest.approx(se, abs=0.02) and summary["goal_met"] == (15.0 > 2 * se)
    assert summary["minutes"] == 60.0 and summary["peak_rss_gb"] == 6.0
    (tmp_path / "arms" / "sft.json").unlink()
    missing = subprocess.run(args, capture_output=True, text=True)
    assert missing.returncode != 0 and "stages ['sft'] have no result" in missing.stderr


def test_the_reliability_table_shows_a_load_s_decode_steps_beside_its_milliseconds(tmp_path: Path) -> None:
    records = [
        {"test": "t[engine-whole]", "kind": "load", "name": "request_lifetime.client_leaving", "requests": 9, "errors": 0,
         "p50_ms": 7.5, "p95_ms": 11.9, "p99_ms": 11.9, "max_ms": 11.9, "decode_steps": {"p50": 1, "max": 2, "bound": 32}},
        {"test": "t2", "kind": "load", "name": "jobs.all", "requests": 3, "errors": 0, "p50_ms": 1.0, "p95_ms": 2.0,
         "p99_ms": 2.0, "max_ms": 2.0},
    ]  # fmt: skip
    summary = load_reliability_module().final_line(records, soak=False, minutes=2.0, counts={"passed": 2})
    (tmp_path / "reliability.json").write_text(
        json.dumps(
            {
                "command": ".venv/bin/python bench/reliability.py",
                "date": "2026-12-07T00:00:00+00:00",
                "summary": summary,
            }
        )
    )
    rows = results.reliability_table(tmp_path).splitlines()
    assert (
        "| load: request_lifetime.client_leaving [engine-whole] | 9 requests, 0 errors; p50 / p95 / p99 7.5 ms / "
        "11.9 ms / 11.9 ms; decode steps p50 / max 1 / 2 (bound 32) |"
    ) in rows, rows
    assert "| load: jobs.all | 3 requests, 0 errors; p50 / p95 / p99 1 ms / 2 ms / 2 ms |" in rows, rows


def test_the_repair_arms_gap_is_paired_task_by_task_and_clustered_by_function(tmp_path: Path) -> None:
    """Arms whose evaluations kept their per-task records are compared on the same unseen-function tasks, paired and
    clustered by function (``bench/learning.py`` ``paired_points``); the general check's change likewise."""
    import argparse

    from posttrain.platform.stats import paired_difference

    learning = load_learning_module()
    warmup = learning.weights_digest(weights(tmp_path / "w" / "warmup", b"w"))
    base = learning.weights_digest(weights(tmp_path / "w" / "base", b"b"))
    workdir = tmp_path / "run"
    write_repair_arms(workdir, learning, {"cold": base, "sft": warmup, "sft-grpo": warmup})
    functions = [f"function:f{i // 4}" for i in range(20)]  # five functions, four tasks each
    sft = [i % 4 == 0 for i in range(20)]
    grpo = [i < 8 or i % 4 == 0 for i in range(20)]  # two functions learned whole
    general = {"sft": [True, False, True, False], "sft-grpo": [True, False, False, False], "cold": [True] * 4}

    def records(passed: list[bool], checked: list[bool]) -> list[dict]:
        own = [
            {
                "domain": "repair.off_by_one",
                "task_id": f"t{i}",
                "source": functions[i],
                "held_out_by": "function",
                "passed": p,
            }
            for i, p in enumerate(passed)
        ]
        others = [
            {
                "domain": "repair.off_by_one",
                "task_id": "m0",
                "source": "task:m0",
                "held_out_by": "prompt",
                "passed": True,
            }
        ]
        return (
            own
            + others
            + [
                {"domain": "general/arith", "task_id": f"g{i}", "source": f"task:g{i}", "passed": p}
                for i, p in enumerate(checked)
            ]
        )

    for arm, passed in {"sft": sft, "sft-grpo": grpo, "cold": sft}.items():
        path = workdir / f"{arm}.records.json"
        path.write_text(json.dumps(records(passed, general[arm])))
        part = json.loads((workdir / "arms" / f"{arm}.json").read_text())
        (workdir / "arms" / f"{arm}.json").write_text(json.dumps(part | {"records": str(path)}))
    out = subprocess_json(learning, workdir)
    want = paired_difference(sft, grpo, functions)
    assert out["sft_grpo_over_sft_unseen_functions_points"] == round(100 * want.delta, 2) == 30.0
    assert (
        out["gap_se_points"] == round(100 * want.se, 2) and out["gap_se"] == "paired, clustered by source (5 functions)"
    )
    # clustered: wider than the twenty tasks taken as independent
    assert want.se > paired_difference(sft, grpo).se
    # and an arm whose records answer other tasks is refused, naming the fix
    path = workdir / "sft.records.json"
    path.write_text(json.dumps(records(sft[:-1], general["sft"])))
    with pytest.raises(SystemExit, match="did not answer the same tasks .* the same --eval-tasks"):
        learning.combine_arms("smollm2-repair", argparse.Namespace(workdir=workdir))


def subprocess_json(learning, workdir: Path) -> dict:  # type: ignore[no-untyped-def]
    """``--combine`` in-process: its summary line."""
    import argparse
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        learning.combine_arms("smollm2-repair", argparse.Namespace(workdir=workdir))
    return json.loads(printed.getvalue().strip().splitlines()[-1])


def test_the_broad_arms_per_domain_se_is_paired_when_records_are_kept() -> None:
    """``domain_figures`` with a pairing: each domain's SE and the mean gain's SE are the paired ones; without
    records, the unpaired ones, and ``se`` says which."""
    learning = load_learning_module()
    before = {"eval/a/pass@1": 0.5, "eval/b/pass@1": 0.5}
    after = {"eval/a/pass@1": 0.75, "eval/b/pass@1": 0.5}
    paired = {"points": 12.5, "se_points": 4.0, "tasks": 8, "clusters": None, "se": "paired, clustered by source"}
    figures = learning.domain_figures(after, before, 4, lambda keep: paired)
    assert figures["per_domain"]["a"]["se_points"] == 4.0 and figures["mean_gain_se_points"] == 4.0
    assert figures["se"] == "paired, clustered by source"
    unpaired = learning.domain_figures(after, before, 4, lambda keep: None)
    assert unpaired["se"] == "unpaired" and unpaired["per_domain"]["a"]["se_points"] == round(
        100 * ((0.75 * 0.25 + 0.25) / 4) ** 0.5, 2
    )


def forgetting_part(arm: str, gain: float, general: float, controls: dict | None = None) -> dict:
    return {
        "arm": arm,
        "controls": controls or {},
        "start_weights_sha256": "ab" * 32,
        "steps": 30,
        "pass_at_1": 0.5,
        "general": 0.2,
        "gain": {"points": gain, "se_points": 3.0},
        "general_change": {"points": general, "se_points": 2.0},
        "minutes": 12.0,
        "cpu_minutes": 20.0,
        "peak_rss_gb": 2.5,
        "reward_curve": [],
    }


def test_the_forgetting_summary_picks_the_control_that_meets_both_bounds_or_says_which_failed() -> None:
    """The issue's bounds: the general check no more than 2 points below the start, and 80% of the uncontrolled gain
    kept; the pick meets both with the most gain, and where none does the summary names each arm's shortfall."""
    learning = load_learning_module()
    start = {"report": {"eval/pass@1": 0.3, "general/pass@1": 0.25}}
    found = {
        "none": forgetting_part("none", 20.0, -10.0),
        "replay": forgetting_part("replay", 17.0, -1.5, {"replay": {"share": 0.2}}),
        "kl": forgetting_part("kl", 19.0, -6.0),
        "lora": forgetting_part("lora", 16.5, 0.5),
        "interpolate": forgetting_part("interpolate", 10.0, -1.0, {"alpha": 0.5}),
    }
    summary = learning.forgetting_summary("smollm2-broad", found, start, {})
    arms = summary["arms"]
    assert [a for a in arms if arms[a]["meets_bounds"]] == [
        "replay",
        "lora",
    ]  # kl drops 6 points; interpolate keeps 50%
    assert summary["best"] == "replay" and summary["bounds_failed"] == []  # the more gain of the two
    assert arms["interpolate"]["gain_kept"] == 0.5 and not arms["interpolate"]["gain_within_bound"]
    assert arms["kl"]["gain_within_bound"] and not arms["kl"]["general_within_bound"]

    found["replay"], found["lora"] = forgetting_part("replay", 17.0, -4.0), forgetting_part("lora", 2.0, 0.0)
    summary = learning.forgetting_summary("smollm2-broad", found, start, {})
    assert summary["best"] == "kl" and "no control meets both bounds" in summary["best_because"]  # 4 points back for 1
    assert summary["bounds_failed"][0] == "replay: general -4.0 points (bound -2), gain kept 0.85 (bound 0.8)"
    rows = results.forgetting_rows(
        {"figure": "forgetting-smollm2-broad", "preset": "smollm2-broad", "model": "m", "trainer": "grpo", **summary}
    )
    assert (
        len(rows) == 5 and "(the pick)" in rows[2].result and rows[1].peer.startswith("no control from the same start")
    )
    assert "general below -2 points" in rows[1].result and "under 80% of the gain" in rows[3].result


def test_a_forgetting_run_is_plotted_beside_its_results_and_a_stale_plot_is_found(tmp_path: Path) -> None:
    """Each recorded forgetting run gets its SVG beside its results file, with every arm placed at its paired gain and
    general-check change and the bounds' region drawn from the uncontrolled gain; the README block links it and the
    check finds a plot that no longer matches its results."""
    learning = load_learning_module()
    start = {"report": {"eval/pass@1": 0.3, "general/pass@1": 0.25}}
    found = {
        "none": forgetting_part("none", 20.0, -10.0),
        "replay": forgetting_part("replay", 17.0, -1.5),
        "lora": forgetting_part("lora", 8.0, 0.5),
    }
    summary = {
        "figure": "forgetting-smollm2-broad",
        "preset": "smollm2-broad",
        "model": "a<b",
        "trainer": "grpo",
        **learning.forgetting_summary("smollm2-broad", found, start, {}),
    }
    record = {
        "command": "bench/learning.py --forgetting",
        "date": "2026-12-07",
        "exit_status": 0,
        "machine": {"cores": 2, "cpu": "c", "memory_gib": 24, "python": "3.11", "torch": "2.13"},
    }
    (tmp_path / "forgetting-smollm2-broad.json").write_text(json.dumps({**record, "summary": summary}))
    readme = tmp_path / "README.md"
    readme.write_text("".join(f"{begin}\n{end}\n" for begin, end in map(results.markers, results.BLOCKS)))
    homes = dict.fromkeys(results.BLOCKS, readme)
    results.write_blocks(tmp_path, homes)
    svg = (tmp_path / "forgetting-smollm2-broad.svg").read_text()
    import xml.etree.ElementTree as ET

    root = ET.fromstring(svg)  # well-formed, the model's name escaped
    ns = "{http://www.w3.org/2000/svg}"
    points = {c.get("fill"): (float(c.get("cx")), float(c.get("cy"))) for c in root.iter(f"{ns}circle")}
    assert len(list(root.iter(f"{ns}circle"))) == 3 and "Forgetting on a<b," in "".join(root.itertext())
    none, best = points["#c62828"], points["#1565c0"]  # the uncontrolled arm, the pick (replay)
    assert best[0] < none[0] and best[1] < none[1]  # less gain (left), a smaller fall (higher on the page)
    band = [r for r in root.iter(f"{ns}rect") if r.get("fill") == "#e3f4e3"][0]
    assert float(band.get("x")) < best[0] and best[1] < float(band.get("y")) + float(
        band.get("height")
    )  # replay inside
    assert none[1] > float(band.get("y")) + float(band.get("height"))  # none's -10 is below the -2 bound
    assert "](../bench/results/forgetting-smollm2-broad.svg)" in results.block_text(readme.read_text(), "forgetting")
    assert results.stale_blocks(tmp_path, homes) == []
    assert "forgetting on a<b" in results.block_text(readme.read_text(), "headline")  # a recorded run heads README too
    summary["arms"]["lora"]["gain_points"] = 9.0
    (tmp_path / "forgetting-smollm2-broad.json").write_text(json.dumps({**record, "summary": summary}))
    assert results.stale_blocks(tmp_path, homes) == [
        "headline",
        "figures",
        "forgetting-smollm2-broad.svg",
    ]  # its rows too


def test_the_untouched_check_pairs_each_arm_with_the_start_on_domains_nothing_holds(tmp_path: Path) -> None:
    """Replay rehearses the general check's own domains, so the arms are also checked on domains that neither the preset,
    the general check nor replay holds (nor a variant of one); combined, each arm's change there is paired task by task
    with the start's, and its row says so."""
    learning = load_learning_module()
    from posttrain.training.config import GENERAL_DOMAINS
    from posttrain.training.presets import get_preset

    domains = learning.untouched_domains("smollm2-broad")
    held = {
        d.rsplit(".", 1)[0] if d.count(".") >= 2 else d
        for d in [*get_preset("smollm2-broad").eval.domains, *GENERAL_DOMAINS]
    }
    assert len(domains) >= 6 and not {d.rsplit(".", 1)[0] if d.count(".") >= 2 else d for d in domains} & held
    assert "compare.is_greater.decimal" not in domains  # a variant of the general check's compare.is_greater.int

    def records(name: str, passed: list[bool]) -> str:
        path = tmp_path / f"{name}.json"
        path.write_text(
            json.dumps(
                [
                    {"task_id": f"t{i}", "domain": domains[i % 2], "source": None, "passed": p, "score": float(p)}
                    for i, p in enumerate(passed)
                ]
            )
        )
        return str(path)

    start = {"report": {"eval/pass@1": 0.3, "general/pass@1": 0.25}}
    found = {"none": forgetting_part("none", 20.0, -10.0), "replay": forgetting_part("replay", 17.0, -1.5)}
    checked = {
        "start": [True, True, False, False],
        "none": [False, True, False, False],
        "replay": [True, True, True, False],
    }
    for arm, passed in checked.items():
        found.get(arm, {}).update({"untouched": sum(passed) / 4})
    for arm in found:
        found[arm]["untouched_change"] = learning.paired_points(
            {"records": records(arm, checked[arm])}, {"records": records("start", checked["start"])}, lambda r: True
        )
    summary = learning.forgetting_summary("smollm2-broad", found, start, {})
    assert (
        summary["arms"]["none"]["untouched_change_points"] == -25.0
        and summary["arms"]["replay"]["untouched_change_points"] == 25.0
    )
    rows = results.forgetting_rows(
        {
            "figure": "forgetting-smollm2-broad",
            "preset": "smollm2-broad",
            "model": "m",
            "trainer": "grpo",
            "untouched_check": {"domains": domains, "start": 0.5},
            **summary,
        }
    )
    assert (
        f"untouched check -25.0 ± {summary['arms']['none']['untouched_se_points']:.1f} from 50.0% ({len(domains)} domains"
        in rows[0].result
    )
