"""Documents through the platform: ingest, the preprocess job, pages and chunks in the database."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import OPERATOR, start_worker
from test_cli import cli

from posttrain.platform.db.models import DocumentStatus, JobStatus
from posttrain.platform.documents import add_document, get_chunks, get_document, get_pages, list_documents
from posttrain.platform.jobs import queue
from posttrain.preprocess.errors import PreprocessError

LTNEWS = sorted(Path("/usr/share/doc/texlive-doc/latex/base").glob("ltnews*.pdf"))
SCAN = Path("/usr/share/doc/opencv-doc/examples/data/imageTextN.png")


@pytest.mark.requires("tesseract")
def test_pdf_and_scan_end_to_end(platform_env: dict[str, str], tmp_path: Path) -> None:
    assert LTNEWS and SCAN.is_file(), (
        "Debian packages texlive-latex-base-doc and opencv-doc are required (make test installs them)"
    )
    pdf = add_document(OPERATOR, LTNEWS[0])
    again = add_document(OPERATOR, LTNEWS[0].read_bytes(), filename="copy.pdf")
    assert pdf.created and not again.created and again.document.id == pdf.document.id  # same content, one document
    scan = add_document(OPERATOR, SCAN)
    proc = start_worker(platform_env, "--exit-when-idle")
    assert proc.wait(timeout=600) == 0
    for added in (pdf, scan):
        job = queue.get_job(added.job_id)  # type: ignore[arg-type]
        assert job.status is JobStatus.succeeded, job.error
        doc = get_document(added.document.id)  # type: ignore[arg-type]
        assert doc.status is DocumentStatus.ready and doc.page_count >= 1
        pages = get_pages(doc.id)  # type: ignore[arg-type]
        assert len(pages) == doc.page_count
        first = pages[0]
        assert first.layout["blocks"] and first.markdown and first.token_counts["markdown"] > 0
        assert first.image_path and Path(first.image_path).is_file() and first.visual_tokens and first.visual_tokens > 0
        assert get_chunks(doc.id)  # type: ignore[arg-type]
    scan_page = get_pages(scan.document.id)[0]  # type: ignore[arg-type]
    assert scan_page.source == "ocr" and scan_page.layout["ocr_confidence"] is not None
    pdf_doc = get_document(pdf.document.id)  # type: ignore[arg-type]
    assert "metadata" in pdf_doc.meta


def test_bad_input_is_a_failed_document_and_touches_nothing_else(platform_env: dict[str, str], tmp_path: Path) -> None:
    good = add_document(OPERATOR, SCAN)
    bogus = tmp_path / "report.pdf"
    bogus.write_bytes(b"this is not a pdf at all, just text pretending")
    with pytest.raises(PreprocessError):
        add_document(OPERATOR, bogus)
    truncated = tmp_path / "cut.pdf"
    truncated.write_bytes(LTNEWS[0].read_bytes()[:3000])
    cut = add_document(OPERATOR, truncated)
    proc = start_worker(platform_env, "--exit-when-idle")
    assert proc.wait(timeout=600) == 0
    docs = {d.filename: d for d in list_documents()}
    assert docs["report.pdf"].status is DocumentStatus.failed and "pdf" in (docs["report.pdf"].error or "").lower()
    assert docs["cut.pdf"].status is DocumentStatus.failed and docs["cut.pdf"].error
    assert queue.get_job(cut.job_id).error_cause == "bad_input"  # type: ignore[arg-type]
    assert get_document(good.document.id).status is DocumentStatus.ready  # type: ignore[arg-type]


def test_cli_docs_add_and_list(platform_env: dict[str, str], tmp_path: Path) -> None:
    evil = tmp_path / "x.png"
    shutil.copy(SCAN, evil)
    result = cli(platform_env, "docs", "add", str(evil), str(tmp_path / "missing.pdf"))
    assert result.returncode == 2
    assert "queued preprocess job" in result.stdout and "missing.pdf" in result.stderr
    listed = cli(platform_env, "docs", "list")
    assert "x.png" in listed.stdout
