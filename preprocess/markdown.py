"""Encoding (a): layout-aware markdown for text models.

A page becomes a list of typed elements (heading, paragraph, list item,
table, code) in reading order, each with its page and box; the markdown is
their rendering. Headings come from font size relative to the body size,
tables replace the text blocks they cover and are kept whole.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict

from posttrain.preprocess.models import BBox, Block, PageResult, Table

HEADING_RATIOS = ((1.6, 1), (1.3, 2), (1.12, 3))  # size / body size -> heading level
MAX_HEADING_CHARS = 160
_BULLET = re.compile(r"^\s*([\u2022\u2023\u25e6\u2043\u2219\u25aa\u25cf\u00b7\-\u2013\*])\s+")
_NUMBERED = re.compile(r"^\s*(\(?\d{1,3}[.)]|\(?[a-z][.)]|\([ivx]{1,5}\))\s+")


class Element(BaseModel):
    """One structural unit of a page, with provenance."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["heading", "paragraph", "list_item", "table", "code"]
    text: str
    level: int = 0  # heading level 1-4
    page: int
    bbox: BBox

    def to_markdown(self) -> str:
        if self.kind == "heading":
            return "#" * self.level + " " + self.text
        if self.kind == "code":
            return "```\n" + self.text + "\n```"
        return self.text


def body_font_size(pages: Iterable[PageResult]) -> float | None:
    """The most common font size over the given pages, weighted by characters."""
    sizes: Counter[float] = Counter()
    for page in pages:
        for block in page.blocks:
            for line in block.lines:
                for span in line.spans:
                    sizes[round(span.size * 2) / 2] += len(span.text.strip())
    return sizes.most_common(1)[0][0] if sizes else None


def _dominant(block: Block) -> tuple[float, float, float]:
    """(char-weighted dominant size, bold share, monospace share) of a block."""
    sizes: Counter[float] = Counter()
    bold = mono = total = 0
    for line in block.lines:
        for span in line.spans:
            n = len(span.text.strip())
            sizes[round(span.size * 2) / 2] += n
            total += n
            bold += n if span.bold else 0
            mono += n if span.monospace else 0
    if total == 0:
        return 0.0, 0.0, 0.0
    return sizes.most_common(1)[0][0], bold / total, mono / total


def _join_lines(lines: list[str]) -> str:
    out = ""
    for text in (t.strip() for t in lines):
        if not text:
            continue
        if out.endswith("-") and len(out) > 1 and out[-2].isalpha() and text[:1].islower():
            out = out[:-1] + text
        elif out:
            out += " " + text
        else:
            out = text
    return out


def _heading_level(size: float, body: float, bold: float, block: Block, text: str) -> int:
    if not text or len(text) > MAX_HEADING_CHARS or len(block.lines) > 3 or body <= 0:
        return 0
    ratio = size / body
    for threshold, level in HEADING_RATIOS:
        if ratio >= threshold:
            return level
    if (
        bold > 0.95
        and len(block.lines) == 1
        and ratio >= 0.98
        and len(text) < 80
        and not text.endswith((".", ":", ","))
    ):
        return 4
    return 0


def _run_in_heading(block: Block, body: float) -> str | None:
    """The text of a bold first line that heads a block of regular lines (a LaTeX subsection), or None."""
    if len(block.lines) < 2:
        return None
    first, rest = block.lines[0], block.lines[1:]
    text = first.text.strip()
    if not text or len(text) >= 80 or text.endswith((".", ",", ":")):
        return None
    if not all(s.bold for s in first.spans if s.text.strip()):
        return None
    if any(s.bold for ln in rest for s in ln.spans if s.text.strip()):
        return None
    size = max(s.size for s in first.spans)
    return text if body > 0 and size / body >= 0.98 else None


def _block_elements(block: Block, page_number: int, body: float) -> list[Element]:
    heading = _run_in_heading(block, body)
    if heading is not None:
        rest = Block(order=block.order, bbox=block.lines[1].bbox[:1] + block.bbox[1:], lines=block.lines[1:])
        rest.bbox = (block.bbox[0], block.lines[1].bbox[1], block.bbox[2], block.bbox[3])
        head = Element(
            kind="heading",
            text=heading,
            level=4,
            page=page_number,
            bbox=(block.bbox[0], block.bbox[1], block.bbox[2], block.lines[0].bbox[3]),
        )
        return [head] + _block_elements(rest, page_number, body)
    size, bold, mono = _dominant(block)
    line_texts = [ln.text for ln in block.lines]
    if mono > 0.8:
        return [Element(kind="code", text="\n".join(t.rstrip() for t in line_texts), page=page_number, bbox=block.bbox)]
    text = _join_lines(line_texts)
    level = _heading_level(size, body, bold, block, text)
    if level:
        return [Element(kind="heading", text=text, level=level, page=page_number, bbox=block.bbox)]
    if any(_BULLET.match(t) or _NUMBERED.match(t) for t in line_texts[:1]):
        items: list[list[str]] = []
        for t in line_texts:
            if _BULLET.match(t) or _NUMBERED.match(t) or not items:
                items.append([t])
            else:
                items[-1].append(t)
        out = []
        for item in items:
            joined = _join_lines(item)
            m = _BULLET.match(joined)
            joined = "- " + joined[m.end() :] if m else joined
            out.append(Element(kind="list_item", text=joined, page=page_number, bbox=block.bbox))
        return out
    return [Element(kind="paragraph", text=text, page=page_number, bbox=block.bbox)] if text else []


def _inside(block: BBox, table: BBox) -> bool:
    cx, cy = (block[0] + block[2]) / 2, (block[1] + block[3]) / 2
    return table[0] - 1 <= cx <= table[2] + 1 and table[1] - 1 <= cy <= table[3] + 1


def page_elements(page: PageResult, body_size: float | None = None) -> list[Element]:
    """The page's structural elements in reading order; tables replace the blocks they cover."""
    body = body_size or body_font_size([page]) or 10.0
    pending: list[Table] = sorted(page.tables, key=lambda t: (t.bbox[1], t.bbox[0]))
    placed: set[int] = set()
    out: list[Element] = []

    def table_element(i: int) -> Element:
        t = pending[i]
        return Element(kind="table", text=t.markdown, page=page.page_number, bbox=t.bbox)

    for block in page.blocks:
        covering = next((i for i, t in enumerate(pending) if _inside(block.bbox, t.bbox)), None)
        if covering is not None:
            if covering not in placed:
                placed.add(covering)
                out.append(table_element(covering))
            continue
        out.extend(_block_elements(block, page.page_number, body))
    for i, t in enumerate(pending):  # tables without text blocks inside: place by position
        if i in placed or not t.markdown:
            continue
        at = next((k for k, e in enumerate(out) if e.bbox[1] >= t.bbox[1]), len(out))
        out.insert(at, table_element(i))
    return out


def render_markdown(elements: Iterable[Element]) -> str:
    return "\n\n".join(e.to_markdown() for e in elements)


def page_markdown(page: PageResult, body_size: float | None = None) -> str:
    """Markdown of one page (encoding (a))."""
    return render_markdown(page_elements(page, body_size))
