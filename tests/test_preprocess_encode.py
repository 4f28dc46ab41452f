"""Encodings (a) markdown, (b) LayoutLM words, (c) Qwen2-VL image input, and token counts."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from posttrain.preprocess.chunking import chunk_document, pack_document
from posttrain.preprocess.layoutlm import layout_words, normalize_box
from posttrain.preprocess.markdown import page_elements, page_markdown
from posttrain.preprocess.models import PageResult
from posttrain.preprocess.options import PreprocessOptions
from posttrain.preprocess.pipeline import process_document
from posttrain.preprocess.tokens import as_token_counter
from posttrain.preprocess.vision import encode_page_image, smart_resize

LTNEWS = Path("/usr/share/doc/texlive-doc/latex/base/ltnews30.pdf")
REPORTLAB = Path("/usr/share/doc/python-reportlab-doc/reportlab-userguide.pdf")


@pytest.fixture(scope="module")
def pages() -> list[PageResult]:
    return list(process_document(LTNEWS, PreprocessOptions(workers=2, render_dpi=72)))


@pytest.fixture(scope="module")
def tokenizer(pages: list[PageResult]) -> Tokenizer:
    """A word-level tokenizer trained here on the document itself: nothing comes from a hub."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([p.text for p in pages], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    return tok


def test_markdown_headings_and_order(pages: list[PageResult]) -> None:
    md = pages[0].markdown or ""
    assert md.startswith("# ")  # the LaTeX News masthead is the largest text
    elements = page_elements(pages[0])
    headings = [e for e in elements if e.kind == "heading"]
    assert any(e.text.startswith("LATEX-dev formats now available") for e in headings)
    assert md.index("LATEX-dev formats now available") < md.index("Our hopes")


def test_markdown_tables_and_lists() -> None:
    (page,) = process_document(REPORTLAB, PreprocessOptions(workers=1), pages=[18])
    md = page_markdown(page)
    assert page.tables and page.tables[0].markdown in md


def test_layoutlm_boxes(pages: list[PageResult], tokenizer: Tokenizer) -> None:
    enc = layout_words(pages[1], tokenizer)
    assert len(enc.words) == len(enc.boxes) == len(pages[1].words) > 100
    assert all(0 <= v <= 1000 for box in enc.boxes for v in box)
    assert all(b[0] <= b[2] and b[1] <= b[3] for b in enc.boxes)
    assert enc.token_count is not None and enc.token_count >= len(enc.words)
    assert normalize_box((0, 0, 612, 792), 612, 792) == (0, 0, 1000, 1000)
    assert normalize_box((306, 396, 700, 900), 612, 792) == (500, 500, 1000, 1000)


@pytest.mark.parametrize("size", [(10, 10), (792, 612), (3300, 2550), (28, 5000), (1000, 1000), (99, 301)])
def test_smart_resize_matches_transformers(size: tuple[int, int]) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as reference

    h, w = size
    ours = smart_resize(h, w, min_pixels=3136, max_pixels=1003520)
    assert ours == tuple(reference(h, w, factor=28, min_pixels=3136, max_pixels=1003520))
    assert ours[0] % 28 == 0 and ours[1] % 28 == 0 and 3136 <= ours[0] * ours[1] <= 1003520


def test_visual_tokens_match_qwen2vl_processor(pages: list[PageResult]) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    enc = encode_page_image(pages[0])
    processor = Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=1003520)
    with Image.open(io.BytesIO(pages[0].render.png)) as image:
        out = processor(images=image.convert("RGB"), return_tensors="np")
    t, gh, gw = (int(v) for v in out["image_grid_thw"][0])
    assert enc.visual_tokens == t * gh * gw // 4
    assert (enc.height, enc.width) == (gh * 14, gw * 14)
    assert enc.message_part["type"] == "image_url"
    assert enc.message_part["image_url"]["url"].startswith("data:image/png;base64,")


def test_token_counters_accept_any_tokenizer(tokenizer: Tokenizer) -> None:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]")
    text = "LaTeX News is typeset in two columns"
    counts = {
        as_token_counter(tokenizer)(text),
        as_token_counter(hf)(text),
        as_token_counter(lambda s: len(s.split()))(text),
    }
    assert counts == {7}
    with pytest.raises(TypeError, match="not a tokenizer"):
        as_token_counter(42)


def test_chunks_respect_budget_and_carry_provenance(pages: list[PageResult], tokenizer: Tokenizer) -> None:
    count = as_token_counter(tokenizer)
    chunks = chunk_document(pages, max_tokens=120, tokenizer=tokenizer)
    assert len(chunks) > 5
    for chunk in chunks:
        assert chunk.token_count == count(chunk.text)
        assert chunk.token_count <= 120 or chunk.oversize
        assert chunk.pages and chunk.provenance and all(1 <= p.page <= 4 for p in chunk.provenance)
    with_path = [c for c in chunks if c.heading_path == ["LATEX News", "Improving Unicode handling in pdfTEX"]]
    assert with_path and 2 in with_path[0].pages
    joined = " ".join(c.text for c in chunks)
    assert count(joined) >= 0.95 * sum(count(p.markdown or "") for p in pages)  # nothing dropped


def test_tables_stay_whole_in_chunks(tokenizer: Tokenizer) -> None:
    pages = list(process_document(REPORTLAB, PreprocessOptions(workers=1), pages=[19, 20, 21]))
    tables = [t.markdown for p in pages for t in p.tables]
    chunks = chunk_document(pages, max_tokens=40, tokenizer=lambda s: len(s.split()))
    for table in tables:
        assert any(table in c.text for c in chunks)


def test_pack_document(pages: list[PageResult], tokenizer: Tokenizer) -> None:
    count = as_token_counter(tokenizer)
    whole = pack_document(pages, max_model_len=100_000, tokenizer=tokenizer)
    assert not whole.truncated and whole.pages_included == [1, 2, 3, 4] and whole.cut == []
    small = pack_document(pages, max_model_len=whole.token_count // 2, tokenizer=tokenizer, reserve_tokens=10)
    assert small.truncated and small.token_count <= small.budget
    assert count(small.text) == small.token_count
    assert 4 in small.pages_cut and small.cut_tokens > 0 and "cut" in small.summary
    assert small.text.startswith("<!-- page 1 -->")
