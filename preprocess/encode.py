"""The encodings of a page, all from one extraction."""

from __future__ import annotations

from posttrain.preprocess.layoutlm import layout_words
from posttrain.preprocess.markdown import page_markdown
from posttrain.preprocess.models import PageResult


def attach_encodings(page: PageResult, body_size: float | None = None) -> PageResult:
    """Return ``page`` with ``markdown`` (a) and ``layout`` (b) filled in (no token counts)."""
    page.markdown = page_markdown(page, body_size)
    page.layout = layout_words(page)
    return page
