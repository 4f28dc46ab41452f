"""Documents: upload many files, follow their preprocessing live, and look at a page with its layout."""

from __future__ import annotations

import pandas as pd
import streamlit as st
from sqlalchemy import func
from sqlmodel import col, select

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import DocumentStatus, Page, Role
from posttrain.platform.documents import add_document, get_chunks, get_pages, list_documents
from posttrain.preprocess.errors import PreprocessError
from posttrain.ui.common import can, follow, guard_platform, me, show_flash
from posttrain.ui.page_images import page_image

PAGE_SIZE = 20
PENDING = (DocumentStatus.uploaded, DocumentStatus.processing)  # still being preprocessed

st.title("Documents")
st.caption("Upload PDFs and images; each is preprocessed by a job (pages, layout, tables, OCR, renders, chunks).")
if not guard_platform():
    st.stop()
show_flash()


def status_text(status: DocumentStatus) -> str:
    """A document's status as a table shows it: the plain word, which every font has (an emoji
    needs a colour-emoji font, and Debian's Chromium draws a box without one)."""
    return status.value


def upload(files: list, password: str) -> None:
    """Store each file and queue its preprocessing; one message per file."""
    for f in files:
        try:
            added = add_document(me(), f.getvalue(), filename=f.name, password=password or None)
        except PermissionError as exc:
            st.error(str(exc))
            return
        except (PreprocessError, ValueError, OSError) as exc:
            st.error(f"{f.name}: {exc}")
            continue
        if added.created:
            st.success(f"{f.name}: stored as document {added.document.id}, preprocess job {added.job_id} queued.")
        else:
            st.info(
                f"{f.name}: the same content is already document {added.document.id} ({added.document.status.value})."
            )


st.subheader("Upload")
if can(Role.operator):
    files = st.file_uploader(
        "Documents (PDF, PNG, JPEG, TIFF, WebP, BMP)", accept_multiple_files=True, key="doc_upload",
        help="The file's content decides its type, not its name.",
    )  # fmt: skip
    password = st.text_input("PDF password (optional, for encrypted PDFs)", type="password", key="doc_password")
    if st.button("Upload and preprocess", type="primary", key="doc_upload_go", disabled=not files):
        upload(list(files or []), password)
else:
    st.info("Only operators can upload documents; you can browse them below.")


@st.fragment(run_every="3s")
def document_list() -> None:
    page = int(st.number_input("List page", min_value=1, value=1, step=1, key="docs_page"))
    rows = list_documents(limit=PAGE_SIZE + 1, offset=PAGE_SIZE * (page - 1))
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    if not rows:
        st.info("No documents yet." if page == 1 else "No documents on this page.")
        return
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "id": d.id,
                    "file": d.filename,
                    "kind": d.kind,
                    "status": status_text(d.status),
                    "pages": d.page_count,
                    "size (KB)": round(d.size_bytes / 1024, 1),
                    "active content": ", ".join((d.meta or {}).get("active_content") or []),
                    "updated": d.updated_at,
                    "error": d.error or "",
                }
                for d in rows
            ]  # fmt: skip
        ),
        hide_index=True,
        width="stretch",
        column_config={"updated": st.column_config.DatetimeColumn("updated (UTC)", format="YYYY-MM-DD HH:mm:ss")},
    )
    failed = [d for d in rows if d.status is DocumentStatus.failed]
    for d in failed:
        st.error(f"Document {d.id} ({d.filename}) failed: {d.error or 'no message'}", icon=":material/error:")
    st.caption(f"Page {page}" + (", more on the next page." if more else "."))


st.subheader("Documents")
document_list()


def documents_state(documents: list) -> tuple:
    """What the page viewer shows depends on: each document's status and page count, and for a document
    still being preprocessed, how many of its pages are stored so far."""
    pending = [d.id for d in documents if d.status in PENDING]
    stored: dict[int, int] = {}
    if pending:
        with session(read_only=True) as s:
            stored = dict(s.exec(select(Page.document_id, func.count()).where(col(Page.document_id).in_(pending))
                                 .group_by(Page.document_id)).all())  # fmt: skip
    return tuple((d.id, d.status.value, d.page_count, stored.get(d.id, 0)) for d in documents)


st.subheader("Page viewer")
listed = list_documents(limit=500)
pending = [d for d in listed if d.status in PENDING]
follow(
    "documents_followed",
    lambda: documents_state(list_documents(limit=500)),
    active=bool(pending),
    drawn=documents_state(listed),
    note=lambda: st.caption(
        "Being preprocessed: " + ", ".join(f"#{d.id} {d.filename} ({d.status.value})" for d in pending)
        + ". Pages show here as they are stored; this viewer follows the job live, no reload needed."
    ),
)  # fmt: skip
documents = [d for d in listed if d.page_count > 0 and d.status is not DocumentStatus.failed]
if not documents:
    if any(d.status in PENDING for d in listed):
        st.info("No preprocessed pages yet: they show here as soon as the preprocess job has stored them.")
    else:
        st.info("No preprocessed pages yet: upload a document and wait for its job.")
    st.stop()
labels = {d.id: f"#{d.id} {d.filename} ({d.status.value}, {d.page_count} pages)" for d in documents}
doc_id = st.selectbox("Document", list(labels), format_func=labels.get, key="viewer_doc")
active = next((d.meta or {}).get("active_content") for d in documents if d.id == doc_id)
if active:
    st.warning(
        f"This file carries active content ({', '.join(active)}). Nothing in it was run; only its text, "
        "layout and renders were read. Treat the original with care."
    )
pages = get_pages(int(doc_id))  # type: ignore[arg-type]
if not pages:
    st.info("No page is stored yet; the preprocess job is still running.")
    st.stop()
numbers = [p.page_no for p in pages]
page_no = st.selectbox("Page", numbers, format_func=lambda n: f"page {n + 1}", key="viewer_page")
page = next(p for p in pages if p.page_no == page_no)

t1, t2, t3, t4 = st.columns(4)
show_blocks = t1.toggle("Text blocks", value=True, key="show_blocks")
show_tables = t2.toggle("Tables", value=True, key="show_tables")
show_words = t3.toggle("Words (OCR in pink)", value=False, key="show_words")
full_width = t4.toggle(
    "Page across the full width",
    value=False,
    key="viewer_full_width",
    help="The page image at about twice the size, its Markdown below it. The image's own button (top right, on "
    "hover) shows it full screen.",
)

layout = page.layout or {}
counts = page.token_counts or {}
m1, m2, m3, m4 = st.columns(4)
m1.metric("Visual tokens", page.visual_tokens if page.visual_tokens is not None else "n/a")
m2.metric("Text tokens", counts.get("text", "n/a"))
m3.metric("Markdown tokens", counts.get("markdown", "n/a"))
m4.metric(
    "Source", page.source + (f" ({layout.get('ocr_confidence'):.0f}% conf.)" if layout.get("ocr_confidence") else "")
)
words = counts.get("layout")
st.caption(
    f"Token counts by {counts.get('tokenizer', 'an unknown tokenizer')}"
    + (f"; {words:,} positioned words in the layout" if isinstance(words, int) else "")
    + (f"; the page image as the vision encoder sizes it: {page.visual_tokens:,} tokens" if page.visual_tokens else "")
)

left, right = (st.container(), st.container()) if full_width else st.columns(2)
with left:
    image = page_image(page, blocks=show_blocks, tables=show_tables, words=show_words)
    drawn = [name for name, on, n in (("blocks", show_blocks, len(layout.get("blocks", []))),
                                      ("tables", show_tables, len(layout.get("tables", []))),
                                      ("words", show_words, len(layout.get("words", [])))) if on and n]  # fmt: skip
    if image is None:
        st.info("This page has no render: preprocess with render_dpi set to see it.")
    else:
        caption = f"page {page.page_no + 1}, {image.width}x{image.height} px; boxes: " + (
            ", ".join(f"{len(layout.get(name, []))} {name}" for name in drawn) or "none")  # fmt: skip
        st.image(image, caption=caption, width="stretch")
with right:
    st.markdown("**Markdown**")
    with st.container(height=700):
        st.markdown(page.markdown or "_(no text on this page)_")

st.subheader("Chunks on this page")
chunks = [c for c in get_chunks(int(doc_id)) if any(p.get("page") == page.page_no + 1 for p in c.provenance)]  # type: ignore[arg-type]
if not chunks:
    st.info("No chunk starts or ends on this page.")
else:
    st.dataframe(
        pd.DataFrame(
            [
                {"seq": c.seq, "tokens": c.token_count, "headings": " › ".join(c.heading_path), "text": c.text[:300]}
                for c in chunks
            ]  # fmt: skip
        ),
        hide_index=True,
        width="stretch",
    )
