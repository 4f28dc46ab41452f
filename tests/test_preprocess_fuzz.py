"""Fuzz: random and mutated bytes end in a typed PreprocessError or a result, never anything else; and a
document the fuzzer builds to be valid (PDFs and images of every supported format, mode, size and
orientation) is never refused, and reads back with its pages, sizes and text."""

from __future__ import annotations

import io
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pymupdf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from posttrain.preprocess.errors import PreprocessError
from posttrain.preprocess.ingest import ingest_bytes
from posttrain.preprocess.models import PageResult
from posttrain.preprocess.options import PreprocessOptions
from posttrain.preprocess.pipeline import process_document


def _seed_pdf() -> bytes:
    doc = pymupdf.open()
    page = doc.new_page(width=200, height=200)
    page.insert_text((20, 40), "Fuzz seed text")
    page.draw_rect(pymupdf.Rect(20, 60, 180, 120))
    page.draw_line((20, 90), (180, 90))
    return doc.tobytes(garbage=0, deflate=False)


def _seed_png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (24, 16), (1, 2, 3)).save(buf, format="PNG")
    return buf.getvalue()


SEEDS = [_seed_pdf(), _seed_png()]
OPTIONS = PreprocessOptions(workers=1, ocr="never", page_timeout_s=20, max_pages=20)


def _process(data: bytes, filename: str) -> list[PageResult]:
    """The pages read from ``data``, each serialisable; a refusal (PreprocessError) propagates."""
    with tempfile.TemporaryDirectory() as tmp:
        stored = ingest_bytes(data, filename=filename, data_dir=Path(tmp), options=OPTIONS)
        pages = list(process_document(stored.path, OPTIONS))
    for page in pages:
        page.model_dump_json()
    return pages


def _run(data: bytes) -> None:
    """Bytes that may or may not be a document: read, or refused with a typed error that gives its reason."""
    try:
        _process(data, "fuzz.bin")
    except PreprocessError as exc:
        assert str(exc), type(exc).__name__


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4096))
def test_random_bytes(data: bytes) -> None:
    _run(data)


@st.composite
def mutated(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 12))):
        op = draw(st.sampled_from(["flip", "cut", "insert"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == "cut":
            del data[pos : pos + draw(st.integers(1, 200))]
        else:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=32))
    return bytes(data)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_documents(data: bytes) -> None:
    _run(data)


# --- documents built to be valid: never refused -------------------------------------------------------------
@dataclass(frozen=True)
class Built:
    """A valid document the fuzzer made, and what reading it must give back."""

    data: bytes
    filename: str
    sizes: list[tuple[float, float]]  # each page's width and height, in reading order
    words: list[str]  # a word each PDF page must hold (none for images: OCR is off)


WORD = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", min_size=3, max_size=16)


@st.composite
def valid_pdfs(draw: st.DrawFn) -> Built:
    doc = pymupdf.open()
    sizes, words = [], []
    for _ in range(draw(st.integers(1, 4))):
        width, height = draw(st.integers(300, 900)), draw(st.integers(120, 900))
        page = doc.new_page(width=width, height=height)
        word = draw(WORD)
        page.insert_text((20, 60), word, fontsize=draw(st.integers(8, 14)))
        if draw(st.booleans()):
            page.draw_rect(pymupdf.Rect(10, 80, width - 10, min(height - 10, 110)))
        rotation = draw(st.sampled_from([0, 90, 180, 270]))
        page.set_rotation(rotation)
        sizes.append((float(height), float(width)) if rotation in (90, 270) else (float(width), float(height)))
        words.append(word)
    data = doc.tobytes(garbage=draw(st.integers(0, 4)), deflate=draw(st.booleans()))
    return Built(data, "built.pdf", sizes, words)


IMAGE_MODES = {  # what Pillow writes in each format the pipeline reads
    "PNG": ["1", "L", "LA", "P", "RGB", "RGBA", "I;16"],
    "JPEG": ["L", "RGB", "CMYK"],
    "WEBP": ["RGB", "RGBA"],
    "BMP": ["1", "L", "P", "RGB"],
    "TIFF": ["1", "L", "RGB", "RGBA", "CMYK", "I;16"],
}
EXIF_ORIENTATION = 0x0112  # 5 to 8 turn the image a quarter: its width and height swap


@st.composite
def valid_images(draw: st.DrawFn) -> Built:
    fmt = draw(st.sampled_from(sorted(IMAGE_MODES)))
    mode = draw(st.sampled_from(IMAGE_MODES[fmt]))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    frames = []
    for _ in range(draw(st.integers(1, 3)) if fmt == "TIFF" else 1):
        width, height = draw(st.integers(1, 200)), draw(st.integers(1, 200))
        frames.append(Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3)).convert(mode))
    options: dict[str, object] = {}
    turned = False
    if fmt in ("JPEG", "PNG", "WEBP") and draw(st.booleans()):
        exif = Image.Exif()
        exif[EXIF_ORIENTATION] = orientation = draw(st.integers(1, 8))
        options["exif"] = exif.tobytes()
        turned = orientation >= 5
    if len(frames) > 1:
        options.update(save_all=True, append_images=frames[1:])
    buffer = io.BytesIO()
    frames[0].save(buffer, format=fmt, **options)
    sizes = [(float(f.height), float(f.width)) if turned else (float(f.width), float(f.height)) for f in frames]
    return Built(buffer.getvalue(), f"built.{fmt.lower()}", sizes, [])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(valid_pdfs(), valid_images()))
def test_a_valid_document_is_never_refused(built: Built) -> None:
    pages = _process(built.data, built.filename)  # a PreprocessError here is a valid document wrongly refused
    assert [p.page_number for p in pages] == list(range(1, len(built.sizes) + 1))
    assert [(round(p.width), round(p.height)) for p in pages] == [(round(w), round(h)) for w, h in built.sizes]
    for page, word in zip(pages, built.words, strict=False):
        assert word in page.text, (word, page.text)
