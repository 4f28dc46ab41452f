"""Ingest: sniffing by content, safe names, content-addressed storage, size limits."""

from __future__ import annotations

import io
from pathlib import Path

import pymupdf
import pytest
from PIL import Image

from posttrain.preprocess.errors import (
    FileTooLarge,
    InputNotFound,
    MislabelledFile,
    PreprocessError,
    UnsafeFilename,
    UnsupportedFileType,
)
from posttrain.preprocess.ingest import ingest_bytes, ingest_file, safe_filename
from posttrain.preprocess.models import FileKind
from posttrain.preprocess.options import PreprocessOptions
from posttrain.preprocess.sniff import sniff

REAL_PDF = Path("/usr/share/doc/texlive-doc/latex/base/ltnews30.pdf")  # Debian texlive-latex-base-doc


def _image_bytes(fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("fmt", "kind"),
    [
        ("PNG", FileKind.PNG),
        ("JPEG", FileKind.JPEG),
        ("TIFF", FileKind.TIFF),
        ("WEBP", FileKind.WEBP),
        ("BMP", FileKind.BMP),
    ],
)
def test_sniff_images_by_content(fmt: str, kind: FileKind) -> None:
    assert sniff(_image_bytes(fmt)) is kind


def test_sniff_pdf_and_unknown() -> None:
    assert sniff(REAL_PDF.read_bytes()[:1024]) is FileKind.PDF
    assert sniff(b"junk before %PDF-1.4 header") is FileKind.PDF
    for data in (b"", b"hello world", b"PK\x03\x04zip", b"GIF89a....", b"BM" + b"\x00" * 30):
        assert sniff(data) is FileKind.UNKNOWN


@pytest.mark.parametrize(
    "name", ["../etc/passwd", "a/b.pdf", "C:\\x\\y.pdf", "..", "", "   ", "bad\x00.pdf", "x" * 300]
)
def test_unsafe_filenames_are_refused(name: str) -> None:
    with pytest.raises(UnsafeFilename):
        safe_filename(name)


def test_same_content_twice_is_one_document(tmp_path: Path) -> None:
    data = REAL_PDF.read_bytes()
    first = ingest_bytes(data, filename="news.pdf", data_dir=tmp_path)
    second = ingest_file(REAL_PDF, data_dir=tmp_path)
    assert first.created and not second.created
    assert first.sha256 == second.sha256 and first.path == second.path
    assert first.kind is FileKind.PDF and first.path.read_bytes() == data
    assert first.path.relative_to(tmp_path).parts[:2] == ("documents", first.sha256[:2])
    leftovers = [p for p in (tmp_path / "documents" / "incoming").iterdir()]
    assert leftovers == []  # temp files were renamed or removed


def test_type_comes_from_content_not_extension(tmp_path: Path) -> None:
    stored = ingest_bytes(_image_bytes("PNG"), filename="scan.pdf", data_dir=tmp_path)
    assert stored.kind is FileKind.PNG and stored.path.suffix == ".png"
    with pytest.raises(MislabelledFile, match="named as PDF but its content is PNG"):
        ingest_bytes(
            _image_bytes("PNG"),
            filename="scan.pdf",
            data_dir=tmp_path,
            options=PreprocessOptions(strict_extension=True),
        )


def test_unsupported_type_names_what_it_is(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedFileType, match="plain text although its name says PDF"):
        ingest_bytes(b"just some text\n", filename="report.pdf", data_dir=tmp_path)
    with pytest.raises(UnsupportedFileType, match="ZIP"):
        ingest_bytes(b"PK\x03\x04" + b"\x00" * 100, filename="doc.docx", data_dir=tmp_path)
    assert not list((tmp_path / "documents").rglob("*.*"))


def test_size_limit(tmp_path: Path) -> None:
    options = PreprocessOptions(max_file_bytes=1000)
    with pytest.raises(FileTooLarge, match="raise max_file_bytes"):
        ingest_file(REAL_PDF, data_dir=tmp_path, options=options)
    with pytest.raises(FileTooLarge):
        ingest_stream_like = io.BytesIO(REAL_PDF.read_bytes())
        from posttrain.preprocess.ingest import ingest_stream

        ingest_stream(ingest_stream_like, filename="n.pdf", data_dir=tmp_path, options=options)
    assert not list((tmp_path / "documents").rglob("*.pdf"))


def test_missing_input(tmp_path: Path) -> None:
    with pytest.raises(InputNotFound):
        ingest_file(tmp_path / "nope.pdf", data_dir=tmp_path)
    assert issubclass(InputNotFound, PreprocessError)


def test_generated_pdf_roundtrip(tmp_path: Path) -> None:
    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), "hello")
    stored = ingest_bytes(doc.tobytes(), filename="gen.pdf", data_dir=tmp_path)
    assert stored.size == stored.path.stat().st_size
