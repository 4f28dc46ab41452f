"""Encoding (b): words with boxes normalised to 0-1000, as LayoutLM-family models expect."""

from __future__ import annotations

from posttrain.preprocess.models import BBox, LayoutWords, PageResult
from posttrain.preprocess.tokens import TokenizerLike, as_token_counter


def normalize_box(bbox: BBox, width: float, height: float) -> tuple[int, int, int, int]:
    """Scale a box in page units to integers in [0, 1000]."""
    if width <= 0 or height <= 0:
        raise ValueError(f"page size must be positive, got {width}x{height}")

    def clamp(v: float) -> int:
        return max(0, min(1000, int(round(v))))

    x0, y0, x1, y1 = bbox
    return (
        clamp(1000 * x0 / width),
        clamp(1000 * y0 / height),
        clamp(1000 * x1 / width),
        clamp(1000 * y1 / height),
    )


def layout_words(page: PageResult, tokenizer: TokenizerLike | None = None) -> LayoutWords:
    """The page's words in reading order with 0-1000 boxes; token_count when a tokenizer is given."""
    words = [w.text for w in page.words]
    boxes = [normalize_box(w.bbox, page.width, page.height) for w in page.words]
    count = None
    if tokenizer is not None:
        counter = as_token_counter(tokenizer)
        count = sum(counter(w) for w in words)
    return LayoutWords(words=words, boxes=boxes, token_count=count)
