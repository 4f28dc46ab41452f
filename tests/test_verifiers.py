"""Verifier kinds, spec validation and the worker pool, through the real service."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from posttrain.platform.verifiers import (
    PoolConfig,
    TaskSpec,
    UnknownVerifierError,
    VerifierKind,
    VerifierService,
    VerifierSpecError,
    VerifyContext,
    list_verifiers,
    register_verifier,
    validate_spec,
)
from posttrain.platform.verifiers.kinds.exact import ExactSpec, check_exact
from posttrain.platform.verifiers.registry import get_verifier, unregister_verifier


def task(kind: str, spec: dict, reference: str | None = None) -> TaskSpec:
    return TaskSpec(domain="test", prompt="question", verifier={"kind": kind, "spec": spec}, reference=reference)


@pytest.fixture(scope="module")
def service():
    with VerifierService(PoolConfig(workers=2)) as svc:
        yield svc


def test_registry_lists_builtin_kinds():
    assert {"exact", "normalized", "numeric", "math", "json_schema", "doc_qa", "custom", "code", "tool_use"} <= set(
        list_verifiers()
    )
    with pytest.raises(UnknownVerifierError, match="registered kinds"):
        get_verifier("nope")


def test_exact_and_normalized(service):
    assert service.verify(task("exact", {"answer": "Paris"}), "  Paris\n").passed
    assert not service.verify(task("exact", {"answer": "Paris"}), "paris").passed
    assert service.verify(task("normalized", {"answer": "Paris"}), '"paris."').score == 1.0
    assert service.verify(
        task("exact", {"answer": ["4", "four"], "extract": "answer_tag"}), "hm <answer>four</answer>"
    ).passed
    wrong = service.verify(task("normalized", {"answer": "Paris"}), "London")
    assert wrong.score == 0.0 and not wrong.is_infra_error and "expected 'Paris'" in wrong.details


@pytest.mark.parametrize(
    ("spec", "completion", "passed"),
    [
        ({"value": 5}, "The answer is 5.", True),
        ({"value": 5}, "The answer is 6.", False),
        ({"value": 1234.5}, "1,234.5", True),
        ({"value": 0.75}, "3/4", True),
        ({"value": 3.14159, "rel_tol": 1e-3}, "about 3.1416", True),
        ({"value": 3.14159, "rel_tol": 1e-6}, "about 3.1416", False),
        ({"value": 5000, "unit": "m"}, "5 km", True),
        ({"value": 5000, "unit": "m"}, "5000", True),
        ({"value": 5000, "unit": "m", "require_unit": True}, "5000", False),
        ({"value": 5000, "unit": "m"}, "5 kg", False),
        ({"value": 212, "unit": "°F"}, "100 °C", True),
        ({"value": 50, "unit": "%"}, "0.5", False),
        ({"value": 2.1335807e10, "unit": "J", "rel_tol": 1e-4}, "2.1335807e+10 J", True),
    ],
)
def test_numeric_with_tolerance_and_units(service, spec, completion, passed):
    verdict = service.verify(task("numeric", spec), completion)
    assert verdict.passed is passed, verdict.details
    assert verdict.infra_error is None


def test_numeric_without_a_number_scores_zero_with_reason(service):
    verdict = service.verify(task("numeric", {"value": 1}), "I do not know")
    assert verdict.score == 0 and "no number" in verdict.details


def test_a_math_check_that_runs_out_of_time_is_not_judged_wrong(service):
    """A comparison math-verify cannot finish in time says nothing about the answer: an
    infrastructure-error verdict (never a reward), not a 0 that would punish a slow correct answer."""
    slow = service.verify(task("math", {"answer": "1", "step_timeout_s": 1}), "$(10^{8})!$")
    assert slow.is_infra_error and "the answer was not judged" in slow.details, slow
    assert not service.verify(task("math", {"answer": "1", "step_timeout_s": 1}), "$2$").is_infra_error


def test_math_equivalence(service):
    half = task("math", {"answer": "\\frac{1}{2}"})
    assert service.verify(half, "so the result is $\\boxed{0.5}$").passed
    assert service.verify(half, "$\\frac{2}{4}$").passed
    assert not service.verify(half, "$\\frac{1}{3}$").passed
    assert service.verify(task("math", {"answer": "x^2 + 2x + 1"}), "$(x+1)^2$").passed


# Gold answers that a completion may copy verbatim: each must score 1 against itself. A plain comma between
# digits is a decimal comma ("1,22" is 1.22, as math-verify reads a completion), or a thousands separator
# ("1,000"); a set is written with braces ("{1, 22}") or as LaTeX ("$1,22$", "\\boxed{1,22}").
GOLD_ANSWERS = [
    "1,22",
    "3,5",
    "0,5",
    "-1,5",
    "1,000",
    "10,000,000",
    "12,345.67",
    "{1, 22}",
    "\\{1, 22\\}",
    "$\\{1, 22\\}$",
    "$1,22$",
    "\\boxed{1,22}",
    "1,22,3",
    "1, 2, 3",
    "(1, 2)",
    "1/2",
    "\\frac{1}{2}",
    "x^2 + 2x + 1",
    "1e3",
    "2^{10}",
    "7",
]


@pytest.mark.parametrize("gold", GOLD_ANSWERS)
def test_a_gold_answer_scores_one_against_itself(service, gold):
    verdict = service.verify(task("math", {"answer": gold}), gold)
    assert verdict.passed and verdict.score == 1.0, verdict.details


def test_a_plain_gold_is_read_as_a_completion_is():
    from posttrain.platform.verifiers.kinds.math_expr import MathSpec, check_math, read_answer

    def score(gold: str, completion: str) -> float:
        return check_math(MathSpec(answer=gold), completion, None).score  # type: ignore[arg-type]

    assert str(read_answer("1,22", gold=True)[0]) == str(read_answer("1,22")[0]) == "1.22000000000000"
    assert score("1,22", "1.22") == 1 and score("1,22", "the answer is $1.22$") == 1
    assert score("1,22", "$\\{1, 22\\}$") == 0  # the decimal, not the set
    assert score("{1, 22}", "$\\{22, 1\\}$") == 1 and score("{1, 22}", "22") == 0  # the set stays a set
    assert score("3,5", "3.5") == 1 and score("1,000", "1000") == 1 and score("1,22,3", "$\\{3, 22, 1\\}$") == 1
    assert score("3", "x = 3") == 1 and score("3", "The answer is 3.") == 1  # completions read as before


def test_json_schema_partial_credit_by_field(service):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}, "tags": {"type": "array"}},
        "required": ["name", "age", "tags"],
    }
    t = task("json_schema", {"schema": schema})
    assert service.verify(t, '```json\n{"name": "a", "age": 3, "tags": []}\n```').score == 1.0
    partial = service.verify(t, '{"name": "a", "age": -1}')
    assert partial.score == pytest.approx(1 / 3) and not partial.passed
    assert "age" in partial.breakdown["problems"] and "tags" in partial.breakdown["problems"]
    not_json = service.verify(t, "{name: a}")
    assert not_json.score == 0 and "not JSON" in not_json.details
    expected = task("json_schema", {"schema": schema, "expected": {"name": "a", "age": 3, "tags": []}})
    assert service.verify(expected, '{"name": "a", "age": 4, "tags": []}').score == pytest.approx(2 / 3)


def test_spec_errors_name_the_field_and_the_fix():
    with pytest.raises(VerifierSpecError) as info:
        validate_spec("json_schema", {"schema": {"type": "strnig"}})
    message = str(info.value)
    assert "spec.schema" in message and "not a valid JSON Schema" in message and "fix" in message
    with pytest.raises(VerifierSpecError) as info:
        validate_spec("numeric", {"vale": 3})
    fields = {p.field for p in info.value.problems}
    assert fields == {"spec.value", "spec.vale"}
    with pytest.raises(VerifierSpecError, match="unknown unit 'parsec'"):
        validate_spec("numeric", {"value": 1, "unit": "parsec"})
    with pytest.raises(VerifierSpecError, match="spec.answer"):
        validate_spec("math", {"answer": ""})


def test_verify_raises_for_a_bad_spec_before_running(service):
    with pytest.raises(VerifierSpecError, match="spec.value"):
        service.verify(task("numeric", {}), "1")
    good, bad = task("exact", {"answer": "a"}), task("exact", {"answer": []})
    with pytest.raises(VerifierSpecError) as info:
        service.verify_batch([good, bad], ["a", "a"])
    assert "batch item 1" in "".join(getattr(info.value, "__notes__", []))


PAGES = {1: "Intro text.", 2: "The warranty lasts 24 months from the date of purchase.\nReturns are free."}


def test_doc_qa_answer_and_evidence_on_the_cited_page(service):
    spec = {"answers": ["24 months"], "require_evidence": True, "pages": PAGES}
    good = 'Answer: 24 months\nEvidence: "The warranty lasts 24 months"\nPage: 2'
    assert service.verify(task("doc_qa", spec), good).passed
    wrong_page = service.verify(task("doc_qa", spec), good.replace("Page: 2", "Page: 1"))
    assert (
        not wrong_page.passed
        and wrong_page.score == pytest.approx(0.5)
        and "does not occur on page 1" in wrong_page.details
    )
    invented = service.verify(task("doc_qa", spec), 'Answer: 24 months\nEvidence: "lasts two full years"\nPage: 2')
    assert not invented.passed
    # a sentence of the page that does not hold the answer is no evidence for it (GRPO learned to quote any sentence)
    beside = service.verify(task("doc_qa", spec), 'Answer: 24 months\nEvidence: "Returns are free."\nPage: 2')
    assert not beside.passed and beside.score == pytest.approx(0.5) and "does not contain the answer" in beside.details
    lax = service.verify(
        task("doc_qa", spec | {"evidence_holds_answer": False}),
        'Answer: 24 months\nEvidence: "Returns are free."\nPage: 2',
    )
    assert lax.passed
    f1 = service.verify(task("doc_qa", {"answers": "24 months from purchase", "metric": "f1"}), "24 months")
    assert 0 < f1.score < 1
    assert service.verify(task("doc_qa", {"answers": "The Eiffel Tower", "metric": "exact"}), "eiffel tower").passed


def test_doc_qa_page_text_through_a_lookup(service):
    calls = []

    def lookup(document_id, page):
        calls.append((document_id, page))
        return PAGES.get(page)

    spec = {"answers": ["24 months"], "require_evidence": True, "document_id": "manual.pdf"}
    completion = '{"answer": "24 months", "evidence": "lasts 24 months from the date", "page": 2}'
    verdict = service.verify(task("doc_qa", spec), completion, context=VerifyContext(page_lookup=lookup))
    assert verdict.passed and calls == [("manual.pdf", 2)]
    missing = service.verify(task("doc_qa", spec), completion)
    assert missing.is_infra_error and "page_lookup" in missing.infra_error


def test_megabyte_completion_scores_zero_with_a_reason(service):
    verdict = service.verify(task("exact", {"answer": "a"}), "a" * 3_000_000)
    assert verdict.score == 0 and not verdict.is_infra_error and "over the limit" in verdict.details


def test_code_and_tool_use_are_sandbox_kinds_not_slots():
    # The sandbox runners fill both kinds; tests/test_code_verifier.py checks them with real sandboxes.
    for name in ("code", "tool_use"):
        kind = get_verifier(name)
        assert not kind.placeholder and kind.isolation == "thread" and kind.prepare is not None


def test_register_a_kind_and_refuse_silent_replacement(service):
    kind = VerifierKind(name="shout", spec_model=ExactSpec, check=check_exact)
    register_verifier(kind)
    try:
        with pytest.raises(ValueError, match="replace=True"):
            register_verifier(kind)
        assert service.verify(task("shout", {"answer": "HI"}), "HI").passed
    finally:
        unregister_verifier("shout")


def test_batch_keeps_order_and_async_does_not_block_the_loop(service, monkeypatch):
    tasks = [task("numeric", {"value": i}) for i in range(20)]
    answers = [str(i if i % 2 == 0 else i + 1) for i in range(20)]
    verdicts = service.verify_batch(tasks, answers)
    assert [v.passed for v in verdicts] == [i % 2 == 0 for i in range(20)]
    # where the work runs: every validation and check of the async calls, by thread
    working: set[int] = set()
    for name in ("prepare", "_prepare_batch", "_run"):
        method = getattr(service, name)
        monkeypatch.setattr(
            service, name, lambda *a, _m=method, **k: (working.add(threading.get_ident()), _m(*a, **k))[1]
        )

    async def main():
        ticks: list[float] = []

        async def ticker():
            while True:
                await asyncio.sleep(0.005)
                ticks.append(time.perf_counter())

        running = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        started = time.perf_counter()
        single = await service.averify(tasks[3], "3")
        many = await service.averify_batch(tasks * 50, answers * 50)  # 1,000 checks: about half a second
        ended = time.perf_counter()
        running.cancel()
        return single, many, started, ended, ticks, threading.get_ident()

    single, many, started, ended, ticks, loop_thread = asyncio.run(main())
    assert single.passed and [v.passed for v in many] == [v.passed for v in verdicts] * 50
    # Nothing of the checks ran in the loop's thread, and the loop kept ticking while they ran. How
    # often it ticks, and its longest silence, are not asserted: the check threads share the GIL and,
    # with other processes computing, the cores, so under load the loop's thread waited up to 0.9 s
    # of 1.6 for its turn (a load-bound wait, not a block; measured with every core busy).
    assert working and loop_thread not in working, "a check or a validation ran in the event loop's thread"
    assert len([t for t in ticks if started < t < ended]) >= 3, ticks


def test_concurrent_first_lookups_all_see_the_builtin_kinds() -> None:
    """In a fresh process, threads that look up a kind at the same moment (a verifier actor's first
    batch) all find it: none sees the registry while the built-in kinds are still loading."""
    import subprocess
    import sys

    code = (
        "import threading\n"
        "from posttrain.platform.verifiers.registry import get_verifier\n"
        "errors = []\n"
        "def look():\n"
        "    try:\n"
        "        get_verifier('custom')\n"
        "    except Exception as exc:\n"
        "        errors.append(exc)\n"
        "threads = [threading.Thread(target=look) for _ in range(8)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "print(len(errors))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "0", out.stdout + out.stderr
