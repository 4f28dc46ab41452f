"""Sniff a file's real type from its first bytes, never from its name."""

from __future__ import annotations

import struct

from posttrain.preprocess.models import FileKind

HEAD_BYTES = 1024
_BMP_DIB_SIZES = {12, 16, 40, 52, 56, 64, 108, 124}
_EXTENSIONS = {
    ".pdf": FileKind.PDF,
    ".png": FileKind.PNG,
    ".jpg": FileKind.JPEG,
    ".jpeg": FileKind.JPEG,
    ".jpe": FileKind.JPEG,
    ".tif": FileKind.TIFF,
    ".tiff": FileKind.TIFF,
    ".webp": FileKind.WEBP,
    ".bmp": FileKind.BMP,
    ".dib": FileKind.BMP,
}


def sniff(data: bytes) -> FileKind:
    """Return the kind of ``data`` (its first ~1 KiB is enough); UNKNOWN if unsupported.

    >>> sniff(b"%PDF-1.7\\n...")
    <FileKind.PDF: 'pdf'>
    """
    head = bytes(data[:HEAD_BYTES])
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return FileKind.PNG
    if head.startswith(b"\xff\xd8\xff"):
        return FileKind.JPEG
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return FileKind.TIFF
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return FileKind.WEBP
    if head[:2] == b"BM" and len(head) >= 18:
        (dib_size,) = struct.unpack("<I", head[14:18])
        if dib_size in _BMP_DIB_SIZES:
            return FileKind.BMP
    # The PDF header may follow some junk; MuPDF accepts it anywhere in the first KiB.
    if b"%PDF-" in head:
        return FileKind.PDF
    return FileKind.UNKNOWN


def kind_from_extension(filename: str) -> FileKind | None:
    """The kind a file name claims by its extension, None when it claims none we know."""
    dot = filename.rfind(".")
    if dot < 0:
        return None
    return _EXTENSIONS.get(filename[dot:].lower())


def describe_unknown(data: bytes) -> str:
    """A short human guess of what an unsupported file is, for error messages."""
    head = bytes(data[:HEAD_BYTES])
    if not head:
        return "an empty file"
    if head.startswith(b"PK\x03\x04"):
        return "a ZIP archive (perhaps DOCX, XLSX or EPUB)"
    if head.startswith(b"GIF8"):
        return "a GIF image"
    if head.startswith(b"\xd0\xcf\x11\xe0"):
        return "an old Microsoft Office file"
    if head.lstrip().lower().startswith((b"<!doctype html", b"<html")):
        return "an HTML page"
    if head.lstrip().startswith(b"<?xml") or head.lstrip().startswith(b"<svg"):
        return "an XML or SVG file"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return "binary data of an unknown format"
    return "plain text"
