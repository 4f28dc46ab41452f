"""Typed, JSON-serialisable results of preprocessing.

Coordinates are in PDF points (1/72 inch) with the origin at the page's top
left, as PyMuPDF reports them; for images one unit is one pixel of the
normalised image.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

BBox = tuple[float, float, float, float]

# PyMuPDF span flag bits
FLAG_SUPERSCRIPT = 1
FLAG_ITALIC = 2
FLAG_SERIF = 4
FLAG_MONOSPACE = 8
FLAG_BOLD = 16


class FileKind(str, Enum):
    """The real type of a file, sniffed from its content."""

    PDF = "pdf"
    PNG = "png"
    JPEG = "jpeg"
    TIFF = "tiff"
    WEBP = "webp"
    BMP = "bmp"
    UNKNOWN = "unknown"

    @property
    def extension(self) -> str:
        return {"jpeg": ".jpg", "tiff": ".tif", "unknown": ".bin"}.get(self.value, "." + self.value)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_bytes="base64", val_json_bytes="base64")


@dataclass(slots=True)
class Span:
    """A run of text in one font, size and style.

    Span, Line, Block and Word are plain dataclasses, not pydantic models:
    a page has thousands of them and they are built on the hot path (pydantic
    still validates and serialises them as fields of :class:`PageResult`).
    """

    text: str
    bbox: BBox
    font: str = ""
    size: float = 0.0
    flags: int = 0
    color: int = 0

    @property
    def bold(self) -> bool:
        return bool(self.flags & FLAG_BOLD) or "bold" in self.font.lower()

    @property
    def italic(self) -> bool:
        return bool(self.flags & FLAG_ITALIC)

    @property
    def monospace(self) -> bool:
        return bool(self.flags & FLAG_MONOSPACE)


@dataclass(slots=True)
class Line:
    bbox: BBox
    spans: list[Span]

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.spans)


@dataclass(slots=True)
class Block:
    """A text block; ``order`` is its place in reading order on the page."""

    order: int
    bbox: BBox
    lines: list[Line]
    ocr: bool = False

    @property
    def text(self) -> str:
        return "\n".join(line.text for line in self.lines)


@dataclass(slots=True)
class Word:
    """A word; ``block`` is the reading-order index of its block; confidence 0-100 for OCR words."""

    text: str
    bbox: BBox
    block: int
    line: int = 0
    ocr: bool = False
    confidence: float | None = None


class TableCell(_Model):
    row: int
    col: int
    bbox: BBox | None
    text: str


class Table(_Model):
    bbox: BBox
    rows: int
    cols: int
    header: list[str]
    cells: list[TableCell]
    markdown: str


class EmbeddedImage(_Model):
    bbox: BBox
    width: int
    height: int
    xref: int = 0


class PageImage(_Model):
    """A rendered page as PNG bytes (base64 in JSON)."""

    png: bytes
    width: int
    height: int
    dpi: float


class LayoutWords(_Model):
    """Encoding (b): words with boxes normalised to 0-1000 (LayoutLM family)."""

    words: list[str]
    boxes: list[tuple[int, int, int, int]]
    token_count: int | None = None


class PageResult(_Model):
    """Everything extracted from one page, in reading order."""

    page_number: int = Field(description="1-based")
    source: Literal["pdf", "image"]
    width: float
    height: float
    rotation: int = 0
    blocks: list[Block] = []
    words: list[Word] = []
    tables: list[Table] = []
    images: list[EmbeddedImage] = []
    ocr: bool = False
    ocr_confidence: float | None = None
    render: PageImage | None = None
    markdown: str | None = None
    layout: LayoutWords | None = None
    timings: dict[str, float] = {}

    @property
    def text(self) -> str:
        return "\n\n".join(b.text for b in self.blocks)


class OutlineEntry(_Model):
    level: int
    title: str
    page: int | None = Field(description="1-based target page, None when it points nowhere")


class DocumentInfo(_Model):
    """What is known about a document before its pages are processed."""

    kind: FileKind
    page_count: int
    metadata: dict[str, str] = {}
    outline: list[OutlineEntry] = []
    repaired: bool = False
    encrypted: bool = False
    active_content: list[str] = Field(
        default_factory=list,
        description="kinds of active content the file carries (javascript, launch, ...); never run, only reported",
    )


class Progress(_Model):
    done: int
    total: int
    page_number: int
    elapsed_s: float
