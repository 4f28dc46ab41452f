"""Builders: verifiable tasks from preprocessed documents, with answers known from the document.

Three kinds, each asked over the page's text (layout-aware markdown in the prompt) and, with
``vision=True``, over the page's render as well (an OpenAI-style ``image_url`` part sized by
:func:`posttrain.preprocess.vision.encode_image`; domain ``<base>.vision``, metadata
``modality="vision"``):

- ``table_lookup`` (domain ``doc.table_lookup``): for a table with a header row and a row-label
  column, "what is the value in row R, column C?"; verifier ``doc_qa`` (exact match) with the page
  text in the spec and a quoted evidence span required.
- ``field_extraction`` (``doc.fields``): key-value pairs found in the layout (``Key: value`` lines
  and two-column table rows) asked for as one JSON object; verifier ``json_schema`` with
  ``expected`` values and partial credit by field.
- ``span_recovery`` (``doc.span``): a key term (a capitalised word or a number, not a stopword)
  masked in a sentence of the page; verifier ``doc_qa`` (exact match, the sentence as evidence).

Table cell text is rebuilt from the page's positioned words (the words whose centre lies in the
cell), so answers read the way the page does. Pages are cited 1-based in prompts and in the
``doc_qa`` specs (``page``, ``pages``), as a reader counts them; every task's provenance holds
``{document_id, page (numbered alike, from 1: pages_from), bbox (PDF points), filename, sha256}``.

Example::

    specs = build_document_tasks(3, kinds=["table_lookup"], vision=True, seed=0)

``passage_chars=N`` puts only the passage around each question's evidence (about N characters, cut at
sentence ends) in the text prompt instead of the whole page: for a small model, or pages longer than its
context. The verifier still checks evidence against the whole page.

The same document content, options and seed give the same tasks.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from PIL import Image

from posttrain.platform.db.models import Document, DocumentStatus, Page
from posttrain.platform.documents import get_document, get_pages
from posttrain.platform.verifiers import TaskSpec
from posttrain.platform.verifiers.text import normalize_whitespace
from posttrain.preprocess.vision import encode_image

Kind = Literal["table_lookup", "field_extraction", "span_recovery"]
KINDS: tuple[Kind, ...] = ("table_lookup", "field_extraction", "span_recovery")
DOMAINS: dict[str, str] = {
    "table_lookup": "doc.table_lookup",
    "field_extraction": "doc.fields",
    "span_recovery": "doc.span",
}
VISION_SUFFIX = ".vision"
MIN_EVIDENCE_CHARS = 8  # the doc_qa verifier's default
# OCR'd text whose words Tesseract read with a mean confidence below this (0-100) gives no span task: a screenshot's
# noise ("Handle symlinks in system dis... '____. yt syst") would become a question with a garbled answer
OCR_MIN_CONFIDENCE = 85.0
MAX_FIELDS_PER_TASK = 6
MASK = "____"

BBox = tuple[float, float, float, float]

STOPWORDS = frozenset(
    """a an and are as at be been but by can could did do does for from had has have he her his how i if in into is it
    its may might must no not of on or our she should so such than that the their them then there these they this
    those to us was we were what when where which while who why will with would you your also however therefore
    thus here each every all any some many most more other another one only both either neither after before
    because since until unless although though during within without about above below under over between
    page table figure see note""".split()
)


class DocumentBuildError(ValueError):
    """A document cannot give tasks (missing, not preprocessed, failed); the message says why and what to do."""


@dataclass(frozen=True)
class Cell:
    text: str
    bbox: BBox | None
    cut: bool  # a word crosses the cell's edge: the detected grid does not fit the text


@dataclass(frozen=True)
class CleanTable:
    index: int
    bbox: BBox
    grid: list[list[Cell]]
    original_markdown: str

    def markdown(self) -> str:
        def esc(text: str) -> str:
            return text.replace("|", "\\|")

        rows = [[esc(c.text) for c in row] for row in self.grid]
        if not rows:
            return ""
        width = max(len(r) for r in rows)
        lines = ["| " + " | ".join(rows[0] + [""] * (width - len(rows[0]))) + " |", "|" + "---|" * width]
        lines += ["| " + " | ".join(r + [""] * (width - len(r))) + " |" for r in rows[1:]]
        return "\n".join(lines)


@dataclass
class Question:
    """One generated question before it is packaged as a text and a vision task."""

    kind: Kind
    page: Page
    key: str  # stable within the page
    question: str
    answer: str | dict[str, str]
    bbox: BBox
    evidence: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# --- geometry and text ------------------------------------------------------------------------


def _bbox(value: Any) -> BBox | None:
    if not value or len(value) != 4:
        return None
    return (float(value[0]), float(value[1]), float(value[2]), float(value[3]))


def union(boxes: Iterable[BBox | None]) -> BBox | None:
    found = [b for b in boxes if b is not None]
    if not found:
        return None
    return (min(b[0] for b in found), min(b[1] for b in found), max(b[2] for b in found), max(b[3] for b in found))


def _overlap_share(word: BBox, cell: BBox) -> float:
    w = max(0.0, min(word[2], cell[2]) - max(word[0], cell[0]))
    h = max(0.0, min(word[3], cell[3]) - max(word[1], cell[1]))
    area = max(1e-6, (word[2] - word[0]) * (word[3] - word[1]))
    return w * h / area


def _join_words(words: Sequence[dict[str, Any]]) -> str:
    """Words in reading order: lines by vertical centre, left to right within a line."""
    ordered = sorted(words, key=lambda w: ((w["bbox"][1] + w["bbox"][3]) / 2, w["bbox"][0]))
    lines: list[list[dict[str, Any]]] = []
    for word in ordered:
        centre = (word["bbox"][1] + word["bbox"][3]) / 2
        if lines:
            last = lines[-1][-1]["bbox"]
            if abs(centre - (last[1] + last[3]) / 2) <= max(2.0, (last[3] - last[1]) / 2):
                lines[-1].append(word)
                continue
        lines.append([word])
    return " ".join(" ".join(w["text"] for w in sorted(line, key=lambda w: w["bbox"][0])) for line in lines).strip()


def page_tables(page: Page) -> list[CleanTable]:
    """The page's detected tables with each cell's text rebuilt from the positioned words."""
    layout = page.layout or {}
    words = [w for w in layout.get("words", []) if _bbox(w.get("bbox")) and str(w.get("text", "")).strip()]
    tables: list[CleanTable] = []
    for index, table in enumerate(layout.get("tables", [])):
        rows, cols = int(table.get("rows", 0)), int(table.get("cols", 0))
        if rows < 1 or cols < 1:
            continue
        grid = [[Cell("", None, False) for _ in range(cols)] for _ in range(rows)]
        for cell in table.get("cells", []):
            r, c = int(cell.get("row", -1)), int(cell.get("col", -1))
            if not (0 <= r < rows and 0 <= c < cols):
                continue
            box = _bbox(cell.get("bbox"))
            if box is None or not words:
                grid[r][c] = Cell(" ".join(str(cell.get("text", "")).split()), box, box is None and r > 0)
                continue
            inside, cut = [], False
            for w in words:
                share = _overlap_share(w["bbox"], box)
                if share >= 0.5:
                    inside.append(w)
                elif share > 0.15:
                    cut = True
            grid[r][c] = Cell(_join_words(inside), box, cut)
        tables.append(CleanTable(index, _bbox(table.get("bbox")) or (0, 0, page.width, page.height), grid,
                                 str(table.get("markdown", ""))))  # fmt: skip
    return tables


def page_context(page: Page, tables: Sequence[CleanTable] | None = None) -> str:
    """The page as text for a prompt: its markdown, with each table's text rebuilt from the words."""
    text = page.markdown or page.text
    for table in page_tables(page) if tables is None else tables:
        if table.original_markdown and table.original_markdown in text:
            text = text.replace(table.original_markdown, table.markdown(), 1)
    return text.strip()


def _on_page(snippet: str, page_norm: str) -> bool:
    quoted = normalize_whitespace(snippet)
    return len(quoted) >= MIN_EVIDENCE_CHARS and quoted in page_norm


def _evidence_for(candidates: Sequence[str], answer: str, page: Page, page_norm: str) -> str | None:
    """A quote from the page supporting ``answer``: a candidate found on the page, else the page line(s) holding it."""
    for candidate in candidates:
        if candidate and _on_page(candidate, page_norm):
            return candidate
    wanted = normalize_whitespace(answer)
    lines = [line.strip() for line in page.text.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if wanted and wanted in normalize_whitespace(line):
            quote = line
            j = i + 1
            while len(normalize_whitespace(quote)) < MIN_EVIDENCE_CHARS and j < len(lines):
                quote = f"{quote} {lines[j]}"
                j += 1
            if _on_page(quote, page_norm):
                return quote
    return None


def _page_label(page: Page) -> int:
    return page.page_no + 1


# --- the three kinds --------------------------------------------------------------------------


def _header_row(table: CleanTable) -> int | None:
    """The first row that reads like a header: not cut, every column but the first named once, short names."""
    for r, row in enumerate(table.grid[:3]):
        names = [c.text for c in row[1:]]
        if any(c.cut for c in row) or not all(names) or len(set(names)) != len(names):
            continue
        if all(len(n.split()) <= 6 for n in names):
            return r
    return None


def table_lookup_questions(page: Page, tables: Sequence[CleanTable], page_norm: str) -> list[Question]:
    out: list[Question] = []
    count = len(tables)
    for table in tables:
        if not table.grid or len(table.grid[0]) < 3:
            continue  # two columns are key-value pairs (field extraction), not a grid
        h = _header_row(table)
        if h is None:
            continue
        header = table.grid[h]
        body = [row for row in table.grid[h + 1 :] if row[0].text and not row[0].cut]
        labels = [row[0].text for row in body]
        if len(body) < 2 or len(set(labels)) != len(labels) or any(len(label.split()) > 8 for label in labels):
            continue
        where = f"the table on page {_page_label(page)}" if count == 1 else (
            f"table {table.index + 1} of {count} on page {_page_label(page)}")  # fmt: skip
        for row in body:
            row_text = " ".join(c.text for c in row if c.text)
            for c in range(1, len(row)):
                cell = row[c]
                if not cell.text or cell.cut or len(cell.text) > 200:
                    continue
                evidence = _evidence_for([row_text, cell.text], cell.text, page, page_norm)
                if evidence is None:
                    continue
                out.append(
                    Question(
                        kind="table_lookup",
                        page=page,
                        key=f"t{table.index}-r{row[0].text}-c{c}",
                        question=f'In {where}, what is the value in row "{row[0].text}", column "{header[c].text}"?',
                        answer=cell.text,
                        bbox=cell.bbox or table.bbox,
                        evidence=evidence,
                        extra={"table": table.index, "row": row[0].text, "column": header[c].text},
                    )  # fmt: skip
                )
    return out


_KV_LINE = re.compile(r"^\s*([A-Z][\w\-/.() ]{0,38}?[\w)])\s*:\s+(\S.{0,160}?)\s*$")


def key_value_pairs(page: Page, tables: Sequence[CleanTable]) -> list[tuple[str, str, BBox | None]]:
    """``Key: value`` lines of the page and rows of its two-column tables, keys unique on the page."""
    found: list[tuple[str, str, BBox | None]] = []
    blocks = (page.layout or {}).get("blocks", [])
    for line in page.text.splitlines():
        match = _KV_LINE.match(line)
        if not match:
            continue
        key, value = match.group(1).strip(), match.group(2).strip()
        if len(key.split()) > 4 or key.lower() in STOPWORDS or value.endswith(":") or len(value.split()) > 16:
            continue
        if key.split()[0].lower() in {"figure", "fig", "table", "chapter", "section", "note", "example"}:
            continue
        where = next((_bbox(b.get("bbox")) for b in blocks if line.strip() in str(b.get("text", ""))), None)
        found.append((key, value, where))
    for table in tables:
        if not table.grid or len(table.grid[0]) != 2:
            continue
        for row in table.grid:
            key, value = row[0], row[1]
            if key.cut or value.cut or not key.text or not value.text:
                continue
            if len(key.text.split()) > 6 or len(value.text.split()) > 40:
                continue
            found.append((key.text, value.text, union([key.bbox, value.bbox])))
    by_key: dict[str, set[str]] = {}
    for key, value, _ in found:
        by_key.setdefault(key, set()).add(value)
    seen: set[str] = set()
    pairs = []
    for key, value, box in found:
        if len(by_key[key]) == 1 and key not in seen:  # a key with two values is ambiguous
            seen.add(key)
            pairs.append((key, value, box))
    return pairs


def field_questions(page: Page, tables: Sequence[CleanTable], page_norm: str) -> list[Question]:
    pairs = [
        p
        for p in key_value_pairs(page, tables)
        if _on_page(p[1], page_norm) or len(normalize_whitespace(p[1])) < MIN_EVIDENCE_CHARS
    ]
    out: list[Question] = []
    for start in range(0, len(pairs), MAX_FIELDS_PER_TASK):
        group = pairs[start : start + MAX_FIELDS_PER_TASK]
        if len(group) < 2:
            continue
        keys = ", ".join(json.dumps(k, ensure_ascii=False) for k, _, _ in group)
        out.append(
            Question(
                kind="field_extraction",
                page=page,
                key=f"f{start}",
                question=(
                    f"From page {_page_label(page)}, extract these fields as one JSON object with exactly "
                    f"these keys: {keys}. Copy each value verbatim from the page."
                ),
                answer={k: v for k, v, _ in group},
                bbox=union(b for _, _, b in group) or (0.0, 0.0, page.width, page.height),
            )  # fmt: skip
        )
    return out


_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z“\"(])")
_TERM = re.compile(r"(?<![\w\\@.\-’'])([A-Z][A-Za-z]+|\d+(?:[.,]\d+)*)(?![\w\-’'@])")


def _sentences(text: str) -> list[str]:
    joined = re.sub(r"-\s*\n\s*", "", text)
    joined = re.sub(r"\s+", " ", joined).strip()
    return [s.strip() for s in _SENTENCE_SPLIT.split(joined) if s.strip()]


def _terms(sentence: str) -> list[str]:
    terms = []
    for match in _TERM.finditer(sentence):
        term = match.group(1)
        if term.lower() in STOPWORDS:
            continue
        if match.start() == 0 and not term.isdigit() and not any(ch.isupper() for ch in term[1:]):
            continue  # a sentence's first word is capitalised anyway
        if len(re.findall(rf"(?<![\w]){re.escape(term)}(?![\w])", sentence)) != 1:
            continue
        terms.append(term)
    return terms


def ocr_confidence(page: Page, box: BBox) -> float | None:
    """The mean confidence of the OCR words whose centre lies in ``box`` (the page's mean when none is stored there)."""
    layout = page.layout or {}
    found = [
        float(w["confidence"])
        for w in layout.get("words", [])
        if w.get("ocr") and w.get("confidence") is not None and (b := _bbox(w.get("bbox"))) is not None
        and box[0] <= (b[0] + b[2]) / 2 <= box[2] and box[1] <= (b[1] + b[3]) / 2 <= box[3]
    ]  # fmt: skip
    return sum(found) / len(found) if found else layout.get("ocr_confidence")


def span_questions(page: Page, tables: Sequence[CleanTable], page_norm: str) -> list[Question]:
    out: list[Question] = []
    table_boxes = [t.bbox for t in tables]
    for block in (page.layout or {}).get("blocks", []):
        box = _bbox(block.get("bbox"))
        if box is None or any(_overlap_share(box, t) > 0.5 for t in table_boxes):
            continue
        if block.get("ocr") and (ocr_confidence(page, box) or 0.0) < OCR_MIN_CONFIDENCE:
            continue  # OCR text read with too little confidence to ask about
        for n, sentence in enumerate(_sentences(str(block.get("text", "")))):
            words = sentence.split()
            if not 8 <= len(words) <= 45 or sentence[-1] not in ".!?" or re.search(r"[=\[\]{}<>|]", sentence):
                continue
            if not _on_page(sentence, page_norm):
                continue
            for term in _terms(sentence)[:3]:
                masked = _masked(sentence, term)
                out.append(
                    Question(
                        kind="span_recovery",
                        page=page,
                        key=f"s{block.get('order', 0)}-{n}-{term}",
                        question=_span_question(_page_label(page), masked),
                        answer=term,
                        bbox=box,
                        evidence=sentence,
                        extra={"masked": masked},
                    )  # fmt: skip
                )
    return out


def _masked(sentence: str, term: str) -> str:
    return re.sub(rf"(?<![\w]){re.escape(term)}(?![\w])", MASK, sentence, count=1)


def _span_question(label: int, masked: str) -> str:
    return (
        f'On page {label} this sentence appears with one term masked as {MASK}:\n"{masked}"\nWhat is the masked term?'
    )


# --- packaging --------------------------------------------------------------------------------

# the quote first: a reply reads the page before it answers (with the answer first, the real model answered every
# task with its worked example's answer and learned under GRPO to quote the right sentence below the wrong word)
DOC_QA_FORMAT = (
    'Reply in three lines: "Evidence: \\"<a short quote from the page that holds the answer>\\"", '
    '"Answer: <the answer>" and "Page: <page number>".'
)
JSON_FORMAT = "Reply with the JSON object only."


def _verifier(q: Question) -> tuple[dict[str, Any], str]:
    """(verifier ref, reference completion) for a question."""
    label = _page_label(q.page)
    if q.kind == "field_extraction":
        assert isinstance(q.answer, dict)
        schema = {
            "type": "object",
            "properties": {k: {"type": "string"} for k in q.answer},
            "required": list(q.answer),
        }
        spec = {"schema": schema, "expected": dict(q.answer), "partial_credit": True}
        return {"kind": "json_schema", "spec": spec}, json.dumps(q.answer, ensure_ascii=False)
    assert isinstance(q.answer, str) and q.evidence
    spec = {
        "answers": [q.answer], "metric": "exact", "require_evidence": True,
        "document_id": str(q.page.document_id), "page": label, "pages": {label: q.page.text},
    }  # fmt: skip
    return {"kind": "doc_qa", "spec": spec}, _doc_qa_reply(q.answer, q.evidence, label)


def _doc_qa_reply(answer: str, evidence: str, label: int) -> str:
    return f'Evidence: "{evidence}"\nAnswer: {answer}\nPage: {label}'


def _text_prompt(head: str, body: str, question: str, fmt: str) -> str:
    return f"{head}\n\n<page>\n{body}\n</page>\n\n{question}\n\n{fmt}"


def span_recovery_example(filename: str, page: int, excerpt: str, sentence: str, term: str) -> tuple[str, str]:
    """A worked example's (prompt, reply), worded as this builder words a span-recovery task on an excerpt
    (``passage_chars``): a preset's prompt format shows the model one that is not from the documents."""
    if sentence not in excerpt or term not in _terms(sentence):
        raise ValueError(f"a span-recovery example needs {sentence!r} in its excerpt and {term!r} one of its terms")
    question = _span_question(page, _masked(sentence, term))
    return (
        _text_prompt(f"Document: {filename}, page {page} (an excerpt).", excerpt, question, DOC_QA_FORMAT),
        _doc_qa_reply(term, sentence, page),
    )


def _base_id(q: Question, document: Document) -> str:
    return f"doc-{document.sha256[:12]}-p{q.page.page_no}-{q.kind}-{hashlib.sha1(q.key.encode()).hexdigest()[:10]}"


def _span_id(q: Question, document: Document) -> str:
    """The source span a question asks about: questions on the same span share a split, so no eval
    answer's span is ever a training target (two cells of one table row, two masks of one sentence)."""
    where = " ".join(q.evidence.casefold().split()) if q.evidence else ",".join(f"{v:.0f}" for v in q.bbox)
    return f"{document.sha256}:{q.page.page_no}:{where}"


def _eval_spans(questions: Sequence[Question], document: Document, seed: int, eval_fraction: float) -> set[str]:
    """The spans held out for evaluation: picked by a seeded hash (stable, independent of question order)
    until they hold ``round(eval_fraction * n)`` questions (at least one when the fraction is positive and
    there are two or more), never splitting a span."""
    n = len(questions)
    k = round(eval_fraction * n)
    if eval_fraction > 0 and n >= 2:
        k = max(k, 1)
    sizes: dict[str, int] = {}
    for q in questions:
        span = _span_id(q, document)
        sizes[span] = sizes.get(span, 0) + 1
    held: set[str] = set()
    count = 0
    for span in sorted(sizes, key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).digest()):
        if count + sizes[span] <= k and len(held) < len(sizes) - 1:
            held.add(span)
            count += sizes[span]
    return held


class _Images:
    """Page renders encoded once per page for vision prompts."""

    def __init__(self) -> None:
        self._cache: dict[int, Any] = {}

    def get(self, page: Page) -> Any:

        if page.page_no not in self._cache:
            encoded = None
            if page.image_path and Path(page.image_path).is_file():
                with Image.open(page.image_path) as image:
                    image.load()
                    encoded = encode_image(image)
            self._cache[page.page_no] = encoded
        return self._cache[page.page_no]


def passage(text: str, evidence: str, chars: int) -> str | None:
    """The part of ``text`` around ``evidence``: about ``chars`` characters (never less than the evidence), cut at
    sentence ends where one falls in the margin, else at a space; None when the evidence is not in the text."""
    flat, quote = " ".join(text.split()), " ".join(evidence.split())
    start = flat.find(quote)
    if start < 0:
        return None
    end = start + len(quote)
    margin = max(0, chars - len(quote)) // 2
    lo, hi = max(0, start - margin), min(len(flat), end + margin)
    if lo > 0:
        cut = flat.find(". ", lo, start)
        lo = cut + 2 if cut >= 0 else flat.find(" ", lo, start) + 1
    if hi < len(flat):
        cut = flat.rfind(". ", end - 1, hi)
        hi = cut + 1 if cut >= 0 else max(end, flat.rfind(" ", end, hi))
    return flat[lo:hi]


def _specs_for(q: Question, document: Document, context: str, images: _Images | None,
               split: str, passage_chars: int | None = None) -> list[TaskSpec]:  # fmt: skip
    verifier, reference = _verifier(q)
    fmt = JSON_FORMAT if q.kind == "field_extraction" else DOC_QA_FORMAT
    base_id = _base_id(q, document)
    excerpt = passage(q.page.text, q.evidence, passage_chars) if passage_chars and q.evidence else None
    provenance = {
        # the page as the prompt and the viewer number it, from 1 (tasks built before "pages_from" counted from 0)
        "document_id": document.id, "page": _page_label(q.page), "pages_from": 1, "bbox": [round(v, 2) for v in q.bbox],
        "filename": document.filename, "sha256": document.sha256,
        "span": hashlib.sha256(_span_id(q, document).encode()).hexdigest()[:16],
    }  # fmt: skip
    metadata = {"builder": "documents", "kind": q.kind, "question": q.question, **q.extra}
    head = f"Document: {document.filename}, page {_page_label(q.page)}."
    text_head, body = (head, context) if excerpt is None else (f"{head[:-1]} (an excerpt).", excerpt)
    if excerpt is not None:
        metadata["passage_chars"] = len(excerpt)
    text_prompt = _text_prompt(text_head, body, q.question, fmt)
    specs = [
        TaskSpec(
            domain=DOMAINS[q.kind],
            prompt=text_prompt,
            verifier=verifier,
            reference=reference,
            split=split,
            task_id=base_id,
            metadata={**metadata, "modality": "text"},
            provenance=provenance,
        )  # fmt: skip
    ]
    encoded = images.get(q.page) if images is not None else None
    if encoded is not None:
        content = [
            encoded.message_part,
            {"type": "text", "text": f"{head} The page image is above.\n\n{q.question}\n\n{fmt}"},
        ]
        specs.append(
            TaskSpec(
                domain=DOMAINS[q.kind] + VISION_SUFFIX,
                prompt=[{"role": "user", "content": content}],
                verifier=verifier,
                reference=reference,
                split=split,
                task_id=base_id + "-vision",
                metadata={
                    **metadata,
                    "modality": "vision",
                    "visual_tokens": encoded.visual_tokens,
                    "image_size": [encoded.width, encoded.height],
                },
                provenance=provenance,
            )  # fmt: skip
        )
    return specs


_GENERATORS = {
    "table_lookup": table_lookup_questions,
    "field_extraction": field_questions,
    "span_recovery": span_questions,
}


def why_no_tasks(kind: str, pages: Sequence[Page]) -> str:
    """Why ``pages`` gave no task of ``kind``: what the builder looks for, and how much of it the pages hold."""
    if kind == "table_lookup":
        tables = sum(len(page_tables(p)) for p in pages)
        if not tables:
            return f"no table was detected on its {len(pages)} pages"
        return (
            f"{tables} tables were detected on its {len(pages)} pages, but none is a grid of three or more columns "
            "with a header row and two or more rows of distinct labels"
        )
    if kind == "field_extraction":
        return f"none of its {len(pages)} pages has two or more label-value pairs (label: value lines or a two-column table)"
    return (
        f"none of its {len(pages)} pages has a prose sentence of 8 to 45 words outside tables, found in the page's "
        f"text layer (OCR'd text read with a mean confidence of {OCR_MIN_CONFIDENCE:.0f} or more), with a term to mask"
    )


def questions_for_pages(pages: Sequence[Page], kinds: Sequence[str] = KINDS) -> dict[str, list[Question]]:
    """Every candidate question of ``pages``, by kind, in page order."""
    found: dict[str, list[Question]] = {k: [] for k in kinds}
    for page in pages:
        tables = page_tables(page)
        page_norm = normalize_whitespace(page.text)
        for kind in kinds:
            found[kind] += _GENERATORS[kind](page, tables, page_norm)
    return found


def build_from_pages(
    document: Document,
    pages: Sequence[Page],
    *,
    kinds: Sequence[str] = KINDS,
    vision: bool = False,
    max_per_document: int = 50,
    eval_fraction: float = 0.1,
    seed: int = 0,
    passage_chars: int | None = None,
) -> list[TaskSpec]:
    """Tasks from a document's stored pages: up to ``max_per_document`` questions, the kinds taking
    turns, each asked over the text (the whole page, or with ``passage_chars`` the passage around the
    question's evidence) and (``vision``) over the page image."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise DocumentBuildError(f"unknown task kind(s) {unknown}; choose from {list(KINDS)}")
    if vision and not any(p.image_path and Path(p.image_path).is_file() for p in pages):
        raise DocumentBuildError(
            f"document {document.id} ({document.filename}) has no page renders for vision tasks; "
            "preprocess it again with render_dpi set, or build without vision"
        )
    rng = random.Random(f"{seed}:{document.sha256}")
    candidates = questions_for_pages(pages, kinds)
    for kind in kinds:
        rng.shuffle(candidates[kind])
    chosen: list[Question] = []
    queues = [list(candidates[k]) for k in kinds]
    while len(chosen) < max_per_document and any(queues):
        for queue in queues:
            if queue and len(chosen) < max_per_document:
                chosen.append(queue.pop())
    by_page = {p.page_no: p for p in pages}
    contexts: dict[int, str] = {}
    images = _Images() if vision else None
    held_out = _eval_spans(chosen, document, seed, eval_fraction)
    specs: list[TaskSpec] = []
    for q in chosen:
        if q.page.page_no not in contexts:
            contexts[q.page.page_no] = page_context(by_page[q.page.page_no])
        split = "eval" if _span_id(q, document) in held_out else "train"
        specs += _specs_for(q, document, contexts[q.page.page_no], images, split, passage_chars)
    return specs


def load_ready_document(document_id: int, *, url: str | None = None) -> tuple[Document, list[Page]]:
    """The document and its pages, or a :class:`DocumentBuildError` saying why it cannot give tasks."""
    try:
        document = get_document(document_id, url=url)
    except LookupError:
        raise DocumentBuildError(
            f"document {document_id} does not exist (it was deleted, or the id is wrong); "
            "see `posttrain docs list` or the Documents page"
        ) from None
    if document.status is not DocumentStatus.ready:
        hint = f": {document.error}" if document.error else ""
        raise DocumentBuildError(
            f"document {document_id} ({document.filename}) is {document.status.value}{hint}; "
            "build tasks once its preprocess job has succeeded"
        )
    pages = get_pages(document_id, url=url)
    if not pages:
        raise DocumentBuildError(f"document {document_id} ({document.filename}) has no pages; preprocess it again")
    return document, pages


def build_document_tasks(
    document_id: int,
    *,
    kinds: Sequence[str] = KINDS,
    vision: bool = False,
    max_per_document: int = 50,
    eval_fraction: float = 0.1,
    seed: int = 0,
    passage_chars: int | None = None,
    url: str | None = None,
) -> list[TaskSpec]:
    """Tasks from one stored, preprocessed document (see the module docstring)."""
    document, pages = load_ready_document(document_id, url=url)
    return build_from_pages(
        document, pages, kinds=kinds, vision=vision, max_per_document=max_per_document,
        eval_fraction=eval_fraction, seed=seed, passage_chars=passage_chars,
    )  # fmt: skip
