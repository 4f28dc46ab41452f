"""Fuzz: random and mutated bytes end in a typed PreprocessError or a result, never anything else."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import pymupdf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from posttrain.preprocess.errors import PreprocessError
from posttrain.preprocess.ingest import ingest_bytes
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


def _run(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            stored = ingest_bytes(data, filename="fuzz.bin", data_dir=Path(tmp), options=OPTIONS)
            for page in process_document(stored.path, OPTIONS):
                page.model_dump_json()
        except PreprocessError:
            pass


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
