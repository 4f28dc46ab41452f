"""PDF pages with PyMuPDF: spans with boxes, reading order, tables, images, renders, OCR."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pymupdf
from PIL import Image

from posttrain.preprocess.encode import attach_encodings
from posttrain.preprocess.errors import (
    CorruptDocument,
    EmptyDocument,
    PasswordRequired,
    TooManyPages,
    WrongPassword,
)
from posttrain.preprocess.models import (
    Block,
    DocumentInfo,
    EmbeddedImage,
    FileKind,
    Line,
    OutlineEntry,
    PageImage,
    PageResult,
    Span,
    Word,
)
from posttrain.preprocess.ocr import ocr_image
from posttrain.preprocess.ocr_layout import ocr_to_page_content
from posttrain.preprocess.options import PreprocessOptions
from posttrain.preprocess.reading_order import reading_order
from posttrain.preprocess.tables import find_page_tables

# keep whitespace, expand ligatures (fi, fl: what tokenizers and pdftotext expect), clip to the
# media box, never copy image bytes into the text page
TEXT_FLAGS = pymupdf.TEXT_PRESERVE_WHITESPACE | pymupdf.TEXT_MEDIABOX_CLIP | pymupdf.TEXT_CID_FOR_UNKNOWN_UNICODE

pymupdf.TOOLS.mupdf_display_errors(False)
pymupdf.TOOLS.mupdf_display_warnings(False)


def open_pdf(path: Path | str, options: PreprocessOptions) -> pymupdf.Document:
    """Open (and authenticate) a PDF, mapping every failure to a typed error."""
    name = Path(path).name
    try:
        doc = pymupdf.open(str(path), filetype="pdf")
    except pymupdf.FileNotFoundError:
        raise CorruptDocument(f"{name!r} cannot be read; check that the file exists") from None
    except Exception as exc:  # MuPDF raises FileDataError / RuntimeError / ValueError on broken files
        raise CorruptDocument(
            f"{name!r} is not a readable PDF and MuPDF could not repair it ({exc}); re-export or re-download the file"
        ) from None
    if doc.needs_pass:
        if options.password is None:
            doc.close()
            raise PasswordRequired(f"{name!r} is encrypted; give its password (PreprocessOptions.password)")
        if not doc.authenticate(options.password):
            doc.close()
            raise WrongPassword(f"the password given for {name!r} is wrong; check it and try again")
    try:
        count = doc.page_count
    except Exception as exc:
        doc.close()
        raise CorruptDocument(f"{name!r} has a damaged page tree ({exc}); re-export the file") from None
    if count == 0:
        doc.close()
        raise EmptyDocument(f"{name!r} has no pages (or none MuPDF could recover); check the file")
    if count > options.max_pages:
        doc.close()
        raise TooManyPages(
            f"{name!r} has {count} pages, over the limit of {options.max_pages}; split it or raise max_pages"
        )
    return doc


# PDF names that make a document do something when opened or clicked: scripts, launching programs,
# sending or fetching data, embedded payloads. MuPDF runs none of them; they are reported so the
# operator sees what a file carried.
_ACTIVE_NAMES = {
    "JavaScript": "javascript",
    "JS": "javascript",
    "Launch": "launch",
    "AA": "additional_actions",
    "EmbeddedFile": "embedded_files",
    "EmbeddedFiles": "embedded_files",
    "FileAttachment": "embedded_files",
    "SubmitForm": "submit_form",
    "ImportData": "import_data",
    "RichMedia": "rich_media",
    "RichMediaExecute": "rich_media",
    "GoToR": "remote_goto",
    "GoToE": "remote_goto",
    "XFA": "xfa",
}
_ACTIVE_NAME = re.compile(r"/(" + "|".join(sorted(_ACTIVE_NAMES, key=len, reverse=True)) + r")(?=[\s/<>\[\]()]|$)")


def active_content(doc: pymupdf.Document) -> list[str]:
    """The kinds of active content anywhere in the PDF's objects (sorted, without repeats)."""
    found: set[str] = set()
    try:
        count = doc.xref_length()
    except Exception:  # a damaged cross-reference table: nothing more can be said
        return []
    for xref in range(1, count):
        try:
            source = doc.xref_object(xref, compressed=True)
        except Exception:  # one broken object does not hide the others
            continue
        for match in _ACTIVE_NAME.finditer(source):
            found.add(_ACTIVE_NAMES[match.group(1)])
    try:
        if doc.embfile_count():
            found.add("embedded_files")
    except Exception:
        pass
    return sorted(found)


def pdf_info(doc: pymupdf.Document) -> DocumentInfo:
    """Metadata and outline of an open PDF."""
    metadata = {k: str(v) for k, v in (doc.metadata or {}).items() if v}
    outline: list[OutlineEntry] = []
    try:
        toc = doc.get_toc(simple=True)
    except Exception:  # a broken outline is not worth failing the document for
        toc = []
    for level, title, page in toc:
        outline.append(OutlineEntry(level=int(level), title=str(title), page=int(page) if page and page > 0 else None))
    return DocumentInfo(
        kind=FileKind.PDF,
        page_count=doc.page_count,
        metadata=metadata,
        outline=outline,
        repaired=bool(doc.is_repaired),
        encrypted=bool(doc.is_encrypted or doc.needs_pass),
        active_content=active_content(doc),
    )


def _rect(r) -> tuple[float, float, float, float]:
    return (round(r[0], 2), round(r[1], 2), round(r[2], 2), round(r[3], 2))


def _text_layer(page: pymupdf.Page) -> tuple[list[Block], list[Word]]:
    """Spans, lines and blocks from one text page, in reading order, plus its words.

    Hot path: models are built with ``model_construct`` (the data comes from
    MuPDF, already well-typed), which is several times faster than validation.
    """
    tp = page.get_textpage(flags=TEXT_FLAGS)
    data = tp.extractDICT(sort=False)
    span_new, line_new = Span, Line
    raw = []  # (mupdf block number, bbox, lines)
    for blk in data["blocks"]:
        if blk.get("type", 0) != 0:
            continue
        lines: list[Line] = []
        for ln in blk["lines"]:
            spans = []
            has_text = False
            for s in ln["spans"]:
                text = s["text"]
                if not text:
                    continue
                has_text = has_text or not text.isspace()
                spans.append(
                    span_new(
                        text=text,
                        bbox=tuple(s["bbox"]),
                        font=s["font"],
                        size=s["size"],
                        flags=s["flags"],
                        color=s["color"],
                    )
                )
            if has_text:
                lines.append(line_new(bbox=tuple(ln["bbox"]), spans=spans))
        if lines:
            raw.append((blk["number"], tuple(blk["bbox"]), lines))
    order = reading_order([r[1] for r in raw])
    rank_of = {raw[idx][0]: rank for rank, idx in enumerate(order)}
    blocks = [Block(order=rank, bbox=raw[idx][1], lines=raw[idx][2], ocr=False) for rank, idx in enumerate(order)]
    word_new = Word
    words = []
    for x0, y0, x1, y1, text, block_no, line_no, _word_no in tp.extractWORDS():
        rank = rank_of.get(block_no)
        if rank is None:
            continue
        words.append(word_new(text=text, bbox=(x0, y0, x1, y1), block=rank, line=line_no, ocr=False, confidence=None))
    words.sort(key=lambda w: w.block)  # stable: keeps MuPDF's order inside each block
    return blocks, words


def _embedded_images(page: pymupdf.Page) -> list[EmbeddedImage]:
    if not page.get_images(full=False):
        return []
    out = []
    for info in page.get_image_info(xrefs=True):
        out.append(
            EmbeddedImage(
                bbox=_rect(info["bbox"]), width=int(info["width"]), height=int(info["height"]), xref=int(info["xref"])
            )
        )
    return out


def render_page(page: pymupdf.Page, dpi: int) -> PageImage:
    pix = page.get_pixmap(dpi=dpi, alpha=False)
    return PageImage(png=pix.tobytes("png"), width=pix.width, height=pix.height, dpi=float(dpi))


def _needs_ocr(page: pymupdf.Page, blocks: list[Block], images: list[EmbeddedImage], mode: str) -> bool:
    if mode == "never":
        return False
    if mode == "always":
        return True
    if blocks:
        return False
    # no text layer: OCR only when something is painted (a scan, or text drawn as outlines)
    return bool(images) or bool(page.get_images(full=False)) or bool(page.get_cdrawings())


def _ocr_page(page: pymupdf.Page, options: PreprocessOptions, timeout_s: float):
    pix = page.get_pixmap(dpi=options.ocr_dpi, colorspace=pymupdf.csGRAY, alpha=False)
    image = Image.frombytes("L", (pix.width, pix.height), pix.samples)
    words = ocr_image(image, language=options.ocr_language, timeout_s=timeout_s)
    return ocr_to_page_content(words, scale=72.0 / options.ocr_dpi)


def extract_page(page: pymupdf.Page, options: PreprocessOptions | None = None) -> PageResult:
    """Extract one PDF page: text layer (or OCR), reading order, tables, images, render, encodings."""
    options = options or PreprocessOptions()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    blocks, words = _text_layer(page)
    t1 = time.perf_counter()
    timings["text"] = t1 - t0
    tables = find_page_tables(page, options.tables)
    t2 = time.perf_counter()
    timings["tables"] = t2 - t1
    images = _embedded_images(page) if options.images else []
    timings["images"] = time.perf_counter() - t2

    ocr = False
    ocr_confidence = None
    if _needs_ocr(page, blocks, images, options.ocr):
        t = time.perf_counter()
        blocks, words, ocr_confidence = _ocr_page(page, options, options.page_timeout_s)
        ocr = True
        timings["ocr"] = time.perf_counter() - t

    render = None
    if options.render_dpi:
        t = time.perf_counter()
        render = render_page(page, options.render_dpi)
        timings["render"] = time.perf_counter() - t

    rect = page.rect
    result = PageResult.model_construct(
        page_number=page.number + 1,
        source="pdf",
        width=round(rect.width, 2),
        height=round(rect.height, 2),
        rotation=page.rotation,
        blocks=blocks,
        words=words,
        tables=tables,
        images=images,
        ocr=ocr,
        ocr_confidence=ocr_confidence,
        render=render,
        markdown=None,
        layout=None,
        timings=timings,
    )
    if options.encodings:
        t = time.perf_counter()
        result = attach_encodings(result)
        result.timings["encode"] = time.perf_counter() - t
    return result
