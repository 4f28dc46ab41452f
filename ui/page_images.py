"""Page renders with boxes drawn over them, for the Documents viewer and the Tasks page.

Boxes are in PDF points (origin top left); the render is ``render_dpi`` pixels per inch, so a
point maps to ``image.width / page.width`` pixels horizontally (and likewise vertically).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from posttrain.platform.db.models import Page

BLOCK_COLOR = (37, 99, 235)  # blue
TABLE_COLOR = (22, 163, 74)  # green
CELL_COLOR = (134, 239, 172)
WORD_COLOR = (234, 88, 12)  # orange
OCR_WORD_COLOR = (219, 39, 119)  # pink: words read by OCR
HIGHLIGHT_COLOR = (220, 38, 38)  # red


@dataclass(frozen=True)
class Box:
    bbox: Sequence[float]
    color: tuple[int, int, int]
    width: int = 2
    fill_alpha: int = 0  # 0: outline only


def layout_boxes(layout: dict[str, Any], *, blocks: bool = True, tables: bool = True, words: bool = False) -> list[Box]:
    """Boxes for a page's stored layout JSON (``Page.layout``)."""
    boxes: list[Box] = []
    if blocks:
        boxes += [Box(b["bbox"], BLOCK_COLOR, 2) for b in layout.get("blocks", []) if b.get("bbox")]
    if tables:
        for table in layout.get("tables", []):
            boxes += [Box(c["bbox"], CELL_COLOR, 1) for c in table.get("cells", []) if c.get("bbox")]
            if table.get("bbox"):
                boxes.append(Box(table["bbox"], TABLE_COLOR, 3))
    if words:
        boxes += [Box(w["bbox"], OCR_WORD_COLOR if w.get("ocr") else WORD_COLOR, 1)
                  for w in layout.get("words", []) if w.get("bbox")]  # fmt: skip
    return boxes


def draw_boxes(image: Image.Image, page_width: float, page_height: float, boxes: Iterable[Box]) -> Image.Image:
    """A copy of ``image`` with ``boxes`` (PDF points) drawn, scaled to the image's pixels."""
    out = image.convert("RGBA")
    overlay = Image.new("RGBA", out.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(overlay)
    sx = out.width / page_width if page_width else 1.0
    sy = out.height / page_height if page_height else 1.0
    for box in boxes:
        x0, y0, x1, y1 = (float(v) for v in box.bbox)
        rect = (x0 * sx, y0 * sy, max(x0, x1) * sx, max(y0, y1) * sy)
        fill = (*box.color, box.fill_alpha) if box.fill_alpha else None
        draw.rectangle(rect, outline=(*box.color, 255), width=box.width, fill=fill)
    return Image.alpha_composite(out, overlay).convert("RGB")


def page_image(
    page: Page,
    *,
    blocks: bool = False,
    tables: bool = False,
    words: bool = False,
    highlight: Sequence[float] | None = None,
) -> Image.Image | None:
    """The page's render with the chosen layout boxes and an optional highlighted box, or None
    when the page has no render on disk."""
    if not page.image_path or not Path(page.image_path).is_file():
        return None
    with Image.open(page.image_path) as image:
        image.load()
        boxes = layout_boxes(page.layout or {}, blocks=blocks, tables=tables, words=words)
        if highlight is not None and len(highlight) == 4:
            boxes.append(Box(highlight, HIGHLIGHT_COLOR, 4, fill_alpha=48))
        width = page.width or (page.layout or {}).get("width") or image.width
        height = page.height or (page.layout or {}).get("height") or image.height
        return draw_boxes(image, float(width), float(height), boxes)
