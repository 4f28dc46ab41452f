"""Every registered procedural domain: reference answers score 1, wrong answers score below 1."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from posttrain.platform.tasks.domains import MAX_DIFFICULTY, generate, get_domain, list_domains, list_families
from posttrain.platform.tasks.domains.families.formatting import number_to_words, to_roman
from posttrain.platform.verifiers import PoolConfig, TaskSpec, VerifierService, validate_task
from posttrain.platform.verifiers.kinds.code import CodeTestsSpec, assemble_program

TASKS_PER_LEVEL = 2
LEVELS = (1, 3, MAX_DIFFICULTY)


def wrong_answer(task: TaskSpec) -> str:
    """A plausible but wrong completion for ``task``."""
    spec = task.verifier.spec
    kind = task.verifier.kind
    if kind == "numeric":
        return repr(spec["value"] + 1 + abs(spec["value"]) / 2)
    if kind == "json_schema":
        return json.dumps({"wrong": True})
    if kind == "code":
        return f"def {spec['entry_point']}(*args, **kwargs):\n    return None\n"
    return (task.reference or "") + "x"


def run_program(program: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", "-c", program], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def service():
    with VerifierService(PoolConfig(workers=2)) as svc:
        yield svc


def all_tasks() -> list[TaskSpec]:
    return [
        t
        for d in list_domains()
        for level in LEVELS
        for t in generate(d.name, TASKS_PER_LEVEL, seed=7, difficulty=level)
    ]


def test_at_least_200_domains_across_families():
    domains = list_domains()
    assert len(domains) >= 200, len(domains)
    assert len({d.name for d in domains}) == len(domains)
    assert {
        "arithmetic",
        "strings",
        "lists",
        "dates",
        "units",
        "json",
        "regex",
        "code",
        "formatting",
        "comparison",
    } <= set(list_families())
    assert all(d.max_difficulty >= 3 for d in domains)


def test_every_answer_domain_scores_reference_one_and_wrong_below_one(service):
    tasks = [t for t in all_tasks() if t.verifier.kind != "code"]
    for t in tasks:
        validate_task(t)  # every generated spec is valid
    references = service.verify_batch(tasks, [t.reference for t in tasks])
    wrongs = service.verify_batch(tasks, [wrong_answer(t) for t in tasks])
    failures = []
    for t, ref, bad in zip(tasks, references, wrongs):
        if not (ref.score == 1.0 and ref.passed):
            failures.append(f"{t.task_id}: reference {t.reference!r} scored {ref.score}: {ref.details}")
        if not bad.score < 1.0 or bad.is_infra_error:
            failures.append(f"{t.task_id}: wrong answer scored {bad.score}: {bad.details}")
    assert not failures, "\n".join(failures[:20])
    assert len({t.domain for t in tasks}) >= 200


def test_code_domains_reference_passes_and_wrong_fails_in_a_subprocess():
    tasks = [t for t in all_tasks() if t.verifier.kind == "code"]
    assert len({t.domain for t in tasks}) >= 20
    jobs = []
    for t in tasks:
        spec = CodeTestsSpec.model_validate(t.verifier.spec)
        jobs.append((t, True, assemble_program(spec, t.reference or "")))
        jobs.append((t, False, assemble_program(spec, wrong_answer(t))))
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda job: run_program(job[2]), jobs))
    failures = [
        f"{t.task_id} ({'reference' if should_pass else 'wrong'}): rc={r.returncode} {r.stderr[-300:]}"
        for (t, should_pass, _), r in zip(jobs, results)
        if (r.returncode == 0) != should_pass
    ]
    assert not failures, "\n".join(failures[:10])


def test_generation_is_deterministic_and_seeded():
    a = generate("arith.add.int", 5, seed=1, difficulty=2)
    b = generate("arith.add.int", 5, seed=1, difficulty=2)
    c = generate("arith.add.int", 5, seed=2, difficulty=2)
    assert [t.model_dump() for t in a] == [t.model_dump() for t in b]
    assert [t.prompt_text for t in a] != [t.prompt_text for t in c]
    assert len({t.prompt_text for t in a}) == 5
    assert a[0].metadata["difficulty"] == 2 and a[0].provenance["source"] == "procedural"
    assert json.loads(a[0].model_dump_json())["verifier"]["kind"] == "numeric"


def test_difficulty_knob_grows_problems():
    easy = generate("str.reverse.letters", 5, seed=3, difficulty=1)
    hard = generate("str.reverse.letters", 5, seed=3, difficulty=5)
    assert all(len(t.reference) == 3 for t in easy)
    assert all(len(t.reference) > 3 for t in hard)
    single_digit = generate("arith.add.int", 20, seed=0, difficulty=1)
    for t in single_digit:
        a, b = t.prompt_text.removeprefix("Compute ").rstrip(".").split(" + ")
        assert len(a) == len(b) == 1 and int(t.reference) == int(a) + int(b)


def test_bad_generate_arguments_are_clear():
    with pytest.raises(LookupError, match="unknown domain 'arith.nope'.*same family"):
        get_domain("arith.nope")
    with pytest.raises(ValueError, match="difficulty 9 is out of range"):
        generate("arith.add.int", 1, difficulty=9)


def test_answers_are_computed_independently_checked():
    for t in generate("format.to_roman", 10, seed=1, difficulty=4):
        n = int(t.prompt_text.split()[1])
        assert t.reference.upper() == to_roman(n)
        values = {"M": 1000, "D": 500, "C": 100, "L": 50, "X": 10, "V": 5, "I": 1}
        roman = t.reference
        total = sum(
            -values[c] if i + 1 < len(roman) and values[c] < values[roman[i + 1]] else values[c]
            for i, c in enumerate(roman)
        )
        assert total == n
    assert number_to_words(123456) == "one hundred twenty-three thousand four hundred fifty-six"
    import datetime as dt

    for t in generate("dates.add_days", 10, seed=1, difficulty=5):
        words = t.prompt_text.split()
        start = dt.date.fromisoformat(words[6].rstrip("?"))
        assert dt.date.fromisoformat(t.reference) == start + dt.timedelta(days=int(words[3]))


@pytest.mark.parametrize("seed", range(25))
def test_power_domains_never_ask_zero_to_the_zero(seed: int) -> None:
    for name in [d.name for d in list_domains() if ".pow." in d.name]:
        for difficulty in (1, 3, 5):
            for task in generate(name, 8, seed=seed, difficulty=difficulty):
                assert "0 ^ 0" not in task.prompt_text
