"""Turn OCR words into the page model: blocks, lines, spans and words marked as OCR."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from posttrain.preprocess.models import Block, Line, Span, Word
from posttrain.preprocess.ocr import OcrWord
from posttrain.preprocess.reading_order import reading_order


def _union(boxes: Sequence[tuple[float, float, float, float]]) -> tuple[float, float, float, float]:
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def ocr_to_page_content(words: Sequence[OcrWord], scale: float) -> tuple[list[Block], list[Word], float | None]:
    """Group OCR words into blocks (Tesseract's) in reading order; boxes scaled by ``scale``.

    Returns the blocks, the words and the mean word confidence (None without words).
    """
    by_block: OrderedDict[int, OrderedDict[tuple[int, int, int], list[OcrWord]]] = OrderedDict()
    for w in words:
        by_block.setdefault(w.block, OrderedDict()).setdefault(w.line, []).append(w)

    def sc(box: tuple[int, int, int, int]) -> tuple[float, float, float, float]:
        return (box[0] * scale, box[1] * scale, box[2] * scale, box[3] * scale)

    raw_blocks: list[tuple[tuple[float, float, float, float], list[Line], list[list[OcrWord]]]] = []
    for lines in by_block.values():
        model_lines: list[Line] = []
        word_lines: list[list[OcrWord]] = []
        for line_words in lines.values():
            box = _union([sc(w.box) for w in line_words])
            text = " ".join(w.text for w in line_words)
            size = round((box[3] - box[1]) * 0.8, 1)
            model_lines.append(Line(bbox=box, spans=[Span(text=text, bbox=box, font="ocr", size=size)]))
            word_lines.append(line_words)
        raw_blocks.append((_union([ln.bbox for ln in model_lines]), model_lines, word_lines))

    order = reading_order([b[0] for b in raw_blocks])
    blocks: list[Block] = []
    out_words: list[Word] = []
    for rank, idx in enumerate(order):
        bbox, block_lines, word_lines = raw_blocks[idx]
        blocks.append(Block(order=rank, bbox=bbox, lines=block_lines, ocr=True))
        for line_no, line_words in enumerate(word_lines):
            for w in line_words:
                out_words.append(
                    Word(text=w.text, bbox=sc(w.box), block=rank, line=line_no, ocr=True, confidence=w.confidence)
                )
    mean = sum(w.confidence for w in words) / len(words) if words else None
    return blocks, out_words, mean
