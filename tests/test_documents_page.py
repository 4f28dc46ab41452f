"""The Documents page (upload, live list, page viewer) and the Tasks page's source-page view, run by AppTest."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import OPERATOR, REPO_ROOT, login_as, run_worker_until_idle, start_worker
from sqlalchemy import delete
from sqlmodel import col
from streamlit.testing.v1 import AppTest

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Chunk, Document, DocumentStatus, JobStatus, Page
from posttrain.platform.documents import add_document, get_document, get_pages, list_documents
from posttrain.platform.jobs import queue
from posttrain.platform.tasks import store
from posttrain.platform.tasks.builders import build_document_tasks

LTNEWS07 = Path("/usr/share/doc/texlive-doc/latex/base/ltnews07.pdf")
PAGE = str(REPO_ROOT / "ui" / "views" / "documents.py")


@pytest.mark.slow
def test_upload_preprocess_view_toggles_and_task_source(platform_env: dict[str, str]) -> None:
    at = login_as(AppTest.from_file(PAGE, default_timeout=60)).run()
    assert not at.exception and at.title[0].value == "Documents"
    at.file_uploader(key="doc_upload").set_value(
        [
            ("ltnews07.pdf", LTNEWS07.read_bytes(), "application/pdf"),
            ("notes.pdf", b"just some text, no PDF here", "application/pdf"),
        ]
    ).run()
    at.button(key="doc_upload_go").click().run()
    assert not at.exception
    assert any("ltnews07.pdf" in s.value and "preprocess job" in s.value for s in at.success)
    assert any(
        "notes.pdf" in e.value and "pdf" in e.value.lower() for e in at.error
    )  # the clear message of the failure
    docs = {d.filename: d for d in list_documents()}
    assert docs["notes.pdf"].status is DocumentStatus.failed and docs["ltnews07.pdf"].status is DocumentStatus.uploaded
    (job,) = queue.list_jobs()
    assert job.kind == "preprocess" and job.config["document_id"] == docs["ltnews07.pdf"].id
    listed = at.dataframe[0].value
    assert set(listed["file"]) == {"ltnews07.pdf", "notes.pdf"} and any("failed" in s for s in listed["status"])
    assert any("notes.pdf" in e.value and "failed" in e.value for e in at.error)  # the list names the failed one

    proc = start_worker(platform_env, "--exit-when-idle")
    assert proc.wait(timeout=300) == 0
    assert queue.get_job(job.id).status is JobStatus.succeeded  # type: ignore[arg-type]

    at = login_as(AppTest.from_file(PAGE, default_timeout=60)).run()
    assert not at.exception
    assert at.selectbox(key="viewer_doc").value == docs["ltnews07.pdf"].id
    (image,) = at.image
    assert "blocks" in image.captions[0] and "tables" not in image.captions[0]  # the page has blocks, no table
    assert any("LATEX News" in m.value for m in at.markdown)
    assert any(m.label == "Visual tokens" and m.value not in ("n/a", "0") for m in at.metric)
    with_boxes = image.value[0]
    at.toggle(key="show_blocks").set_value(False).run()
    assert at.image[0].captions[0].endswith("boxes: none") and at.image[0].value[0] != with_boxes
    at.toggle(key="show_words").set_value(True).run()
    assert "words" in at.image[0].captions[0]
    beside = len(at.columns)  # the page and its Markdown in two columns
    at.toggle(key="viewer_full_width").set_value(True).run()
    assert not at.exception and len(at.columns) == beside - 2 and "words" in at.image[0].captions[0]
    assert any("LATEX News" in m.value for m in at.markdown)  # below the page now
    assert at.dataframe[-1].value["tokens"].min() > 0  # chunks with token counts

    # a task built from the document shows its source page with the box highlighted
    spec = next(s for s in build_document_tasks(docs["ltnews07.pdf"].id, kinds=["span_recovery"], max_per_document=1))  # type: ignore[arg-type]
    store.save_tasks("docs", [spec], source="documents")
    tasks = login_as(AppTest.from_file(str(REPO_ROOT / "ui" / "views" / "tasks.py"), default_timeout=60)).run()
    assert not tasks.exception
    (source,) = tasks.image
    assert "page 1" in source.captions[0] and "ltnews07.pdf" in source.captions[0]
    assert get_pages(docs["ltnews07.pdf"].id)[0].image_path  # type: ignore[arg-type]

    with session() as s:  # the document is deleted: the task view says so instead of failing
        s.exec(delete(Chunk).where(col(Chunk.document_id) == docs["ltnews07.pdf"].id))
        s.exec(delete(Page).where(col(Page.document_id) == docs["ltnews07.pdf"].id))
        s.exec(delete(Document).where(col(Document.id) == docs["ltnews07.pdf"].id))
    tasks.run()
    assert not tasks.exception and not tasks.image
    assert any("no longer exists" in w.value for w in tasks.warning)


def test_viewer_cannot_upload(platform_env: dict[str, str]) -> None:
    at = login_as(AppTest.from_file(PAGE, default_timeout=60), role="viewer").run()
    assert not at.exception
    assert len(at.file_uploader) == 0 and not [b for b in at.button if b.key == "doc_upload_go"]
    assert any("Only operators" in i.value for i in at.info)


@pytest.mark.slow
def test_page_viewer_follows_preprocessing_without_a_reload(platform_env: dict[str, str], browser_timers) -> None:  # type: ignore[no-untyped-def]
    """The page is opened while the document is still queued; its job then runs. The browser stays on the
    page and nobody reloads it: only the page's own timers run, and the viewer shows the pages."""
    doc = add_document(OPERATOR, LTNEWS07.read_bytes(), filename="ltnews07.pdf").document
    at = login_as(AppTest.from_file(PAGE, default_timeout=60)).run()
    assert not at.exception
    assert any(i.value.startswith("No preprocessed pages yet") for i in at.info)
    assert any(c.value.startswith(f"Being preprocessed: #{doc.id} ltnews07.pdf (uploaded)") for c in at.caption)

    run_worker_until_idle(platform_env)
    assert get_document(doc.id).status is DocumentStatus.ready  # type: ignore[arg-type]

    at = browser_timers.tick(at)  # the timers fire; the viewer sees the document is ready and draws it
    assert at.selectbox(key="viewer_doc").value == doc.id
    assert not any(i.value.startswith("No preprocessed pages yet") for i in at.info)
    assert any("LATEX News" in m.value for m in at.markdown) and at.image
    assert at.dataframe[0].value["status"].tolist() == ["ready"]  # the plain word: no emoji to draw as a box
    assert not any(c.value.startswith("Being preprocessed") for c in at.caption)
