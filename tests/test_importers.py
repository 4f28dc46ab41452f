"""JSONL and HumanEval importers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from posttrain.platform.tasks.importers import TaskImportError, import_humaneval, import_jsonl, parse_jsonl_lines
from posttrain.platform.verifiers import PoolConfig, VerifierService
from posttrain.platform.verifiers.kinds.code import CodeTestsSpec, assemble_program


def test_jsonl_imports_valid_lines_and_they_verify(tmp_path):
    rows = [
        {"prompt": "2+2?", "answer": "4", "verifier": {"kind": "numeric", "spec": {"value": 4}}},
        {
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}],
            "answer": "Paris",
            "verifier": {"kind": "normalized", "spec": {"answer": "Paris"}},
            "split": "eval",
            "id": "cap-1",
        },
    ]
    path = tmp_path / "mini.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    tasks = import_jsonl(path)
    assert [t.domain for t in tasks] == ["mini", "mini"]
    assert tasks[1].task_id == "cap-1" and tasks[1].split == "eval" and tasks[1].prompt[0].role == "system"
    assert tasks[0].provenance == {"source": "jsonl", "file": str(path), "line": 1}
    with VerifierService(PoolConfig(workers=1)) as service:
        assert all(v.passed for v in service.verify_batch(tasks, [t.reference for t in tasks]))


def test_jsonl_reports_every_bad_line_with_its_number():
    lines = [
        json.dumps({"prompt": "ok", "answer": "1", "verifier": {"kind": "numeric", "spec": {"value": 1}}}),
        "{not json",
        json.dumps({"answer": "1", "verifier": {"kind": "exact", "spec": {"answer": "1"}}}),
        json.dumps({"prompt": "p", "verifier": {"kind": "json_schema", "spec": {"schema": {"type": 5}}}}),
        json.dumps({"prompt": "p", "verifier": {"kind": "nope", "spec": {}}}),
        json.dumps([1, 2]),
    ]
    with pytest.raises(TaskImportError) as info:
        parse_jsonl_lines(lines, domain="d", source="bad.jsonl")
    found = {(e.line, e.field) for e in info.value.errors}
    assert (2, "(line)") in found
    assert (3, "prompt") in found
    assert (4, "verifier.spec.schema") in found
    assert (5, "verifier.kind") in found
    assert (6, "(line)") in found
    assert all(e.line != 1 for e in info.value.errors)
    message = str(info.value)
    assert (
        message.startswith("bad.jsonl: ")
        and "line 4: verifier.spec.schema" in message
        and "nothing imported" in message
    )


def test_jsonl_missing_file_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="no task file"):
        import_jsonl(tmp_path / "missing.jsonl")


def test_humaneval_imports_all_problems_as_code_tasks():
    tasks = import_humaneval()
    assert len(tasks) == 164
    first = tasks[0]
    assert first.task_id == "HumanEval/0" and first.verifier.kind == "code"
    spec = CodeTestsSpec.model_validate(first.verifier.spec)
    assert spec.entry_point == "has_close_elements" and spec.test_call == "check(has_close_elements)"
    assert first.prompt_text.endswith(spec.prelude)


def _run(program: str) -> int:
    return subprocess.run([sys.executable, "-I", "-c", program], capture_output=True, timeout=60).returncode


@pytest.mark.parametrize("index", [0, 1, 2, 10, 53, 163])
def test_humaneval_canonical_solution_passes_and_wrong_fails(index):
    task = import_humaneval()[index]
    spec = CodeTestsSpec.model_validate(task.verifier.spec)
    assert _run(assemble_program(spec, task.reference or "")) == 0
    assert _run(assemble_program(spec, "    return None\n")) != 0


@pytest.mark.slow
def test_every_humaneval_canonical_solution_passes():
    failed = []
    for task in import_humaneval():
        spec = CodeTestsSpec.model_validate(task.verifier.spec)
        if _run(assemble_program(spec, task.reference or "")) != 0:
            failed.append(task.task_id)
    assert not failed


WEAK_TESTS = "xs = [3, 1, 2]\nassert f([2, 1]) == [1, 2]\nassert f(xs) == sorted(xs)\n"


def code_line(tests: str, task_id: str, **metadata: object) -> str:
    return json.dumps(
        {
            "prompt": "Write f(xs): xs sorted.",
            "answer": "def f(xs):\n    return sorted(xs)\n",
            "verifier": {"kind": "code", "spec": {"tests": tests, "entry_point": "f"}},
            "id": task_id,
            "metadata": metadata,
        }
    )


def test_jsonl_import_records_tests_forgeable_by_mutation():
    lines = [
        code_line(WEAK_TESTS, "weak"),
        code_line("assert f([3, 1, 2]) == [1, 2, 3]\n", "fine", note="kept"),
        code_line("assert f([1]) == [1]\n", "claims", forgeable_by_mutation=[{"test": 0}]),
        json.dumps(
            {"prompt": "2+2?", "answer": "4", "verifier": {"kind": "numeric", "spec": {"value": 4}}, "id": "num"}
        ),
    ]
    weak, fine, claims, num = parse_jsonl_lines(lines, domain="sorting")
    assert weak.metadata["forgeable_by_mutation"] == [
        {
            "test": 1,
            "code": "assert f(xs) == sorted(xs)",
            "argument": "xs",
            "callee": "f",
            "reason": "passes `xs` to `f` and reads it again: code that rewrites `xs` in place can pass",
        }
    ]
    assert fine.metadata == {"note": "kept"}
    assert claims.metadata == {} and num.metadata == {}  # a file's own claim is not kept; only code tasks are checked


def test_humaneval_import_flags_none_of_its_tests():
    assert [t.task_id for t in import_humaneval() if "forgeable_by_mutation" in t.metadata] == []


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_build_report_lists_tests_forgeable_by_mutation(platform_env):
    from pathlib import Path

    from conftest import OPERATOR, start_worker

    from posttrain.platform.db.models import JobStatus
    from posttrain.platform.jobs import queue
    from posttrain.platform.tasks import store

    path = Path(platform_env["POSTTRAIN_DATA_DIR"]) / "uploads" / "sorting.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(
        "\n".join([code_line(WEAK_TESTS, "weak"), code_line("assert f([3, 1]) == [1, 3]\n", "fine")]) + "\n"
    )
    code = queue.submit(
        OPERATOR, "build_tasks", {"task_set": "sorting", "source": {"type": "jsonl", "path": str(path)}}
    )
    other = queue.submit(
        OPERATOR,
        "build_tasks",
        {
            "task_set": "sums",
            "source": {"type": "procedural", "domains": ["arith.add.int"], "per_domain": 2, "eval_per_domain": 0},
        },
    )
    proc = start_worker(platform_env, "--exit-when-idle")
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    job = queue.get_job(code)
    assert job.status is JobStatus.succeeded, job.error
    assert job.result["tests_forgeable_by_mutation"] == 1 and job.result["tasks_with_tests_forgeable_by_mutation"] == 1
    assert job.result["forgeable_by_mutation"] == [
        "weak, test 2: `assert f(xs) == sorted(xs)` passes `xs` to `f` and reads it again: code that rewrites `xs` in place can pass"
    ]
    assert "tests_forgeable_by_mutation" not in (
        queue.get_job(other).result or {}
    )  # no imported code task: nothing said
    stored = {t.spec.task_id: t.spec.metadata for t in store.load_tasks(task_set="sorting")}
    assert stored["weak"]["forgeable_by_mutation"][0]["test"] == 1 and "forgeable_by_mutation" not in stored["fine"]
