"""Task builders from documents: real PDFs through the real preprocess job, tasks checked by `verify`."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pymupdf
import pytest
from conftest import OPERATOR, REPO_ROOT, login_as, run_worker_until_idle, start_worker
from required_parts import require
from sqlalchemy import delete
from sqlmodel import col, select
from streamlit.testing.v1 import AppTest

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Chunk, Document, JobStatus, Page
from posttrain.platform.documents import add_document
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import JobConfigError
from posttrain.platform.tasks import store
from posttrain.platform.tasks.builders import DocumentBuildError, build_document_tasks, span_recovery_example
from posttrain.platform.verifiers import verify_batch

USERGUIDE = Path("/usr/share/doc/python-reportlab-doc/reportlab-userguide.pdf")
LTNEWS07 = Path("/usr/share/doc/texlive-doc/latex/base/ltnews07.pdf")
# pages of the user guide with ruled tables: a 3-column grid with a header row and row labels
# (PDF page 55) and two-column property tables (pages 107 and 117), plus running text (page 5)
USERGUIDE_PAGES = [4, 54, 106, 116]


def guide_excerpt(tmp_path: Path) -> Path:
    """Four real pages of the ReportLab user guide (the whole guide takes minutes to preprocess here)."""
    require("document samples")
    src = pymupdf.open(USERGUIDE)
    out = pymupdf.open()
    for number in USERGUIDE_PAGES:
        out.insert_pdf(src, from_page=number, to_page=number)
    path = tmp_path / "reportlab-userguide-excerpt.pdf"
    out.save(path)
    return path


GLPK = Path("/usr/share/doc/glpk-doc/glpk.pdf")
GMPL = Path("/usr/share/doc/glpk-doc/gmpl.pdf")


def preprocessed_page(document: Path, number: int, tmp_path: Path, env: dict[str, str]) -> tuple[int, dict]:
    """One page of a real manual, uploaded alone and preprocessed by the real job: its document's id and layout."""
    require("document samples")
    page = pymupdf.open()
    page.insert_pdf(pymupdf.open(document), from_page=number - 1, to_page=number - 1)
    path = tmp_path / f"{document.stem}-page-{number}.pdf"
    page.save(path)
    added = add_document(OPERATOR, path)
    run_worker_until_idle(env)
    assert queue.get_job(added.job_id).status is JobStatus.succeeded  # type: ignore[arg-type]
    with session() as s:
        (stored,) = s.exec(select(Page).where(Page.document_id == added.document.id)).all()
    return added.document.id, stored.layout  # type: ignore[return-value]


def test_a_rule_only_table_gives_table_lookup_tasks(platform_env: dict[str, str], tmp_path: Path) -> None:
    """GLPK's manual sets its tables with one rule under the header and no vertical edge (page 21: Type / Bounds /
    Comment), which find_tables' line strategy cannot see. Through the real preprocess job the page keeps the table,
    cell by cell, and the builder asks about its cells; the references verify, wrong answers do not."""
    document, layout = preprocessed_page(GLPK, 21, tmp_path, platform_env)
    (table,) = layout["tables"]
    assert (table["rows"], table["cols"]) == (6, 3) and table["header"] == ["Type", "Bounds", "Comment"]
    cell = {(c["row"], c["col"]): c["text"] for c in table["cells"]}
    assert cell[(2, 0)] == "GLP_LO" and cell[(2, 2)] == "Variable with lower bound" and cell[(5, 2)] == "Fixed variable"
    specs = build_document_tasks(document, kinds=["table_lookup"], max_per_document=50, seed=1)
    asked = {(s.metadata["row"], s.metadata["column"]): s.verifier.spec["answers"][0] for s in specs}
    assert asked[("GLP_UP", "Comment")] == "Variable with upper bound", asked
    assert asked[("GLP_DB", "Comment")] == "Double-bounded variable", asked
    right = verify_batch(specs, [s.reference or "" for s in specs])
    assert all(v.passed for v in right)
    wrong = verify_batch(specs, [wrong_answer(s) for s in specs])
    assert not any(v.passed for v in wrong)


def test_an_unruled_two_column_table_keeps_its_hanging_lines_and_gives_field_tasks(
    platform_env: dict[str, str], tmp_path: Path
) -> None:
    """GMPL's manual sets its built-in functions as two columns with no rule at all (page 14: ``abs(x)`` | "|x|,
    absolute value of x"), a long meaning running on under its own column. Through the real preprocess job the page
    keeps one two-column table of all 27 functions, each wrapped meaning joined to its row, and field extraction asks
    for the meanings; the references verify, wrong answers do not."""
    document, layout = preprocessed_page(GMPL, 14, tmp_path, platform_env)
    (table,) = layout["tables"]
    assert (table["rows"], table["cols"], table["header"]) == (27, 2, [])
    cell = {(c["row"], c["col"]): c["text"] for c in table["cells"]}
    meaning = {cell[(r, 0)]: cell[(r, 1)] for r in range(table["rows"])}
    assert meaning["abs(x)"] == "|x|, absolute value of x"
    assert meaning["atan(y, x)"].endswith("are used to determine the quadrant of the resultant value")
    assert meaning["gmtime()"].endswith("Universal Time (for details see Section B.1, page 56)")
    assert meaning["max(x1, x2, . . . , xn)"] == "the largest of values x1, x2, . . . , xn"  # an ellipsis, no leaders
    specs = build_document_tasks(document, kinds=["field_extraction"], max_per_document=50, seed=1)
    asked = {k: v for spec in specs for k, v in spec.verifier.spec["expected"].items()}
    assert (
        asked.get("abs(x)") == "|x|, absolute value of x" and asked.get("round(x)") == "rounding x to nearest integer"
    )
    right = verify_batch(specs, [s.reference or "" for s in specs])
    assert all(v.passed for v in right)
    wrong = verify_batch(specs, [wrong_answer(s) for s in specs])
    assert not any(v.passed for v in wrong)


@pytest.mark.parametrize(
    ("document", "number", "what"),
    [
        (GMPL, 3, "a table of contents: numbers, titles and page numbers behind dot leaders"),
        (USERGUIDE, 6, "bulleted lists"),
        (Path("/usr/share/doc/glpk-doc/graphs.pdf"), 60, "code: statements and their comments in a typewriter font"),
        (USERGUIDE, 73, "an example paragraph beside the style that set it: two blocks side by side"),
        (GLPK, 54, "a solver's printed log"),
    ],
)
def test_text_set_in_columns_that_is_no_table_gives_none(document: Path, number: int, what: str) -> None:
    from posttrain.preprocess.tables import aligned_tables

    require("document samples")
    with pymupdf.open(document) as doc:
        assert aligned_tables(doc[number - 1]) == [], what


def wrong_answer(spec) -> str:  # type: ignore[no-untyped-def]
    if spec.verifier.kind == "json_schema":
        expected = dict(spec.verifier.spec["expected"])
        first = next(iter(expected))
        expected[first] = expected[first] + " (not on the page)"
        return json.dumps(expected)
    return spec.reference.replace("Answer: ", "Answer: not ", 1)


@pytest.mark.slow
def test_tasks_from_real_pdfs_verify_their_references_and_build_job_end_to_end(
    platform_env: dict[str, str], tmp_path: Path
) -> None:
    guide = add_document(OPERATOR, guide_excerpt(tmp_path))
    news = add_document(OPERATOR, LTNEWS07)
    proc = start_worker(platform_env, "--exit-when-idle")
    assert proc.wait(timeout=300) == 0
    for added in (guide, news):
        job = queue.get_job(added.job_id)  # type: ignore[arg-type]
        assert job.status is JobStatus.succeeded, job.error

    guide_specs = build_document_tasks(guide.document.id, vision=True, max_per_document=40, seed=7)  # type: ignore[arg-type]
    news_specs = build_document_tasks(news.document.id, vision=True, max_per_document=12, seed=7)  # type: ignore[arg-type]
    per_domain = collections.Counter(s.domain for s in guide_specs + news_specs)
    for base in ("doc.table_lookup", "doc.fields", "doc.span"):
        assert per_domain[base] >= 1 and per_domain[base] == per_domain[base + ".vision"], per_domain
    news_fields = [s for s in news_specs if s.domain == "doc.fields"]
    assert news_fields and news_fields[0].verifier.spec["expected"]["URL"] == "http://www.tug.org/"
    lookups = [s for s in guide_specs if s.domain == "doc.table_lookup"]
    assert lookups and all(
        s.prompt[0].content.count("<page>") == 1 for s in lookups if s.metadata["modality"] == "text"
    )
    for s in lookups:  # the answer is a cell of the named row, as the page reads it
        assert (
            s.metadata["row"] in s.prompt_text
            and s.verifier.spec["answers"][0] in s.prompt_text
            or s.metadata["modality"] == "vision"
        )

    specs = guide_specs + news_specs
    right = verify_batch(specs, [s.reference or "" for s in specs])
    assert [(s.task_id, v.score) for s, v in zip(specs, right) if v.score != 1.0 or not v.passed] == []
    wrong = verify_batch(specs, [wrong_answer(s) for s in specs])
    assert [s.task_id for s, v in zip(specs, wrong) if v.score >= 1.0 or v.passed] == []
    # field extraction gives partial credit by field
    partial = [v.score for s, v in zip(specs, wrong) if s.verifier.kind == "json_schema"]
    assert partial and all(0 < score < 1 for score in partial)

    page_count = {guide.document.id: len(USERGUIDE_PAGES), news.document.id: pymupdf.open(LTNEWS07).page_count}
    for spec in specs:
        prov = spec.provenance
        assert set(prov) >= {"document_id", "page", "bbox", "filename"} and len(prov["bbox"]) == 4
        assert prov["document_id"] in page_count and 1 <= prov["page"] <= page_count[prov["document_id"]], prov
        assert (
            prov["pages_from"] == 1 and f"page {prov['page']}" in spec.prompt_text
        )  # the prompt's page, numbered alike
        if spec.domain.endswith(".vision"):
            parts = spec.prompt[0].content
            assert spec.metadata["modality"] == "vision" and isinstance(parts, list)
            assert parts[0]["type"] == "image_url" and parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
            assert spec.metadata["visual_tokens"] > 0
        else:
            assert spec.metadata["modality"] == "text" and "<page>" in spec.prompt_text
    # passage_chars: the passage around each question's evidence instead of the whole page; the evidence is still
    # checked against the whole page, so the references score 1 and a quote from elsewhere on the page still counts
    short = build_document_tasks(
        news.document.id, kinds=["span_recovery"], max_per_document=12, seed=7, passage_chars=300
    )  # type: ignore[arg-type]
    spans = build_document_tasks(news.document.id, kinds=["span_recovery"], max_per_document=12, seed=7)  # type: ignore[arg-type]
    assert [s.task_id for s in short] == [s.task_id for s in spans] and [s.split for s in short] == [
        s.split for s in spans
    ]
    for brief, full in zip(short, spans):
        excerpt = brief.prompt_text.split("<page>\n", 1)[1].split("\n</page>", 1)[0]
        evidence = brief.reference.split('Evidence: "', 1)[1].rsplit('"', 1)[0]  # type: ignore[union-attr]
        assert " ".join(evidence.split()) in excerpt and len(excerpt) <= max(300, len(evidence)) + 1, (
            len(excerpt),
            excerpt,
        )
        assert len(brief.prompt_text) < len(full.prompt_text) and brief.verifier == full.verifier
    assert all(v.score == 1.0 for v in verify_batch(short, [s.reference or "" for s in short]))
    # a preset's worked example is worded as these tasks are: the same excerpt, sentence and term give the same text
    for brief in short:
        reference = brief.reference or ""
        label, evidence = int(reference.rsplit("Page: ", 1)[1]), reference.split('Evidence: "', 1)[1].rsplit('"', 1)[0]
        excerpt = brief.prompt_text.split("<page>\n", 1)[1].split("\n</page>", 1)[0]
        example = span_recovery_example(
            brief.provenance["filename"], label, excerpt, evidence, brief.verifier.spec["answers"][0]
        )
        assert example == (brief.prompt_text, reference)
    with pytest.raises(ValueError, match="one of its terms"):
        span_recovery_example("a.pdf", 1, "It works on Linux today.", "It works on Linux today.", "works")
    # deterministic with a seed
    again = build_document_tasks(guide.document.id, vision=True, max_per_document=40, seed=7)  # type: ignore[arg-type]
    assert [s.model_dump() for s in again] == [s.model_dump() for s in guide_specs]
    other = build_document_tasks(guide.document.id, max_per_document=40, seed=8)  # type: ignore[arg-type]
    assert [s.task_id for s in other] != [s.task_id for s in guide_specs if s.metadata["modality"] == "text"]

    # a ticked kind that makes nothing is named in the build's report, with why (LaTeX News has prose, no grid)
    news_only = queue.submit(
        OPERATOR,
        "build_tasks",
        {"task_set": "news", "source": {"type": "documents", "document_ids": [news.document.id],
                                        "kinds": ["table_lookup", "span_recovery"], "max_per_document": 6}},
    )  # fmt: skip
    run_worker_until_idle(platform_env)
    report = queue.get_job(news_only).result or {}
    assert report["kinds"] == {"table_lookup": 0, "span_recovery": 6}, report
    why = report["kinds_without_tasks"]["table_lookup"]
    assert list(report["kinds_without_tasks"]) == ["table_lookup"] and "pages" in why and "table" in why, why
    at = login_as(AppTest.from_file(str(REPO_ROOT / "ui" / "views" / "tasks.py"), default_timeout=120)).run()
    assert any(f"made no table_lookup tasks: {why}" in w.value for w in at.warning), [w.value for w in at.warning]

    # the build_tasks job with the documents source, through a real worker; a deleted document fails clearly
    good = queue.submit(
        OPERATOR,
        "build_tasks",
        {"task_set": "docs", "source": {"type": "documents", "document_ids": [guide.document.id, news.document.id],
                                        "kinds": ["table_lookup", "field_extraction", "span_recovery"],
                                        "vision": True, "max_per_document": 10, "eval_fraction": 0.3, "seed": 1}},
    )  # fmt: skip
    with session() as s:
        s.exec(delete(Chunk).where(col(Chunk.document_id) == news.document.id))
        s.exec(delete(Page).where(col(Page.document_id) == news.document.id))
        s.exec(delete(Document).where(col(Document.id) == news.document.id))
    gone = queue.submit(
        OPERATOR,
        "build_tasks",
        {"task_set": "gone", "source": {"type": "documents", "document_ids": [news.document.id]}},
    )
    proc = start_worker(platform_env, "--exit-when-idle")
    assert proc.wait(timeout=300) == 0
    job = queue.get_job(good)
    assert job.status is JobStatus.failed and "does not exist" in (job.error or "")  # its second document is gone
    failed = queue.get_job(gone)
    assert failed.status is JobStatus.failed and failed.error_cause == "bad_input"
    assert f"document {news.document.id} does not exist" in (failed.error or "")
    assert [ts.name for ts, _ in store.task_sets()] == ["news"]  # the failed builds wrote nothing

    ok = queue.submit(
        OPERATOR,
        "build_tasks",
        {"task_set": "docs", "source": {"type": "documents", "document_ids": [guide.document.id], "vision": True,
                                        "max_per_document": 10, "eval_fraction": 0.3, "seed": 1}},
    )  # fmt: skip
    proc = start_worker(platform_env, "--exit-when-idle")
    assert proc.wait(timeout=300) == 0
    job = queue.get_job(ok)
    assert job.status is JobStatus.succeeded, job.error
    assert job.result["tasks"] == 20  # type: ignore[index]
    stats = {d.name: d for d in store.domain_stats(task_set="docs")}
    assert {"doc.table_lookup", "doc.fields", "doc.span", "doc.table_lookup.vision"} <= set(stats)
    assert all(d.family == "doc" for d in stats.values())
    stored = store.load_tasks(task_set="docs")
    # exactly round(0.3 * 10) questions held out, each with its vision twin: 6 of the 20 tasks
    assert sum(t.spec.split == "eval" for t in stored) == 6
    verdicts = verify_batch([t.spec for t in stored], [t.spec.reference or "" for t in stored])
    assert all(v.score == 1.0 for v in verdicts)
    assert stored[0].spec.provenance["document_id"] == guide.document.id


def test_documents_source_is_validated_and_unready_documents_are_refused(
    platform_env: dict[str, str], tmp_path: Path
) -> None:
    with pytest.raises(JobConfigError, match="document_ids"):
        queue.submit(OPERATOR, "build_tasks", {"task_set": "x", "source": {"type": "documents", "document_ids": []}})
    with pytest.raises(JobConfigError, match="kinds"):
        queue.submit(
            OPERATOR,
            "build_tasks",
            {"task_set": "x", "source": {"type": "documents", "document_ids": [1], "kinds": ["poems"]}},
        )
    with pytest.raises(DocumentBuildError, match="does not exist"):
        build_document_tasks(12345)
    queued = add_document(OPERATOR, LTNEWS07)  # no worker: still 'uploaded'
    with pytest.raises(DocumentBuildError, match="preprocess job has succeeded"):
        build_document_tasks(queued.document.id)  # type: ignore[arg-type]


def test_span_tasks_skip_ocr_text_read_with_little_confidence() -> None:
    """The same OCR'd sentence gives span tasks when Tesseract read it with confidence, none when it did not."""
    from posttrain.platform.db.models import Page
    from posttrain.platform.tasks.builders import OCR_MIN_CONFIDENCE, normalize_whitespace, span_questions

    sentence = "The Release Team ships version 4 of the Manual to every reader in March each year."
    words = sentence.split()

    def scanned(confidence: float) -> Page:
        boxes = [(10.0 + 40 * i, 10.0, 48.0 + 40 * i, 22.0) for i in range(len(words))]
        layout = {
            "blocks": [{"order": 0, "bbox": [0.0, 0.0, 800.0, 40.0], "text": sentence, "ocr": True}],
            "words": [
                {"text": w, "bbox": list(b), "ocr": True, "confidence": confidence} for w, b in zip(words, boxes)
            ],
            "tables": [],
            "ocr_confidence": confidence,
        }
        return Page(document_id=1, page_no=0, width=800.0, height=600.0, source="ocr", text=sentence, layout=layout)

    read_well, read_badly = scanned(OCR_MIN_CONFIDENCE + 5), scanned(OCR_MIN_CONFIDENCE - 30)
    assert span_questions(read_well, [], normalize_whitespace(read_well.text))
    assert span_questions(read_badly, [], normalize_whitespace(read_badly.text)) == []
