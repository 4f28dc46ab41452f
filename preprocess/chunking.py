"""Long-context chunking: split a document by structure under a token budget, or pack it whole.

Chunks break at section headings, keep tables whole, and carry their heading
path and the page and box of every element they hold. ``pack_document`` fills
one long-context input up to ``max_model_len`` and says what it had to cut.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict

from posttrain.preprocess.markdown import Element, body_font_size, page_elements
from posttrain.preprocess.models import BBox, PageResult
from posttrain.preprocess.tokens import TokenizerLike, as_token_counter

SEPARATOR = "\n\n"
PAGE_MARK = "<!-- page {n} -->"


class Provenance(BaseModel):
    model_config = ConfigDict(extra="forbid")

    page: int
    bbox: BBox
    kind: str


class Chunk(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int
    text: str
    token_count: int
    heading_path: list[str]
    pages: list[int]
    provenance: list[Provenance]
    oversize: bool = False  # a single table larger than the budget, kept whole


class CutItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    page: int
    kind: str
    heading_path: list[str]
    token_count: int


class PackedDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str
    token_count: int
    max_model_len: int
    budget: int
    truncated: bool
    pages_included: list[int]
    pages_cut: list[int]  # pages with at least one element left out
    cut: list[CutItem]
    cut_tokens: int

    @property
    def summary(self) -> str:
        if not self.truncated:
            return f"the whole document fits: {self.token_count} of {self.budget} tokens"
        return (
            f"cut {len(self.cut)} elements ({self.cut_tokens} tokens) from pages {_ranges(self.pages_cut)} "
            f"to fit {self.budget} tokens"
        )


def _ranges(pages: Sequence[int]) -> str:
    out: list[str] = []
    for p in sorted(set(pages)):
        if out and out[-1].endswith(f"-{p - 1}") or (out and out[-1] == str(p - 1)):
            start = out[-1].split("-")[0]
            out[-1] = f"{start}-{p}"
        else:
            out.append(str(p))
    return ", ".join(out)


def document_elements(pages: Iterable[PageResult]) -> list[Element]:
    """All elements of all pages, with one body font size for the whole document."""
    pages = list(pages)
    body = body_font_size(pages)
    return [e for page in pages for e in page_elements(page, body)]


def _split_text(text: str, budget: int, count) -> list[str]:
    """Split an over-long paragraph at sentence, then word, boundaries into pieces under budget."""
    pieces: list[str] = []
    current = ""
    for unit in re.split(r"(?<=[.!?])\s+", text):
        candidate = f"{current} {unit}".strip()
        if count(candidate) <= budget:
            current = candidate
            continue
        if current:
            pieces.append(current)
        if count(unit) <= budget:
            current = unit
            continue
        current = ""
        for word in unit.split():
            candidate = f"{current} {word}".strip()
            if count(candidate) <= budget or not current:
                current = candidate
            else:
                pieces.append(current)
                current = word
    if current:
        pieces.append(current)
    return pieces


def chunk_document(pages: Iterable[PageResult], *, max_tokens: int, tokenizer: TokenizerLike) -> list[Chunk]:
    """Split the document into chunks of at most ``max_tokens`` (a table larger than that stays whole)."""
    if max_tokens < 8:
        raise ValueError(f"max_tokens={max_tokens} is too small for a chunk; use at least 8")
    count = as_token_counter(tokenizer)
    chunks: list[Chunk] = []
    path: list[tuple[int, str]] = []
    items: list[Element] = []
    texts: list[str] = []

    def flush() -> None:
        if not items:
            return
        text = SEPARATOR.join(texts)
        tokens = count(text)
        chunks.append(
            Chunk(
                index=len(chunks),
                text=text,
                token_count=tokens,
                heading_path=[h for _, h in path],
                pages=sorted({e.page for e in items}),
                provenance=[Provenance(page=e.page, bbox=e.bbox, kind=e.kind) for e in items],
                oversize=tokens > max_tokens,
            )
        )
        items.clear()
        texts.clear()

    for element in document_elements(pages):
        if element.kind == "heading":
            flush()
            while path and path[-1][0] >= element.level:
                path.pop()
            path.append((element.level, element.text))
        md = element.to_markdown()
        pieces = [md]
        if element.kind in ("paragraph", "list_item", "code") and count(md) > max_tokens:
            pieces = _split_text(md, max_tokens, count)
        for piece in pieces:
            if texts and count(SEPARATOR.join(texts + [piece])) > max_tokens:
                flush()
            items.append(element)
            texts.append(piece)
            if element.kind == "table" and count(piece) > max_tokens:
                flush()
    flush()
    return chunks


def pack_document(
    pages: Iterable[PageResult], *, max_model_len: int, tokenizer: TokenizerLike, reserve_tokens: int = 0
) -> PackedDocument:
    """Pack the document, in order, into one input of at most ``max_model_len - reserve_tokens`` tokens.

    Elements are added whole, page by page, each page opened by a page mark;
    the first element that does not fit and everything after it is cut and
    listed (page, kind, heading path, tokens).
    """
    budget = max_model_len - reserve_tokens
    if budget <= 0:
        raise ValueError(f"reserve_tokens={reserve_tokens} leaves no room in max_model_len={max_model_len}")
    count = as_token_counter(tokenizer)
    parts: list[str] = []
    used = 0
    included: set[int] = set()
    cut: list[CutItem] = []
    path: list[tuple[int, str]] = []
    last_page = None
    full = False
    for element in document_elements(pages):
        if element.kind == "heading":
            while path and path[-1][0] >= element.level:
                path.pop()
            path.append((element.level, element.text))
        piece = element.to_markdown()
        if element.page != last_page:
            piece = PAGE_MARK.format(n=element.page) + SEPARATOR + piece
        cost = count(piece) + (count(SEPARATOR) if parts else 0)
        if full or used + cost > budget:
            full = True
            cut.append(
                CutItem(
                    page=element.page,
                    kind=element.kind,
                    heading_path=[h for _, h in path],
                    token_count=count(element.to_markdown()),
                )
            )
            continue
        parts.append(piece)
        used += cost
        included.add(element.page)
        last_page = element.page
    text = SEPARATOR.join(parts)
    while parts and count(text) > budget:  # token counts of parts need not add up exactly
        parts.pop()
        text = SEPARATOR.join(parts)
    return PackedDocument(
        text=text,
        token_count=count(text),
        max_model_len=max_model_len,
        budget=budget,
        truncated=bool(cut),
        pages_included=sorted(included),
        pages_cut=sorted({c.page for c in cut}),
        cut=cut,
        cut_tokens=sum(c.token_count for c in cut),
    )
