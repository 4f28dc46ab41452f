"""Reliability report: faults survived, hostile inputs refused, load held, data lost.

    .venv/bin/python bench/reliability.py [--soak] [-k EXPR]

Runs the measured suite ``tests/reliability/`` (real workers, databases, sandboxes, engines)
with every test recording what it injected and measured into one JSON-lines file (the
``reliability`` fixture in tests/conftest.py), then sums the records. ``--soak`` runs the
long variant (bigger loads, longer fuzz budgets, more kill points). Prints one JSON object
per record kind and the report last: one JSON object with ``faults_injected``,
``faults_survived``, ``inputs_tried``, ``inputs_refused_cleanly``, ``inputs_accepted``,
``inputs_mishandled``, ``data_lost``, ``categories`` (the distinct ``category`` of the records, such
as ``reward_integrity``), the load figures, the suite's pass/fail counts and ``peer``: there is
no outside peer; each figure is counted against what the same run injected, tried or checked.
A load counted in an engine's decode steps as well as in time carries ``decode_steps`` (its
``p50``, its ``max`` and the ``bound`` its test holds them to) beside its milliseconds: such as
``request_lifetime.client_leaving``, from a client closing its connection to its request aborted
and gone from the engine, per round. A record the report cannot count (a field missing or of
another type) stops it with a message naming the record, its test and the field: no report is
better than a wrong one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _labelled(record: dict) -> str:
    """A load's name with the test's parameter (``jobs.all [postgres]``): a test run on both
    databases records each figure twice."""
    test = str(record.get("test", ""))
    return (
        f"{record['name']} [{test.rsplit('[', 1)[1].rstrip(']')}]"
        if test.endswith("]") and "[" in test
        else record["name"]
    )


class MalformedRecord(ValueError):
    """A record the suite wrote that the report cannot count; the message names it and the field."""


Check = tuple[str, Callable[[object], bool]]  # what a field must hold, and the test of it
TEXT: Check = ("a string", lambda v: isinstance(v, str))
FLAG: Check = ("true or false", lambda v: isinstance(v, bool))
COUNT: Check = ("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool))
MS: Check = ("milliseconds or null", lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)))
STEPS: Check = (
    "an object of decode steps, p50, max and bound, each a number",
    lambda v: (
        isinstance(v, dict)
        and v.keys() == {"p50", "max", "bound"}
        and all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in v.values())
    ),
)
FIELDS: dict[str, dict[str, Check]] = {  # each record kind's fields that the report reads
    "fault": {"name": TEXT, "survived": FLAG},
    "inputs": {"surface": TEXT, "tried": COUNT, "refused_cleanly": COUNT, "accepted": COUNT, "mishandled": COUNT},
    "load": {"name": TEXT, "requests": COUNT, "errors": COUNT, "p50_ms": MS, "p95_ms": MS, "p99_ms": MS, "max_ms": MS},
    "data": {"what": TEXT, "lost": COUNT},
}
OPTIONAL: dict[str, dict[str, Check]] = {  # fields a record of the kind may have, read when it has them
    "load": {"decode_steps": STEPS},
}


def check_record(index: int, record: dict) -> None:
    """Raise :class:`MalformedRecord` naming record ``index`` (its test, kind and label) unless the report can count it."""
    kind = record.get("kind")
    label = next((record[k] for k in ("surface", "name", "what") if isinstance(record.get(k), str)), None)
    named = f"record {index} ({record.get('test', 'no test')}, {kind}" + (f" {label!r})" if label else ")")
    if kind not in FIELDS:
        raise MalformedRecord(f"{named}: kind must be one of {', '.join(FIELDS)}")
    optional = OPTIONAL.get(kind, {})
    for field, (expected, holds) in {**FIELDS[kind], **optional}.items():
        if field not in record:
            if field in optional:
                continue
            raise MalformedRecord(f"{named}: it has no {field!r}")
        if not holds(record[field]):
            shown = repr(record[field])
            raise MalformedRecord(
                f"{named}: {field!r} must be {expected}, not {type(record[field]).__name__} "
                f"{shown if len(shown) <= 80 else shown[:77] + '...'}"
            )


def summarize(records: list[dict]) -> dict:
    """The report from the suite's records (see ``Reliability`` in tests/conftest.py); a record it cannot count
    is refused with :class:`MalformedRecord`, never counted wrong."""
    for index, record in enumerate(records):
        check_record(index, record)
    faults = [r for r in records if r["kind"] == "fault"]
    inputs = [r for r in records if r["kind"] == "inputs"]
    loads = [r for r in records if r["kind"] == "load"]
    data = [r for r in records if r["kind"] == "data"]
    surfaces: dict[str, dict[str, int]] = defaultdict(
        lambda: {"tried": 0, "refused_cleanly": 0, "accepted": 0, "mishandled": 0}
    )
    for r in inputs:
        for key in ("tried", "refused_cleanly", "accepted", "mishandled"):
            surfaces[r["surface"]][key] += r[key]
    return {
        "faults_injected": len(faults),
        "faults_survived": sum(1 for r in faults if r["survived"]),
        "faults": sorted({r["name"] for r in faults}),
        "faults_not_survived": sorted({r["name"] for r in faults if not r["survived"]}),
        "inputs_tried": sum(s["tried"] for s in surfaces.values()),
        "inputs_refused_cleanly": sum(s["refused_cleanly"] for s in surfaces.values()),
        "inputs_accepted": sum(s["accepted"] for s in surfaces.values()),
        "inputs_mishandled": sum(s["mishandled"] for s in surfaces.values()),
        "surfaces": dict(sorted(surfaces.items())),
        "load": {
            _labelled(r): {
                k: r[k]
                for k in ("requests", "errors", "p50_ms", "p95_ms", "p99_ms", "max_ms", "decode_steps")
                if k in r
            }
            for r in loads
        },
        "data_checked": len(data),
        "data_lost": sum(r["lost"] for r in data),
        "categories": sorted({str(r["category"]) for r in records if r.get("category")}),
    }


def final_line(records: list[dict], *, soak: bool, minutes: float, counts: dict[str, int]) -> dict:
    """The report's last line: every key of :func:`summarize` (``faults_injected``, ``faults_survived``,
    ``inputs_tried``, ``inputs_refused_cleanly``, ``inputs_mishandled``, ``data_lost``, ``categories``...),
    the run's size and the suite's pass/fail counts."""
    summary = {"figure": "reliability", **summarize(records)}
    summary.update(
        soak=soak, minutes=round(minutes, 2), tests_passed=counts.get("passed", 0),
        tests_failed=counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0),
        peer={"name": "none: each count is against what the same run injected, tried or checked",
              "faults_injected": summary["faults_injected"], "inputs_tried": summary["inputs_tried"],
              "data_checked": summary["data_checked"]},
    )  # fmt: skip
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--soak", action="store_true", help="run the long variant (bigger loads, longer fuzzing)")
    parser.add_argument("-k", dest="keyword", help="only the tests matching this pytest -k expression")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="posttrain-reliability-") as tmp:
        report = Path(tmp) / "records.jsonl"
        env = {
            **os.environ,
            "POSTTRAIN_RELIABILITY_REPORT": str(report),
            "POSTTRAIN_RELIABILITY_SOAK": "1" if args.soak else "0",
        }
        cmd = [sys.executable, "-m", "pytest", "tests/reliability", "-q", "-p", "no:cacheprovider", "--timeout", "3600"]
        if args.keyword:
            cmd += ["-k", args.keyword]
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        minutes = (time.monotonic() - started) / 60
        records = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []

    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", tail)}
    if proc.returncode != 0:
        print(proc.stdout[-4000:], file=sys.stderr)
        print(proc.stderr[-2000:], file=sys.stderr)
    for r in records:
        print(json.dumps(r, default=str))
    try:
        summary = final_line(records, soak=args.soak, minutes=minutes, counts=counts)
    except MalformedRecord as exc:
        raise SystemExit(f"no report: the suite wrote a malformed record: {exc}") from None
    print(json.dumps(summary))
    sys.exit(0 if proc.returncode == 0 else 1)


if __name__ == "__main__":
    main()
