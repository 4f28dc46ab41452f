"""PDF extraction on real Debian documentation PDFs, and the bad-input cases."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pymupdf
import pytest
from conftest import REPO_ROOT

from posttrain.preprocess.errors import (
    CorruptDocument,
    EmptyDocument,
    PageTimeout,
    PasswordRequired,
    TooManyPages,
    WrongPassword,
)
from posttrain.preprocess.models import PageResult
from posttrain.preprocess.options import PreprocessOptions
from posttrain.preprocess.pdf import extract_page
from posttrain.preprocess.pipeline import inspect_document, process_document, process_to_list
from posttrain.preprocess.tables import iou

# Debian packages: texlive-latex-base-doc (LaTeX News is set in two columns), python-reportlab-doc
LTNEWS = Path("/usr/share/doc/texlive-doc/latex/base/ltnews30.pdf")
LTNEWS_ALL = sorted(Path("/usr/share/doc/texlive-doc/latex/base").glob("ltnews[0-9]*.pdf"))
REPORTLAB = Path("/usr/share/doc/python-reportlab-doc/reportlab-userguide.pdf")

FAST = PreprocessOptions(workers=2)


@pytest.fixture(scope="module")
def ltnews_pages() -> list[PageResult]:
    return list(process_document(LTNEWS, FAST))


def test_corpus_is_installed() -> None:
    missing = [str(p) for p in (LTNEWS, REPORTLAB) if not p.exists()]
    assert not missing, f"install the Debian packages texlive-latex-base-doc python-reportlab-doc: {missing}"
    assert len(LTNEWS_ALL) >= 30


def test_info_metadata_and_outline() -> None:
    info = inspect_document(LTNEWS)
    assert info.page_count == 4
    assert info.metadata["producer"].startswith("pdfTeX")
    assert info.outline and info.outline[0].title == "LaTeX-dev formats now available" and info.outline[0].page == 1


def test_spans_have_boxes_sizes_and_flags(ltnews_pages: list[PageResult]) -> None:
    page = ltnews_pages[0]
    assert (page.width, page.height) == (612.0, 792.0)  # US letter
    spans = [s for b in page.blocks for ln in b.lines for s in ln.spans]
    assert len(spans) > 100
    for s in spans:
        x0, y0, x1, y1 = s.bbox
        assert -1 <= x0 <= x1 <= page.width + 1 and -1 <= y0 <= y1 <= page.height + 1
    assert max(s.size for s in spans) > 2 * min(s.size for s in spans)  # the masthead is big
    assert any(s.bold for s in spans) and any(s.italic for s in spans)
    assert page.words and all(0 <= w.block < len(page.blocks) for w in page.words)


def test_two_column_reading_order_left_before_right() -> None:
    """On the two-column LaTeX News pages, all left-column text of a band precedes the right column's."""
    checked = 0
    for path in LTNEWS_ALL[:12]:
        for page in process_document(path, FAST):
            mid = page.width / 2
            body = [b for b in page.blocks if 100 < b.bbox[1] < page.height - 80]
            left = [b for b in body if b.bbox[2] < mid]
            right = [b for b in body if b.bbox[0] > mid]
            spanning = [b for b in body if b.bbox[0] < mid < b.bbox[2]]
            if len(left) < 3 or len(right) < 3 or spanning:
                continue
            assert max(b.order for b in left) < min(b.order for b in right), (path.name, page.page_number)
            text = page.text
            assert text.index(left[-1].text[:30]) < text.index(right[0].text[:30])
            checked += 1
    assert checked >= 5, "expected several two-column pages in LaTeX News"


def test_tables_found_as_cells_and_markdown() -> None:
    """The first labelled tables of the ReportLab guide (bench/tables/labels.json: found by eye, not by a detector)
    come out of the pipeline as tables at the labelled place, with their cells and markdown; a ruled drawing with
    no text in its cells (the guide's margin icons, page 11) is no table."""
    labels = json.loads((REPO_ROOT / "bench" / "tables" / "labels.json").read_text())
    labelled = [t for t in labels["tables"] if t["file"] == str(REPORTLAB) and t["rows"] >= 2][:4]
    assert len(labelled) == 4
    wanted = sorted({t["page"] for t in labelled} | {11})
    pages = {p.page_number: p for p in process_document(REPORTLAB, FAST, pages=wanted)}
    for label in labelled:
        page = pages[label["page"]]
        (table,) = [t for t in page.tables if iou(t.bbox, label["bbox"]) >= 0.5]
        assert table.rows * table.cols >= 2 and len(table.cells) == table.rows * table.cols
        assert table.markdown.startswith("|") and "---|" in table.markdown
        assert "|" in (page.markdown or "")
    assert pages[11].tables == []


def test_table_cues() -> None:
    from posttrain.preprocess.tables import table_cues

    news = pymupdf.open(LTNEWS)
    assert not any(table_cues(p) for p in news)  # no rules at all: find_tables is skipped
    guide = pymupdf.open(REPORTLAB)
    with_tables = [p for p in guide.pages(8, 20) if p.find_tables(use_layout=False).tables]
    assert with_tables and all(table_cues(p) for p in with_tables)
    doc = pymupdf.open()
    page = doc.new_page()
    page.draw_rect(pymupdf.Rect(50, 50, 300, 120))  # one framed box: one cell, never a table
    assert not table_cues(page)
    page.draw_line((50, 85), (300, 85))  # split it: now two cells
    assert table_cues(page)


def test_render_at_configured_dpi() -> None:
    (page,) = process_document(LTNEWS, PreprocessOptions(workers=1, render_dpi=36), pages=[2])
    assert page.render is not None and page.render.png.startswith(b"\x89PNG")
    assert (page.render.width, page.render.height) == (306, 396)


def test_embedded_images_are_listed(tmp_path: Path) -> None:
    doc = pymupdf.open()
    page = doc.new_page()
    pix = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 20, 10), 0)
    pix.clear_with(128)
    page.insert_image(pymupdf.Rect(100, 100, 300, 200), pixmap=pix)
    page.insert_text((72, 72), "A figure follows.")
    result = extract_page(page, PreprocessOptions(ocr="never"))
    assert len(result.images) == 1 and result.images[0].width == 20
    assert result.images[0].bbox == pytest.approx((100, 100, 300, 200), abs=0.5)


def test_progress_callback_and_json(ltnews_pages: list[PageResult]) -> None:
    seen = []
    pages = list(process_document(LTNEWS, FAST, progress=seen.append))
    assert [p.done for p in seen] == [1, 2, 3, 4] and seen[-1].total == 4
    again = PageResult.model_validate_json(pages[0].model_dump_json())
    assert again.text == pages[0].text and again.words[0] == pages[0].words[0]


# ---------- bad input ----------


def test_encrypted_pdf_needs_the_right_password(tmp_path: Path) -> None:
    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), "secret")
    path = tmp_path / "locked.pdf"
    doc.save(path, encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw="open-sesame", owner_pw="owner")
    with pytest.raises(PasswordRequired, match="encrypted; give its password"):
        inspect_document(path)
    with pytest.raises(WrongPassword, match="wrong"):
        inspect_document(path, PreprocessOptions(password="nope"))
    (page,) = process_document(path, PreprocessOptions(password="open-sesame", workers=1))
    assert "secret" in page.text


def test_truncated_pdf_is_repaired(tmp_path: Path) -> None:
    data = LTNEWS.read_bytes()
    cut = tmp_path / "cut.pdf"
    cut.write_bytes(data[:-300])  # xref and trailer lost: MuPDF rebuilds them
    info, pages = process_to_list(cut, FAST)
    assert info.repaired and len(pages) == 4 and all(p.words for p in pages)


def test_badly_truncated_pdf_is_a_clear_error(tmp_path: Path) -> None:
    data = LTNEWS.read_bytes()
    cut = tmp_path / "cut.pdf"
    cut.write_bytes(data[: len(data) // 3])
    with pytest.raises((CorruptDocument, EmptyDocument), match="check the file|re-export"):
        process_to_list(cut, FAST)


def test_garbage_pdf_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "junk.pdf"
    path.write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 20)
    with pytest.raises((CorruptDocument, EmptyDocument)):
        inspect_document(path)


def test_zero_pages(tmp_path: Path) -> None:
    path = tmp_path / "empty.pdf"
    body = b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n2 0 obj<</Type/Pages/Kids[]/Count 0>>endobj\n"
    xref = len(body)
    path.write_bytes(
        body
        + b"xref\n0 3\n0000000000 65535 f \n0000000009 00000 n \n0000000052 00000 n \n"
        + b"trailer<</Size 3/Root 1 0 R>>\nstartxref\n"
        + str(xref).encode()
        + b"\n%%EOF\n"
    )
    with pytest.raises(EmptyDocument, match="no pages"):
        inspect_document(path)


def test_page_limit() -> None:
    with pytest.raises(TooManyPages, match="4 pages, over the limit of 2"):
        list(process_document(LTNEWS, PreprocessOptions(max_pages=2)))


def test_slow_page_times_out_without_hanging(tmp_path: Path) -> None:
    doc = pymupdf.open()
    page = doc.new_page()
    shape = page.new_shape()
    for i in range(0, 400):  # a dense ruled grid: find_tables grinds on it
        shape.draw_line((20, 20 + i * 2), (580, 20 + i * 2))
        shape.draw_line((20 + i * 1.4, 20), (20 + i * 1.4, 820))
    shape.finish(width=0.2)
    shape.commit()
    path = tmp_path / "slow.pdf"
    doc.save(path)
    start = time.monotonic()  # the peer: the same page without the table search (a worker started, the page read)
    (peer_page,) = process_document(path, PreprocessOptions(page_timeout_s=60, tables="never", workers=1))
    peer = time.monotonic() - start
    assert peer_page.page_number == 1
    start = time.monotonic()
    with pytest.raises(PageTimeout, match="page 1 of 'slow.pdf' took longer than 0.3s"):
        list(process_document(path, PreprocessOptions(page_timeout_s=0.3, tables="always", workers=1)))
    took = time.monotonic() - start
    # no hang: within a few times the peer (measured: 0.35-1.6 s against 0.9-1.2 s; both start a worker,
    # whose start-up varies). The PageTimeout above is what shows the page was cut off at 0.3 s.
    assert took < 3 * peer, (took, peer)
