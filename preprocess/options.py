"""Options of the preprocessing pipeline: one validated, immutable model."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MiB = 1024 * 1024


def _default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


class PreprocessOptions(BaseModel):
    """How documents are read, with the limits that protect the worker.

    Example::

        opts = PreprocessOptions(render_dpi=96, ocr="auto", workers=2)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # limits
    max_file_bytes: int = Field(256 * MiB, gt=0, description="larger inputs raise FileTooLarge")
    max_pages: int = Field(2000, gt=0, description="documents with more pages raise TooManyPages")
    page_timeout_s: float = Field(120.0, gt=0, description="a slower page raises PageTimeout")
    max_image_pixels: int = Field(64_000_000, gt=0, description="Pillow's decompression-bomb limit")
    max_image_side: int = Field(4096, ge=64, description="images are scaled down to this longest side")

    # parallelism
    workers: int = Field(default_factory=_default_workers, ge=1, le=64)

    # PDF
    password: str | None = Field(None, description="password of an encrypted PDF")
    render_dpi: int | None = Field(None, ge=18, le=600, description="render each page at this DPI; None: no render")
    tables: Literal["auto", "always", "never"] = Field(
        "auto", description="auto: run find_tables only on pages with table cues"
    )
    images: bool = Field(True, description="list embedded images with their boxes")
    encodings: bool = Field(True, description="attach markdown and LayoutLM words to every page")

    # OCR
    ocr: Literal["auto", "always", "never"] = Field("auto", description="auto: pages without a text layer")
    ocr_language: str = Field("eng", pattern=r"^[A-Za-z_]+(\+[A-Za-z_]+)*$")
    ocr_dpi: int = Field(300, ge=72, le=600)

    # ingest
    strict_extension: bool = Field(False, description="raise MislabelledFile when the extension disagrees")
