"""Hostile input: every surface that takes outside input, fuzzed for a fixed time budget and fed the
known attacks; each input must be refused with a clear error or handled as valid, never anything else.

Surfaces: the platform's document ingest (``add_document`` and the ``preprocess`` job), the tool-call
parser (hypothesis here, and atheris in a child process), the job config loader (JSON, YAML and
``queue.submit``), the engine's and the gateway's request parsing (real HTTP servers), the sandbox
escape list of ``test_sandbox_bad_inputs`` against the Ray backend, and the console's login.

Every test records what it tried with the ``reliability`` fixture. A fuzz target runs for
``reliability.budget(ci_seconds, soak_seconds)`` in batches of hypothesis examples (each batch a full
hypothesis run that shrinks a failure); an input that raises anything but the surface's own error,
answers 5xx, hangs, or changes something already stored fails the test.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import random
import shutil
import subprocess
import sys
import textwrap
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import httpx
import pymupdf
import pytest
from conftest import (
    ADMIN,
    OPERATOR,
    REPO_ROOT,
    Reliability,
    login_as,
    reachable_dir,
    start_worker,
    stop_worker,
    wait_for,
)
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from PIL import Image
from required_parts import require
from sqlmodel import select
from streamlit.testing.v1 import AppTest

from posttrain.platform import auth
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import AuditLog, Document, DocumentStatus, Job, JobStatus, Role, User
from posttrain.platform.documents import add_document, get_document
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import JobConfigError, kinds, validate_config
from posttrain.platform.sandbox.parser import ParsedTurn, parse_tool_calls
from posttrain.preprocess.errors import PreprocessError
from posttrain.preprocess.pipeline import inspect_document

# --------------------------------------------------------------------------- the time-boxed fuzzer
Outcome = Literal["refused", "accepted"]  # what a target reports for one input; anything mishandled fails the test


def fuzz(
    strategy: st.SearchStrategy[Any], target: Callable[[Any], Outcome], seconds: float, *, batch: int = 25
) -> Counter[Outcome]:
    """Feed ``target`` examples of ``strategy`` until ``seconds`` have passed; returns the outcomes it
    reported ("refused" or "accepted"). Each batch is one hypothesis run with its own seed, so a failing
    input is shrunk and reported by hypothesis; the test fails with it."""
    outcomes: Counter[Outcome] = Counter()
    base = random.SystemRandom().randrange(2**31)
    deadline = time.monotonic() + seconds
    run = 0
    while time.monotonic() < deadline:

        @seed(base + run)
        @settings(
            max_examples=batch,
            deadline=None,
            database=None,
            phases=[Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck),
        )
        @given(strategy)
        def one(example: Any) -> None:
            outcomes[target(example)] += 1

        one()
        run += 1
    return outcomes


def record(reliability: Reliability, surface: str, outcomes: Counter[Outcome], **detail: object) -> None:
    tried = sum(outcomes.values())
    reliability.inputs(
        surface, tried=tried, refused_cleanly=outcomes["refused"], accepted=outcomes["accepted"], **detail
    )
    assert tried > 0


# ----------------------------------------------------------------------------- hostile documents


def plain_pdf(text: str = "Invoice total: 42 EUR") -> bytes:
    doc = pymupdf.open()
    page = doc.new_page(width=300, height=200)
    page.insert_text((20, 40), text)
    return doc.tobytes()


def png_bytes() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 12), (10, 20, 30)).save(buf, format="PNG")
    return buf.getvalue()


def active_pdfs(marker: Path) -> dict[str, bytes]:
    """PDFs carrying JavaScript, launch actions, page actions and embedded files. The launch action
    would create ``marker`` if anything ever ran it."""
    out: dict[str, bytes] = {}

    def build(name: str, edit: Callable[[pymupdf.Document, pymupdf.Page], None]) -> None:
        doc = pymupdf.open()
        page = doc.new_page(width=300, height=200)
        page.insert_text((20, 40), f"active content: {name}")
        edit(doc, page)
        out[name] = doc.tobytes()

    touch = f"touch {marker}"
    build(
        "openaction_js",
        lambda d, p: d.xref_set_key(d.pdf_catalog(), "OpenAction", "<</S/JavaScript/JS(app.alert('pwned'))>>"),
    )
    build(
        "names_js",
        lambda d, p: d.xref_set_key(
            d.pdf_catalog(), "Names", "<</JavaScript <</Names [(x) <</S/JavaScript/JS(this.exportDataObject())>>]>>>>"
        ),
    )
    build(
        "launch",
        lambda d, p: d.xref_set_key(
            d.pdf_catalog(), "OpenAction", f"<</S/Launch/F(/bin/sh)/Win<</F(cmd.exe)/P({touch})>>>>"
        ),
    )
    build(
        "launch_link",
        lambda d, p: p.insert_link(
            {"kind": pymupdf.LINK_LAUNCH, "from": pymupdf.Rect(10, 10, 100, 60), "file": "/bin/sh"}
        ),
    )
    build("page_aa", lambda d, p: d.xref_set_key(p.xref, "AA", "<</O <</S/JavaScript/JS(app.launchURL('x'))>>>>"))
    build("embedded_file", lambda d, p: d.embfile_add("payload.sh", b"#!/bin/sh\n" + touch.encode() + b"\n"))
    return out


HOSTILE_NAMES = [
    "../../../../etc/passwd.pdf",
    "..\\..\\windows\\system32\\evil.pdf",
    "/etc/cron.d/evil.pdf",
    "C:evil.pdf",
    "C:\\evil.pdf",
    "..",
    ".",
    "",
    "   ",
    "a\x00b.pdf",
    "line\nbreak.pdf",
    "tab\tname.pdf",
    "x" * 300 + ".pdf",
    "%2e%2e%2fescape.pdf",
    "....//....//escape.pdf",
    "\u202efdp.exe",
    "con.pdf",
    "ok name (1).pdf",
    "..pdf",
    "...",
    "évidence.pdf",
    "e\u0301vidence.pdf",
    "\ud7ff.pdf",
    "\udcff.pdf",
    "name/../x.pdf",
    "~/.ssh/id_rsa.pdf",
]


@st.composite
def mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 8))):
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        op = draw(st.sampled_from(["flip", "cut", "insert"]))
        if op == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == "cut":
            del data[pos : pos + draw(st.integers(1, 64))]
        else:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


def files_under(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def test_document_ingest_fuzz(
    platform_env: dict[str, str], db_url: str, tmp_path: Path, reliability: Reliability
) -> None:
    """``add_document`` with random and mutated bytes under hostile names: each refused with a
    PreprocessError naming the file, or stored under the data directory; what was stored before stays."""
    data_dir = Path(platform_env["POSTTRAIN_DATA_DIR"])
    good = add_document(OPERATOR, plain_pdf(), filename="good.pdf")
    stored_before = files_under(data_dir / "documents")
    outside_before = sorted(p.name for p in tmp_path.iterdir())
    seeds = [plain_pdf(), png_bytes(), *active_pdfs(tmp_path / "never").values()]
    names = st.one_of(
        st.sampled_from(HOSTILE_NAMES),
        st.text(max_size=40),
        st.sampled_from(["a.pdf", "b.png", "c.jpg", "d.txt", "report"]),
    )
    contents = st.one_of(st.binary(max_size=1024), mutated(seeds), st.sampled_from(seeds + [plain_pdf()]))
    seen: set[str] = set()

    def target(example: tuple[str, bytes]) -> Outcome:
        name, data = example
        try:
            added = add_document(OPERATOR, data, filename=name)
        except PreprocessError as exc:
            message = str(exc)
            stored = unicodedata.normalize("NFC", name)  # the name as it is stored (and named in messages)
            assert message and (
                "name" in message or any(repr(n) in message or repr(n[:40]) in message for n in (name, stored))
            ), message
            return "refused"
        path = Path(added.document.storage_path).resolve()
        assert path.is_relative_to((data_dir / "documents").resolve()), path
        assert "/" not in added.document.filename and "\\" not in added.document.filename
        if added.created:
            assert added.job_id is not None
            seen.add(added.document.sha256)
        return "accepted"

    outcomes = fuzz(st.tuples(names, contents), target, reliability.budget(6, 120))
    # Nothing outside the data directory, nothing stored before changed, the first document untouched.
    after = files_under(data_dir / "documents")
    lost = sum(1 for k in stored_before if after.get(k) != stored_before[k])
    reliability.data_lost("documents after ingest fuzz", lost)
    assert lost == 0 and sorted(p.name for p in tmp_path.iterdir()) == outside_before
    row = get_document(good.document.id)  # type: ignore[arg-type]
    assert row.status is DocumentStatus.uploaded and row.error is None and row.filename == "good.pdf"
    for sha in seen:
        with session(db_url, read_only=True) as s:
            assert s.exec(select(Document).where(Document.sha256 == sha)).one().status is DocumentStatus.uploaded
    record(reliability, "document_ingest", outcomes)


def test_uploads_with_path_traversal_names_and_oversized(
    platform_env: dict[str, str], db_url: str, tmp_path: Path, reliability: Reliability
) -> None:
    """Each hostile name is refused (or reduced to a plain base name) and writes nothing outside the
    data directory; a stored document uploaded again under a hostile name stays as it was; an
    oversized stream is refused before it fills the disk."""
    data_dir = Path(platform_env["POSTTRAIN_DATA_DIR"])
    content = plain_pdf("kept safe")
    good = add_document(OPERATOR, content, filename="kept.pdf")
    outcomes: Counter[Outcome] = Counter()
    for name in HOSTILE_NAMES:
        for data in (content, plain_pdf(f"new {name!r}")):
            try:
                added = add_document(OPERATOR, data, filename=name)
            except PreprocessError as exc:
                assert str(exc), name
                outcomes["refused"] += 1
                continue
            assert Path(added.document.storage_path).resolve().is_relative_to(data_dir.resolve())
            assert os.path.basename(added.document.filename) == added.document.filename
            outcomes["accepted"] += 1
    for name in ("../kept.pdf", "sub/../../x.pdf"):
        with pytest.raises(PreprocessError, match="path components"):
            add_document(OPERATOR, content, filename=name)
        outcomes["refused"] += 1
    row = get_document(good.document.id)  # type: ignore[arg-type]
    assert row.status is DocumentStatus.uploaded and row.error is None, (row.status, row.error)
    assert row.filename == "kept.pdf" and Path(row.storage_path).read_bytes() == content
    for marker in (Path("/etc/passwd.pdf"), Path("/etc/cron.d/evil.pdf"), data_dir.parent / "escape.pdf"):
        assert not marker.exists()

    from posttrain.preprocess.options import PreprocessOptions

    limit = PreprocessOptions().max_file_bytes
    read_ahead = 4 * 1024 * 1024

    class Endless(io.RawIOBase):
        """A PDF-looking stream that never ends: the size limit must stop it. Read past the limit (and a
        read-ahead), it raises, so a limit that does not hold fails here at once instead of hanging."""

        def __init__(self) -> None:
            self.sent = 0

        def readable(self) -> bool:
            return True

        def readinto(self, buf: Any) -> int:
            if self.sent > limit + read_ahead:
                raise AssertionError(f"read {self.sent} bytes of an endless upload, past the limit of {limit}")
            head = b"%PDF-1.7\n" if self.sent == 0 else b""
            n = len(buf)
            chunk = (head + b"0" * n)[:n]
            buf[:n] = chunk
            self.sent += n
            return n

    stream = Endless()
    with pytest.raises(PreprocessError, match="over the limit") as info:
        add_document(OPERATOR, io.BufferedReader(stream), filename="huge.pdf")
    assert "huge.pdf" in str(info.value) and stream.sent <= limit + read_ahead
    outcomes["refused"] += 1
    assert not list((data_dir / "documents" / "incoming").glob(".ingest-*"))  # the partial file is gone
    record(reliability, "upload_names_and_size", outcomes)


def test_pdfs_with_active_content_are_flagged_never_run(
    platform_env: dict[str, str], db_url: str, tmp_path: Path, reliability: Reliability
) -> None:
    """JavaScript, launch actions, page actions and embedded files: the preprocess job reads the text,
    runs nothing, and records on the document which active content it had."""
    marker = tmp_path / "launched"
    pdfs = active_pdfs(marker)
    for name, data in pdfs.items():  # the library reports it too
        path = tmp_path / f"{name}.pdf"
        path.write_bytes(data)
        assert inspect_document(path).active_content, name
    clean = add_document(OPERATOR, plain_pdf("no actions here"), filename="clean.pdf")
    added = {name: add_document(OPERATOR, data, filename=f"{name}.pdf") for name, data in pdfs.items()}
    # Damaged files that ingest accepts (they still sniff as PDF) go through the job too.
    rng = random.Random(9)
    damaged = []
    outcomes: Counter[Outcome] = Counter()
    for i in range(6):
        data = bytearray(pdfs[sorted(pdfs)[i % len(pdfs)]])
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(16, len(data))
            data[at : at + rng.randint(1, 40)] = rng.randbytes(rng.randint(0, 40))
        try:
            damaged.append(add_document(OPERATOR, bytes(data), filename=f"damaged-{i}.pdf"))
        except PreprocessError:
            outcomes["refused"] += 1
    worker = start_worker(platform_env)
    try:
        job_ids = [a.job_id for a in [*added.values(), *damaged, clean]]
        ended = (JobStatus.succeeded, JobStatus.failed)

        def done() -> bool:
            return all(queue.get_job(i).status in ended for i in job_ids)  # type: ignore[arg-type]

        wait_for(done, timeout=300, message="preprocess jobs")  # generous: CI machines are shared
    finally:
        stop_worker(worker)
    for a in damaged:  # ready, or failed with a message and a bad_input job; never stuck, never a crash
        doc = get_document(a.document.id)  # type: ignore[arg-type]
        job = queue.get_job(a.job_id)  # type: ignore[arg-type]
        if doc.status is DocumentStatus.ready:
            assert job.status is JobStatus.succeeded
            outcomes["accepted"] += 1
        else:
            assert doc.error and job.status is JobStatus.failed and job.error_cause == "bad_input", (
                doc.status,
                doc.error,
                job.status,
                job.error_cause,
                job.error,
            )
            outcomes["refused"] += 1
    for name, a in added.items():
        doc = get_document(a.document.id)  # type: ignore[arg-type]
        assert doc.status is DocumentStatus.ready, (name, doc.error)
        flags = doc.meta.get("active_content")
        assert flags, (name, doc.meta)
        outcomes["accepted"] += 1
    assert get_document(clean.document.id).meta.get("active_content") == []  # type: ignore[arg-type]
    assert not marker.exists()
    wanted = {a.job_id for a in added.values()} | {clean.job_id}
    assert {j.id: j.status for j in queue.list_jobs(kind="preprocess") if j.id in wanted} == dict.fromkeys(
        wanted, JobStatus.succeeded
    )
    record(reliability, "pdf_active_content", outcomes, kinds=sorted(pdfs))


# ------------------------------------------------------------------------------ tool-call parser

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20)
)
json_values = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20,
)
hermes_pieces = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        '{"name": "python", "arguments": {"code": "1+1"}}',
        '{"name": ',
        '"arguments": ',
        "{",
        "}",
        "[",
        "]",
        '"',
        "\\",
        " ",
        "\n",
        "NaN",
        "Infinity",
        '{"name": "f", "parameters": "{}"}',
        "null",
        '{"name": 5}',
        "<tool_call><tool_call>",
        "\x00",
        "\ud7ff",
        "[" * 50,
    ]
)
hermes_text = st.lists(st.one_of(hermes_pieces, st.text(max_size=10)), max_size=30).map("".join)
openai_messages = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["assistant", "user", 5]),
        "content": st.one_of(
            json_values,
            hermes_text,
            st.lists(
                st.one_of(
                    st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(hermes_text, json_leaf)}),
                    json_values,
                ),
                max_size=3,
            ),
        ),
        "tool_calls": st.one_of(
            json_values,
            st.lists(
                st.one_of(
                    json_values,
                    st.fixed_dictionaries(
                        {},
                        optional={
                            "id": json_leaf,
                            "type": json_leaf,
                            "function": st.one_of(
                                json_values,
                                st.fixed_dictionaries(
                                    {},
                                    optional={
                                        "name": json_leaf,
                                        "arguments": st.one_of(json_values, hermes_text, json_values.map(json.dumps)),
                                    },
                                ),
                            ),
                        },
                    ),
                ),
                max_size=3,
            ),
        ),
    },
)


def strict_json(text: str) -> Any:
    def no_constants(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=no_constants)


# A turn's parse time is judged against a peer measured in the same test: an ordinary turn whose one
# tool call carries a 100,000-character argument (decoding it is the most work a legitimate turn
# asks for: 6 ms here). The slowest hostile turn measured (20,000 opening tags, 220,000 characters)
# took 4.4x that, the rest far less; a backtracking or quadratic parse takes thousands of times longer.
PEER_TURN = {
    "content": "Let me run it.",
    "tool_calls": [{"function": {"name": "python", "arguments": json.dumps({"code": "x = 1\n" * 16_667})}}],
}
PARSE_WITHIN = 100  # times the peer's parse


def peer_parse_s() -> float:
    """The best of five parses of PEER_TURN, in seconds."""
    took = []
    for _ in range(5):
        started = time.perf_counter()
        turn = parse_tool_calls(PEER_TURN)
        took.append(time.perf_counter() - started)
        assert [c.name for c in turn.calls] == ["python"] and not turn.calls[0].error, turn
    return min(took)


def check_turn(message: Any, limit_s: float) -> Outcome:
    started = time.perf_counter()
    turn = parse_tool_calls(message)
    took = time.perf_counter() - started
    assert took < limit_s, f"parsing one turn took {took:.3f} s, over {PARSE_WITHIN}x the peer's ({limit_s:.3f} s)"
    assert isinstance(turn, ParsedTurn) and isinstance(turn.content, str)
    for call in turn.calls:
        assert isinstance(call.name, str) and isinstance(call.arguments, dict)
        wire = call.to_openai()
        assert isinstance(strict_json(wire["function"]["arguments"]), dict)  # what goes out is valid JSON
        json.dumps(wire, allow_nan=False)
    return "refused" if any(c.error for c in turn.calls) else "accepted"


HOSTILE_TURNS: list[Any] = [
    "<tool_call>a" + " " * 60_000 + "b",
    "<tool_call>" + "\n" * 60_000,
    " " * 30_000 + "<tool_call>" + " \t" * 30_000 + "x</tool_call",
    '<tool_call>{"name": "f", "arguments": ' + "[" * 100_000 + "}</tool_call>",
    '<tool_call>{"name": "f", "arguments": {"x": NaN, "y": -Infinity}}</tool_call>',
    '<tool_call>{"name": "f", "arguments": "' + "[" * 50_000 + '"}</tool_call>',
    "<tool_call>" * 20_000,
    {"tool_calls": "not a list"},
    {"tool_calls": {"function": {"name": "f"}}},
    {"tool_calls": [None, 5, "x"]},
    {"tool_calls": [{"function": "python"}]},
    {"tool_calls": [{"function": {"name": ["f"], "arguments": 5}}]},
    {"tool_calls": [{"function": {"name": "f", "arguments": "[" * 100_000}}]},
    {"content": 5},
    {"content": [{"text": 5}, "x", None]},
    {"content": {"text": "x"}},
]


def test_tool_call_parser_fuzz(reliability: Reliability) -> None:
    """Model output of any shape: parsed, or calls carrying an error for the model; never an exception,
    never slower than PARSE_WITHIN times an ordinary turn's parse, and what goes back out is always valid JSON."""
    limit_s = PARSE_WITHIN * peer_parse_s()
    outcomes = Counter(check_turn(m, limit_s) for m in HOSTILE_TURNS)
    outcomes += fuzz(
        st.one_of(hermes_text, st.text(), openai_messages),
        lambda m: check_turn(m, limit_s),
        reliability.budget(4, 120),
        batch=100,
    )
    record(reliability, "tool_call_parser", outcomes)


ATHERIS_TARGET = textwrap.dedent("""
    import json, sys, time
    import atheris
    with atheris.instrument_imports():
        from posttrain.platform.sandbox.parser import parse_tool_calls

    def one(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        text = fdp.ConsumeUnicodeNoSurrogates(fdp.remaining_bytes())
        for message in (text, {"content": text}, {"tool_calls": [{"function": {"name": "f", "arguments": text}}]}):
            started = time.perf_counter()
            turn = parse_tool_calls(message)
            assert time.perf_counter() - started < LIMIT_S, len(text)
            for call in turn.calls:
                json.loads(json.dumps(call.to_openai(), allow_nan=False))

    LIMIT_S = float(sys.argv.pop(1))  # PARSE_WITHIN times the peer's parse, measured by the test
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()
""")


def test_tool_call_parser_atheris(tmp_path: Path, reliability: Reliability) -> None:
    """Coverage-guided fuzzing of the parser with atheris (libFuzzer), in a child process."""
    require("atheris")
    seconds = int(reliability.budget(5, 120))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, seed_text in enumerate(
        [
            '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>',
            '{"a": [1, {"b": null}]}',
            "<tool_call>[[[</tool_call>",
        ]
    ):
        (corpus / f"seed{i}").write_text(seed_text)
    script = tmp_path / "fuzz_parser.py"
    script.write_text(ATHERIS_TARGET)
    limit_s = PARSE_WITHIN * peer_parse_s()  # inputs of at most 4 KiB: well under the peer's 100,000 characters
    # Started through a small intermediate process: Linux carries a process's peak RSS across exec,
    # so a child forked straight from this test process (gigabytes once the real model is loaded)
    # would start with this process's peak, and libFuzzer's -rss_limit_mb would count it.
    fresh = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            fresh,
            sys.executable,
            str(script),
            str(limit_s),
            f"-max_total_time={seconds}",
            "-max_len=4096",
            "-rss_limit_mb=2048",
            f"-artifact_prefix={tmp_path}/",
            str(corpus),
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    done = [line for line in out.splitlines() if line.startswith("Done ")]
    assert proc.returncode == 0 and done, out[-4000:]
    runs = int(done[-1].split()[1])
    assert runs > 0
    record(reliability, "tool_call_parser_atheris", Counter(accepted=runs), engine="atheris")


# ---------------------------------------------------------------------------- job config loader

VALID_CONFIGS: dict[str, dict[str, Any]] = {
    "selftest": {"steps": 2, "sleep_s": 0.1},
    "preprocess": {"document_id": 1},
    "build_tasks": {"task_set": "t", "source": {"type": "procedural", "domains": ["arith.add"]}},
    "build_model": {"name": "m1"},
    "deploy": {"model": "m1", "vllm_overrides": {"gpu_memory_utilization": 0.5}},
    "train_sft": {"model": "m1", "domains": ["arith.add"], "max_steps": 2},
    "train_grpo": {"preset": "cpu-demo", "model": "m1", "domains": ["arith.add"]},
    "evaluate": {"model": "m1", "domains": ["arith.add"]},
}


@st.composite
def job_configs(draw: st.DrawFn) -> tuple[str, Any]:
    kind = draw(st.sampled_from(sorted(VALID_CONFIGS) + ["no-such-kind"]))
    base = dict(VALID_CONFIGS.get(kind, {}))
    how = draw(st.sampled_from(["mutate", "random", "yaml"]))
    if how == "random":
        return kind, draw(st.one_of(json_values, st.dictionaries(st.text(max_size=12), json_values, max_size=6)))
    for _ in range(draw(st.integers(1, 3))):
        field = draw(
            st.one_of(
                st.sampled_from(sorted(base) or ["x"]),
                st.sampled_from(
                    [
                        "preset",
                        "lr",
                        "temperature",
                        "max_grad_norm",
                        "register_as",
                        "output_dir",
                        "seed",
                        "betas",
                        "lora",
                        "scheduler",
                        "vllm_overrides",
                        "steps",
                        "mark_file",
                        "source",
                    ]
                ),
                st.text(max_size=8),
            )
        )
        if draw(st.booleans()):
            base.pop(field, None)
        else:
            base[field] = draw(
                st.one_of(
                    json_values,
                    st.sampled_from(
                        [math.inf, -math.inf, math.nan, 10**40, -(10**40), "\x00", "../../etc", "cpu-demo", "", [], {}]
                    ),
                )
            )
    if how == "yaml":
        text = draw(
            st.one_of(
                st.just(json.dumps(base, default=str)),
                st.text(max_size=80),
                st.sampled_from(
                    [
                        "a: &a [1, 2]\nb: *a\n",
                        "!!python/object/apply:os.system ['touch /tmp/pwned']",
                        "- 1\n- 2\n",
                        "steps: .nan\n",
                        "steps: .inf\n",
                        "preset: [cpu-demo]\n",
                        "? [1, 2]\n: x\n",
                        "steps: 2021-01-01\n",
                        "%YAML 9.9\n---\nx: 1\n",
                        "x: !!binary aGVsbG8=\n",
                        "{" * 5000,
                    ]
                ),
            )
        )
        return kind, ("yaml", text)
    return kind, base


# A hang cap, not a speed figure: a config validation chokes on (an alias bomb expanding to billions of values,
# nesting thousands deep) runs for minutes; a plain one is checked and stored in milliseconds, so only a runaway
# config reaches this, not a busy machine.
RUNAWAY_S = 30.0


def laughs(depth: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, depth):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "model: m1\nvllm_overrides:\n" + "\n".join("  " + line for line in lines) + "\n"


def test_job_config_loader_fuzz(
    platform_env: dict[str, str], db_url: str, tmp_path: Path, reliability: Reliability
) -> None:
    """Configs of every kind, mutated, random and as YAML text: refused with a JobConfigError naming
    the field, or queued with a config that reads back exactly as it was validated."""
    from posttrain.platform.cli import _load_config

    keep = queue.submit(OPERATOR, "selftest", {"steps": 1})
    known = set(kinds())
    assert set(VALID_CONFIGS) <= known, known - set(VALID_CONFIGS)
    path = tmp_path / "config.yaml"
    pwned = Path("/tmp/pwned")
    pwned.unlink(missing_ok=True)

    def submit(kind: str, config: Any) -> Outcome:
        if isinstance(config, tuple):
            path.write_text(config[1])
            try:
                config = _load_config(None, path)
            except JobConfigError as exc:
                assert str(path) in str(exc) or "mapping" in str(exc), exc
                return "refused"
        started = time.monotonic()
        try:
            job_id = queue.submit(OPERATOR, kind, config)
        except JobConfigError as exc:
            assert kind in str(exc), exc
            assert time.monotonic() - started < RUNAWAY_S, f"refusing a config took over {RUNAWAY_S} s"
            return "refused"
        assert time.monotonic() - started < RUNAWAY_S, f"accepting a config took over {RUNAWAY_S} s"
        stored = queue.get_job(job_id).config
        assert validate_config(kind, stored).model_dump(mode="json") == stored, (config, stored)
        return "accepted"

    must_refuse = [
        ("deploy", ("yaml", laughs())),
        ("selftest", {"steps": math.nan}),
        ("train_sft", {"model": "m", "lr": math.inf}),
        ("train_grpo", {"model": "m", "domains": ["a"], "temperature": math.inf}),  # would be stored as null
        ("train_sft", {"model": "m", "max_grad_norm": math.inf}),  # null: clipping silently off
        ("train_grpo", ("yaml", '{"preset": "cpu-demo", "lr": Infinity}')),  # text read as a float: inf
        ("train_sft", {"model": "m", "lr": "nan"}),
        ("train_sft", {"model": "m", "register_as": "../../../etc/evil"}),  # a directory under models/
        ("train_sft", {"model": "m", "register_as": ".."}),
        ("deploy", {"model": "m", "vllm_overrides": {"x": math.nan}}),
        ("deploy", {"model": "m", "vllm_overrides": json.loads("[" * 500 + "]" * 500)}),
        ("deploy", {"model": "m", "vllm_overrides": {1: "non-string key"}}),
        ("build_model", ("yaml", "{" * 5000)),
        ("selftest", ("yaml", "!!python/object/apply:os.system ['touch /tmp/pwned']")),
        ("selftest", [1, 2]),
        ("no-such-kind", {}),
    ]
    for kind, config in must_refuse:
        assert submit(kind, config) == "refused", (kind, str(config)[:200])
    outcomes = Counter(refused=len(must_refuse))
    outcomes += fuzz(job_configs(), lambda example: submit(*example), reliability.budget(6, 120), batch=40)
    assert not pwned.exists()
    assert queue.get_job(keep).config == {**validate_config("selftest", {"steps": 1}).model_dump(mode="json")}
    with session(db_url, read_only=True) as s:
        assert all(j.status is JobStatus.queued for j in s.exec(select(Job)))
    record(reliability, "job_config_loader", outcomes)


# --------------------------------------------------------------------- engine and gateway requests


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A tiny model behind the embedded engine on a real uvicorn port, and a gateway in front of it."""
    from posttrain.platform.engines import DEFAULT_TIERS, EngineConfig
    from posttrain.platform.models import TinyModelSpec, build_tiny_model
    from posttrain.platform.serving import EmbeddedEngine, create_engine_app, serve_in_thread
    from posttrain.platform.serving.gateway import Deployment, GatewayConfig, create_gateway_app

    path = build_tiny_model(
        tmp_path_factory.mktemp("hostile") / "tiny",
        TinyModelSpec(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128),
    )
    standard = DEFAULT_TIERS["standard"]
    tier = standard.model_copy(update={"embedded": standard.embedded.model_copy(update={"batch_wait_ms": 1.0})})
    engine = EmbeddedEngine(
        EngineConfig(model_path=str(path), served_model_name="tiny", tier=tier, max_model_len=128)
    ).start()
    server = serve_in_thread(create_engine_app(engine, max_request_bytes=MAX_BODY))
    gateway = serve_in_thread(
        create_gateway_app(
            GatewayConfig(
                deployments=[Deployment(model="tiny", tier=t, base_url=server.base_url) for t in ("fast", "standard")],
                max_request_bytes=MAX_BODY,
            )
        )
    )
    yield {"engine": server.base_url, "gateway": gateway.base_url, "engine_obj": engine}
    gateway.stop()
    server.stop()
    engine.stop()


MAX_BODY = 256 * 1024
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "temperature": 0}
COMPLETION = {"model": "tiny", "prompt": "The total is", "max_tokens": 3}


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, dict[str, Any], bytes]:
    path = draw(st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
    base = json.loads(json.dumps(CHAT if "chat" in path else COMPLETION))
    how = draw(st.sampled_from(["mutate", "mutate", "random", "bytes"]))
    headers = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "x-posttrain-tier": st.sampled_from(["fast", "standard", "nope", "", "fast\u00e9"]),
                "x-task-type": st.sampled_from(["chat", "batch", "??", ""]),
                "content-type": st.sampled_from(["application/json", "text/plain", "multipart/form-data"]),
            },
        )
    )
    headers = {k: v.encode("utf-8") for k, v in headers.items()}  # raw bytes on the wire, UTF-8 included
    if how == "bytes":
        return path, headers, draw(st.binary(max_size=256))
    if how == "random":
        return path, headers, json.dumps(draw(json_values)).encode()
    fields = [
        "model",
        "messages",
        "prompt",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "seed",
        "stream",
        "stream_options",
        "n",
        "tools",
        "tool_choice",
        "metadata",
        "logprobs",
    ]
    for _ in range(draw(st.integers(1, 3))):
        field = draw(st.sampled_from(fields))
        if draw(st.integers(0, 4)) == 0:
            base.pop(field, None)
            continue
        base[field] = draw(
            st.one_of(
                json_values,
                st.sampled_from(
                    [
                        10**30,
                        -(10**30),
                        2**64,
                        -1,
                        0,
                        1,
                        True,
                        0.5,
                        2.5,
                        "tiny",
                        "",
                        [],
                        {},
                        [2**40],
                        [-1],
                        [0, 1, 2],
                        [
                            {
                                "role": "user",
                                "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
                            }
                        ],
                        [{"role": "assistant", "content": None}],
                        [{"role": "tool", "content": "x"}],
                        [{"role": "user", "content": [{"type": "text"}]}],
                        {"task_type": ["chat"]},
                        {"task_type": 5},
                        {"include_usage": True},
                        [{"type": "function", "function": {"name": "f", "parameters": {"a": 1}}}],
                    ]
                ),
            )
        )
    return path, headers, json.dumps(base).encode()  # NaN and Infinity go out as such: hostile too


def check_response(resp: httpx.Response, sent: bytes) -> Outcome:
    assert resp.status_code < 500, (resp.status_code, resp.text[:500], sent[:300])
    if resp.status_code >= 400:
        error = resp.json()["error"]
        assert error["message"] and error["code"] == resp.status_code, error
        return "refused"
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        events = [line[6:] for line in resp.text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", resp.text[-500:]
        for event in events[:-1]:
            assert "error" not in json.loads(event), (event, sent[:300])
    else:
        assert resp.json()["choices"], resp.text[:300]
    return "accepted"


HOSTILE_BODIES: list[bytes] = [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"model": "tiny", "messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    b"\xff\xfe\x00",
    b"",
    b"null",
    b'"tiny"',
    json.dumps({**CHAT, "seed": 2**64}).encode(),
    json.dumps({**CHAT, "seed": -(2**63) - 1}).encode(),
    json.dumps({**COMPLETION, "seed": 10**30}).encode(),
    json.dumps({**CHAT, "metadata": {"task_type": ["chat"]}}).encode(),
    json.dumps({**CHAT, "metadata": []}).encode(),
    json.dumps({**CHAT, "model": ["tiny"]}).encode(),
    json.dumps({**CHAT, "max_tokens": 10**30}).encode(),
    b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
    json.dumps({**COMPLETION, "prompt": [10**12]}).encode(),
    json.dumps({**COMPLETION, "prompt": [[1]]}).encode(),
]


def test_request_parsing_fuzz(serving: dict[str, Any], reliability: Reliability) -> None:
    """Bodies and headers of any shape, to the engine and through the gateway: each answered 2xx,
    or 4xx with an OpenAI-style JSON error naming the problem; never a 5xx, and the engine keeps serving."""
    outcomes: Counter[Outcome] = Counter()
    with httpx.Client(timeout=60) as client:

        def send(example: tuple[str, dict[str, Any], bytes]) -> Outcome:
            path, headers, body = example
            results = {
                check_response(client.post(base + path, content=body, headers=headers), body)
                for base in (serving["engine"], serving["gateway"])
            }
            return "accepted" if results == {"accepted"} else "refused"

        for body in HOSTILE_BODIES:
            for path in ("/v1/chat/completions", "/v1/completions"):
                outcomes[send((path, {}, body))] += 1
        outcomes += fuzz(requests(), send, reliability.budget(8, 180), batch=25)
        # Oversized: refused with 413 before the body is read whole, by both.
        big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * (MAX_BODY * 2)}]}).encode()
        for base in (serving["engine"], serving["gateway"]):
            resp = client.post(base + "/v1/chat/completions", content=big)
            assert resp.status_code == 413 and "bytes" in resp.json()["error"]["message"], resp.text[:300]

            def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer, counted as it arrives
                for i in range(0, len(big), 65536):
                    yield big[i : i + 65536]

            resp = client.post(base + "/v1/chat/completions", content=chunks())
            assert resp.status_code == 413, resp.text[:300]
            outcomes["refused"] += 2
        ok = client.post(serving["gateway"] + "/v1/chat/completions", json=CHAT)
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None
    assert serving["engine_obj"]._thread.is_alive()
    record(reliability, "gateway_and_engine_requests", outcomes)


# --------------------------------------------------------------------- sandbox escapes on Ray


@pytest.mark.slow
def test_sandbox_escape_list_on_ray(reliability: Reliability, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sandbox issue's escape list (``test_sandbox_bad_inputs.BAD_INPUTS`` and its host checks),
    shared, not copied, against a RaySandboxPool on a local Ray head (``tests/ray_cluster.py``): one
    Ray session for the whole list."""
    require("ray")
    require("bubblewrap")
    import test_sandbox_ray as ray_tests
    from ray_cluster import local_cluster
    from test_sandbox_bad_inputs import BAD_INPUTS, CONTAINED_WITHIN, SECRET, peer_seconds

    from posttrain.platform.sandbox.factory import make_pool

    data_dir = reachable_dir()  # readable by the sandboxes, unlike tmp_path
    # A private HOME for this process and the nodes: a ~/.ray/auth_token another program left on a
    # shared machine would otherwise make the driver's connection to this cluster fail.
    monkeypatch.setenv("HOME", str(tmp_path))
    outcomes: Counter[Outcome] = Counter()
    try:
        with local_cluster(
            head_cpus=2, head_object_store_bytes=80_000_000, env={"POSTTRAIN_TEST_SECRET_TOKEN": SECRET}
        ) as cluster:  # the actors must not see it
            with make_pool(ray_tests.RAY_CONFIG, data_dir, ray_address=cluster.address) as pool:
                for item in BAD_INPUTS:
                    with pool.acquire(timeout=30) as sandbox:
                        peer = peer_seconds(sandbox)  # a call cut off at the call timeout, through Ray
                        started = time.monotonic()
                        result = ray_tests.run(sandbox, item)
                        took = time.monotonic() - started
                        assert took < CONTAINED_WITHIN * peer, (item.name, took, peer)
                        assert result.status in item.expected and not result.is_infrastructure_failure, (
                            item.name,
                            result,
                        )
                        assert sandbox.run_python("'alive'").value == "'alive'", item.name
                    outcomes["refused"] += 1  # contained and classified
                ray_tests.assert_pool_healthy(pool)
                for check in (
                    ray_tests.test_the_host_loopback_is_out_of_reach,
                    ray_tests.test_the_nodes_environment_is_invisible,
                    ray_tests.test_writes_outside_the_work_directory_stay_inside,
                ):
                    check(pool)
                    outcomes["refused"] += 1
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    record(reliability, "sandbox_escapes_ray", outcomes, items=len(BAD_INPUTS) + 3)


# --------------------------------------------------------------------------- console login


PASSWORD = "correct horse battery"
SQLISH = [
    "admin' --",
    "' OR '1'='1",
    "admin'; DROP TABLE users; --",
    "admin\x00",
    "\x00",
    "%",
    "_",
    "*",
    "admin ",
    " admin",
    "ADMIN",
    "\u0430dmin",
    "a" * 10_000,
    "admin\n",
    "",
    "\ud7ff",
    "admin\\",
]


def test_console_authentication_bypass(platform_env: dict[str, str], db_url: str, reliability: Reliability) -> None:
    """No page without a login; crafted session states, SQL-ish names and wrong passwords are refused
    (slowly, then locked); a viewer's or a demoted user's forced clicks launch and stop nothing."""
    auth.create_user(ADMIN, "admin", PASSWORD, Role.admin)
    auth.create_user(ADMIN, "viv", PASSWORD, Role.viewer)
    auth.create_user(ADMIN, "otto", PASSWORD, Role.operator)
    job_id = queue.submit(OPERATOR, "selftest", {"steps": 1})
    outcomes: Counter[Outcome] = Counter()
    views = sorted((REPO_ROOT / "ui" / "views").glob("*.py"))

    def shows_nothing(at: AppTest) -> bool:
        return not at.exception and not at.dataframe and not at.metric and not at.button and not at.json

    # 1. Every page without a login, and with crafted identities in the session.
    crafted: list[Any] = [
        None,
        {"username": "admin", "role": "admin"},
        "admin",
        ("admin", "admin"),
        auth.Identity("eve", "superuser"),
        auth.Identity("admin", Role.admin.value + " "),
    ]  # type: ignore[arg-type]
    for page in [REPO_ROOT / "ui" / "app.py", *views]:
        for state in crafted if page.name in ("app.py", "jobs.py", "admin.py") else crafted[:1]:
            at = AppTest.from_file(str(page), default_timeout=30)
            if state is not None:
                at.session_state["identity"] = state
            at.run()
            assert not at.exception, (page.name, state, at.exception)
            if page.name == "app.py":
                assert [t.value for t in at.title] == ["posttrain"] and not at.dataframe, (state, at.title)
            else:
                assert shows_nothing(at), (page.name, state)
            outcomes["refused"] += 1

    # 2. SQL-ish and odd usernames, and wrong passwords: refused with one message, slowed, then locked.
    def attempt(name: str) -> Outcome:
        started = time.monotonic()
        try:
            auth.authenticate(name, PASSWORD)
        except auth.AuthError as exc:
            assert str(exc) == auth.REFUSED, (name[:40], exc)
            assert time.monotonic() - started >= auth.FAILURE_DELAY_S  # every failure is slowed
            return "refused"
        raise AssertionError(f"{name[:40]!r} logged in")

    with ThreadPoolExecutor(4) as pool:  # concurrently: the delays overlap, as an attacker's would
        outcomes.update(pool.map(attempt, SQLISH))
    with session(db_url, read_only=True) as s:
        assert sorted(u.username for u in s.exec(select(User))) == ["admin", "otto", "viv"]
    for _ in range(auth.FREE_FAILURES):
        with pytest.raises(auth.AuthError, match="wrong username or password"):
            auth.authenticate("admin", "admin' OR '1'='1")
        outcomes["refused"] += 1
    with pytest.raises(auth.AuthError) as locked:
        auth.authenticate("admin", PASSWORD)
    assert str(locked.value) == auth.REFUSED  # locked, and saying so would tell that "admin" exists
    outcomes["refused"] += 1
    at = AppTest.from_file(str(REPO_ROOT / "ui" / "app.py"), default_timeout=30).run()
    for name, password in [
        ("admin' --", PASSWORD),
        ("admin\x00", PASSWORD),
        ("a" * 10_000, PASSWORD),
        ("admin", "' OR '1'='1"),
        ("admin", ""),
    ]:
        at.text_input(key="login_username").set_value(name)
        at.text_input(key="login_password").set_value(password)
        at.button[0].click().run()
        assert not at.exception and at.error and "identity" not in at.session_state, name
        outcomes["refused"] += 1
    assert auth.authenticate("viv", PASSWORD).role is Role.viewer  # others are unaffected
    outcomes["accepted"] += 1

    # 3. A viewer forcing the actions the pages offer operators; an operator demoted or disabled mid-session.
    jobs_page = str(REPO_ROOT / "ui" / "views" / "jobs.py")
    at = login_as(AppTest.from_file(jobs_page, default_timeout=30), "operator", "otto").run()
    auth.set_role(ADMIN, "otto", Role.viewer)  # demoted while the page is open
    at.button[0].click().run()
    assert not at.success and [j.id for j in queue.list_jobs()] == [job_id], "a demoted operator launched a job"
    outcomes["refused"] += 1
    at.number_input(key="inspect_job_id").set_value(job_id).run()
    assert not [b for b in at.button if b.key == f"cancel_{job_id}"]
    outcomes["refused"] += 1
    with session(db_url) as s:
        user = s.exec(select(User).where(User.username == "viv")).one()
        user.disabled = True
        s.add(user)
    at = login_as(AppTest.from_file(str(REPO_ROOT / "ui" / "app.py"), default_timeout=30), "viewer", "viv").run()
    assert not at.exception and "identity" not in at.session_state and not at.metric, "a disabled user stayed in"
    outcomes["refused"] += 1
    assert queue.get_job(job_id).status is JobStatus.queued
    with session(db_url, read_only=True) as s:
        actions = [a.action for a in s.exec(select(AuditLog))]
    assert "job.cancel" not in actions and actions.count("job.submit") == 1
    record(reliability, "console_auth", outcomes)
