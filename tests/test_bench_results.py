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
def test_readme_tables_are_generated_from_the_results(block: str) -> None:
    readme = (ROOT / "README.md").read_text()
    assert results.readme_section(readme, block) == results.BLOCKS[block](results.RESULTS), (
        f"README.md's {block} block is stale: run .venv/bin/python bench/results.py readme")


def test_record_saves_the_last_json_line_with_provenance_and_rewrites_the_table(tmp_path: Path) -> None:
    summary = {"figure": "queue", "jobs": 10, "workers": 4, "slots": 2, "sqlite_claims_per_s": 12.5,
               "postgres_claims_per_s": 10.0, "sqlite_claims_per_s_1_worker": 25.0,
               "postgres_claims_per_s_1_worker": 5.0, "peer": {"name": "1 worker"}}
    script = f"import json; print('progress'); print(json.dumps({{'figure': 'x'}})); print(json.dumps({summary!r}))"
    assert results.record("queue", [sys.executable, "-c", script], results=tmp_path) == 0
    saved = json.loads((tmp_path / "queue.json").read_text())
    assert saved["summary"] == summary and saved["exit_status"] == 0
    assert saved["machine"]["cores"] >= 1 and len(saved["commit"]) == 40

    table = results.table(tmp_path)
    row = next(line for line in table.splitlines() if line.startswith("| job queue"))
    assert "SQLite 12.5, PostgreSQL 10 claims/s" in row and "SQLite 25 (0.50×), PostgreSQL 5 (2.00×)" in row
    assert "no result recorded yet" in table  # the other benchmarks, which have no file here

    readme = tmp_path / "README.md"
    (begin, end), (rbegin, rend) = results.markers("figures"), results.markers("reliability")
    readme.write_text(f"# x\n\nbefore\n{begin}\nold table\n{end}\nbetween\n{rbegin}\n{rend}\nafter\n")
    assert results.stale_blocks(tmp_path, readme) == ["figures", "reliability"]
    assert results.write_readme(tmp_path, readme) is True
    assert results.readme_section(readme.read_text()) == table
    assert "No reliability run recorded yet" in results.readme_section(readme.read_text(), "reliability")
    text = readme.read_text()
    assert text.startswith("# x\n\nbefore\n") and f"{end}\nbetween\n" in text and text.endswith(f"{rend}\nafter\n")
    assert results.stale_blocks(tmp_path, readme) == [] and results.write_readme(tmp_path, readme) is False


def test_record_saves_nothing_when_the_run_dies_before_its_summary(tmp_path: Path) -> None:
    script = "import json; print(json.dumps({'figure': 'sqlite_claims_per_s', 'value': 1})); raise SystemExit(3)"
    assert results.record("queue", [sys.executable, "-c", script], results=tmp_path) == 3
    assert not (tmp_path / "queue.json").exists()


def test_record_from_a_saved_log_keeps_the_runs_own_minutes_and_says_so(tmp_path: Path) -> None:
    summary = {"figure": "learning-tools", "preset": "smollm2-tools", "model": "m", "pass_before": 0.0, "pass_after": 0.5,
               "gain_points": 50.0, "gain_se_points": 6.0, "steps": 10, "minutes": 42.0, "general_before": 0.25,
               "general_after": 0.25, "peak_rss_gb": 7.5, "eval_tasks": 64, "peer": {"name": "the model before training"}}
    log = tmp_path / "run.log"
    log.write_text("warming up\n" + json.dumps({"curve": "grpo", "step": 1}) + "\n" + json.dumps(summary) + "\nrc=0\n")
    assert results.record("learning-tools", ["python", "bench/learning.py", "--preset", "smollm2-tools"], results=tmp_path,
                          from_log=log) == 0
    saved = json.loads((tmp_path / "learning-tools.json").read_text())
    assert saved["summary"] == summary and saved["minutes"] == 42.0 and "run.log" in saved["recorded_from"]
    assert saved["command"] == "python bench/learning.py --preset smollm2-tools"
    row = next(line for line in results.table(tmp_path).splitlines() if "smollm2-tools preset" in line)
    assert "0.0% → 50.0% (+50.0 ± 6.0 points, 10 steps) in 42 min" in row


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
        {"test": "t2", "kind": "inputs", "surface": "reward_integrity.code", "tried": 12, "refused_cleanly": 12, "accepted": 0,
         "mishandled": 0, "category": "reward_integrity"},
        {"test": "t3", "kind": "inputs", "surface": "tool_parser", "tried": 5, "refused_cleanly": 3, "accepted": 1, "mishandled": 1},
        {"test": "t4", "kind": "data", "what": "jobs", "lost": 0, "category": "durability"},
        {"test": "t5", "kind": "inputs", "surface": "reward_integrity.tool_use", "tried": 2, "refused_cleanly": 2, "accepted": 0,
         "mishandled": 0, "category": "reward_integrity"},
    ]
    summary = reliability.summarize(records)
    assert summary["categories"] == ["durability", "reward_integrity"]
    assert summary["inputs_tried"] == 19 and summary["inputs_refused_cleanly"] == 17 and summary["inputs_mishandled"] == 1
    assert summary["faults_injected"] == 1 and summary["faults_survived"] == 1 and summary["data_lost"] == 0
    last = reliability.final_line(records, soak=False, minutes=1.5, counts={"passed": 4, "failed": 1})
    for key in ("faults_injected", "faults_survived", "inputs_tried", "inputs_refused_cleanly", "inputs_mishandled", "data_lost",
                "categories", "surfaces", "load", "tests_passed", "tests_failed", "peer"):
        assert key in last, key
    assert last["categories"] == ["durability", "reward_integrity"] and last["tests_failed"] == 1
    assert reliability.summarize([])["categories"] == []


@pytest.mark.parametrize(("record", "refusal"), [
    ({"test": "t::roles", "kind": "inputs", "surface": "admin-rendered actions clicked by a viewer", "tried": 21,
      "refused_cleanly": 20, "accepted": 0, "mishandled": ["Jobs (queue): button cancel"]},
     r"record 1 \(t::roles, inputs 'admin-rendered actions clicked by a viewer'\): 'mishandled' must be a whole "
     r"number, not list \['Jobs \(queue\): button cancel'\]"),
    ({"test": "t::kill", "kind": "fault", "name": "kill worker", "survived": "yes"},
     r"record 1 \(t::kill, fault 'kill worker'\): 'survived' must be true or false, not str 'yes'"),
    ({"test": "t::data", "kind": "data", "what": "jobs"}, r"record 1 \(t::data, data 'jobs'\): it has no 'lost'"),
    ({"test": "t::load", "kind": "load", "name": "jobs.all", "requests": 10, "errors": 0, "p50_ms": "fast", "p95_ms": 1.0,
      "p99_ms": 1.0, "max_ms": 1.0}, r"'p50_ms' must be milliseconds or null, not str 'fast'"),
    ({"test": "t::odd", "kind": "inputs", "surface": "s", "tried": True, "refused_cleanly": 1, "accepted": 0, "mishandled": 0},
     r"'tried' must be a whole number, not bool True"),
    ({"test": "t::other", "kind": "latency"}, r"record 1 \(t::other, latency\): kind must be one of fault, inputs, load, data"),
])
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
    with pytest.raises(TypeError, match=r"inputs record: the detail \['mishandled'\] would replace the record's own field"):
        recorder.inputs("clicks", tried=3, refused_cleanly=2, mishandled=["Jobs: cancel"])
    recorder.inputs("clicks", tried=3, refused_cleanly=2, mishandled_actions=["Jobs: cancel"])
    assert recorder.records == [{"test": "t::roles", "kind": "inputs", "surface": "clicks", "tried": 3, "refused_cleanly": 2,
                                 "accepted": 0, "mishandled": 1, "mishandled_actions": ["Jobs: cancel"]}]
    assert load_reliability_module().summarize(recorder.records)["inputs_mishandled"] == 1


def test_the_repair_arms_combine_into_one_summary_and_its_rows(tmp_path: Path) -> None:
    """``bench/learning.py --combine``: the arms' results and the shared stages as one summary, each held-out
    group's pass@1 and standard error from the evaluation reports, and a README row per arm."""
    import subprocess

    def report(functions: float, modules: float, humaneval: float) -> dict[str, float]:
        return {"eval/pass@1": 0.0, "general/pass@1": 0.25, "eval/episodes/turns": 5.0, "eval/episodes/tool_calls": 4.0,
                "eval/episodes/tool_errors": 0.5, "eval/episodes/tested_before_reply": 0.75,
                "eval/repair.off_by_one/held_out_by/function/pass@1": functions, "eval/repair.off_by_one/held_out_by/function/tasks": 20.0,
                "eval/repair.off_by_one/held_out_by/prompt/pass@1": modules, "eval/repair.off_by_one/held_out_by/prompt/tasks": 10.0,
                "eval/repair.missing_case/held_out_by/prompt/pass@1": modules, "eval/repair.missing_case/held_out_by/prompt/tasks": 10.0,
                "eval/repair.humaneval/held_out_by/problem/pass@1": humaneval, "eval/repair.humaneval/held_out_by/problem/tasks": 8.0,
                "eval/repair.humaneval/held_out_by/prompt/pass@1": humaneval, "eval/repair.humaneval/held_out_by/prompt/tasks": 2.0}

    (tmp_path / "stages").mkdir()
    (tmp_path / "arms").mkdir()
    (tmp_path / "stages" / "base.json").write_text(json.dumps({"model": "m", "params": 1, "minutes": 5.0, "report": report(0, 0, 0)}))
    (tmp_path / "stages" / "sft.json").write_text(json.dumps({"model": "s", "steps": 32, "demonstrations": 96, "minutes": 20.0}))
    spec = importlib.util.spec_from_file_location("bench_learning", BENCH / "learning.py")
    assert spec is not None and spec.loader is not None
    learning = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(learning)
    for arm, rates in {"cold": (0.0, 0.0, 0.0), "sft": (0.2, 0.5, 0.0), "sft-grpo": (0.6, 0.7, 0.1)}.items():
        figures = {"arm": arm, "steps": 8, **learning.arm_figures(report(*rates)), "minutes": 30.0, "minutes_alone": 50.0,
                   "cpu_minutes": 55.0, "peak_rss_gb": 5.5, "reward_curve": [0.5, 0.6], "groups_used_mean": 1.5}
        (tmp_path / "arms" / f"{arm}.json").write_text(json.dumps(figures))
    out = subprocess.run([sys.executable, str(BENCH / "learning.py"), "--preset", "smollm2-repair", "--combine",
                          "--workdir", str(tmp_path)], capture_output=True, text=True, check=True)
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["figure"] == "learning-repair" and summary["eval_tasks"] == {"unseen_functions": 20, "unseen_modules": 20, "humaneval": 10}
    assert summary["arms"]["sft-grpo"]["pass_after"]["unseen_functions"] == 0.6
    assert summary["arms"]["sft"]["pass_after_se"]["unseen_functions"] == round((0.2 * 0.8 / 20) ** 0.5, 4)
    assert summary["sft_grpo_over_sft_unseen_functions_points"] == 40.0 and summary["goal_met"]
    assert summary["minutes"] == 5 + 20 + 3 * 30 and summary["peer"]["name"] == "the SFT-only arm"
    rows = results.learning_repair_rows(summary)
    assert len(rows) == 3 and "unseen functions 60.0%" in rows[2].result and "+40.0" in rows[2].peer
    (tmp_path / "arms" / "cold.json").unlink()
    missing = subprocess.run([sys.executable, str(BENCH / "learning.py"), "--preset", "smollm2-repair", "--combine",
                              "--workdir", str(tmp_path)], capture_output=True, text=True)
    assert missing.returncode != 0 and "arms ['cold'] have no result" in missing.stderr


def test_a_base_model_s_stages_combine_into_one_summary(tmp_path: Path) -> None:
    """``bench/learning.py --preset gemma3-base-to-instruct --combine``: the three stages (as it ships, after SFT,
    after GRPO) side by side, the gains between them with their standard errors, and whether the goal holds."""
    import subprocess

    (tmp_path / "arms").mkdir()
    for stage, p in {"base": 0.02, "sft": 0.30, "grpo": 0.45}.items():
        (tmp_path / "arms" / f"{stage}.json").write_text(json.dumps({
            "stage": stage, "model": f"m-{stage}", "pass_at_1": p, "pass_at_1_se": round((p * (1 - p) / 100) ** 0.5, 4),
            "general": {"pass_at_1": 0.2, "pass_at_1_se": 0.02}, "minutes": 20.0, "minutes_alone": 40.0, "peak_rss_gb": 6.0}))
    args = [sys.executable, str(BENCH / "learning.py"), "--preset", "gemma3-base-to-instruct", "--combine", "--workdir", str(tmp_path)]
    summary = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    assert list(summary["stages"]) == ["base", "sft", "grpo"] and summary["stages"]["sft"]["pass_at_1"] == 0.30
    assert summary["grpo_over_sft_points"] == 15.0 and summary["sft_over_base_points"] == 28.0
    se = round(100 * ((0.3 * 0.7 / 100) + (0.45 * 0.55 / 100)) ** 0.5, 2)
    assert summary["grpo_over_sft_se_points"] == pytest.approx(se, abs=0.02) and summary["goal_met"] == (15.0 > 2 * se)
    assert summary["minutes"] == 60.0 and summary["peak_rss_gb"] == 6.0
    (tmp_path / "arms" / "sft.json").unlink()
    missing = subprocess.run(args, capture_output=True, text=True)
    assert missing.returncode != 0 and "stages ['sft'] have no result" in missing.stderr
