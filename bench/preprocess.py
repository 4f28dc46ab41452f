"""Benchmark of the document preprocessing pipeline against pymupdf4llm, on real PDFs.

    .venv/bin/python bench/preprocess.py [--max-pages N] [--workers 2]

Corpus: PDFs that Debian documentation packages ship (texlive-latex-base-doc,
python-reportlab-doc, glpk-doc). Prints one JSON object per figure; the last
line holds pages, pages_per_s, peer_pages_per_s, speedup, their one-process
figures, f1 and ``peer`` (the peer's setting).

- pages_per_s: full extraction (spans with boxes, reading order, tables where
  cued, embedded images, encodings (a) markdown and (b) LayoutLM words) in
  ``--workers`` worker processes; page renders and OCR are timed separately.
- peer_pages_per_s: pymupdf4llm.to_markdown on the same pages in the same run
  (its classic mode, which runs find_tables on every page; the ONNX layout mode
  is far slower still), in as many processes as ours, the pages split the same
  way: per document, the processes take one page at a time from a shared queue.
  The document's header scan (pymupdf4llm's IdentifyHeaders, which every
  to_markdown call would otherwise repeat over the whole document) runs once per
  document and is timed; the text is the same one to_markdown call over all the
  pages gives. The peer's processes are spawned and warmed up before its clock
  starts (forking after pymupdf4llm's use_layout(False) hangs the children in MuPDF); ours
  are forked per document, inside our clock.
- pages_per_s_1_process / peer_pages_per_s_1_process: both again in one process
  (ours: one worker; the peer: one to_markdown call per document).
- Warm-up, both sides alike: one page of the first document in every process, untimed.
- f1: word-level F1 of our page words against pdftotext (poppler-utils).
Table detection is measured against hand labels by bench/tables.py.
"""

from __future__ import annotations

import os
import sys

# Running a script puts its folder first on sys.path, where sibling benchmarks (bench/queue.py, ...)
# would shadow standard-library modules: drop it before anything else is imported.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse
import glob
import importlib.metadata
import json
import pickle
import subprocess
import time
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

CORPUS_GLOBS = [
    "/usr/share/doc/texlive-doc/latex/base/ltnews[0-9]*.pdf",  # two-column newsletters
    "/usr/share/doc/python-reportlab-doc/reportlab-userguide.pdf",  # tables, code, figures
    "/usr/share/doc/texlive-doc/latex/base/*guide.pdf",  # LaTeX guides with ruled tables
    "/usr/share/doc/glpk-doc/*.pdf",  # long technical manuals
]


def emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def corpus(max_pages: int | None) -> list[tuple[Path, int]]:
    """(file, pages to use) in a fixed order, up to max_pages pages in all."""
    import pymupdf

    out: list[tuple[Path, int]] = []
    total = 0
    for pattern in CORPUS_GLOBS:
        for name in sorted(glob.glob(pattern)):
            with pymupdf.open(name) as doc:
                n = doc.page_count
            if max_pages is not None:
                n = min(n, max_pages - total)
            if n <= 0:
                break
            out.append((Path(name), n))
            total += n
    return out


def words_of(text: str) -> Counter[str]:
    return Counter(unicodedata.normalize("NFKC", text).split())


def f1_counts(ours: Counter[str], ref: Counter[str]) -> tuple[int, int, int]:
    overlap = sum((ours & ref).values())
    return overlap, sum(ours.values()), sum(ref.values())


def pdftotext_pages(path: Path, n: int) -> list[str]:
    out = subprocess.run(
        ["pdftotext", "-q", "-enc", "UTF-8", "-f", "1", "-l", str(n), str(path), "-"],
        capture_output=True,
        check=True,
        timeout=300,
    ).stdout.decode("utf-8", "replace")
    pages = out.split("\f")
    return (pages + [""] * n)[:n]


# The peer runs in its own spawned processes: after pymupdf4llm.use_layout(False) (its classic mode),
# processes forked from that one hang inside MuPDF (seen on 2 cores: find_tables and get_text never
# return, our workers' pages time out), so neither its workers nor ours may fork from a process that
# switched it. This one never does; its pymupdf4llm (which ``import pymupdf`` imports) stays as loaded.
_PEER_DOCS: dict[str, Any] = {}  # the document a peer process has open
_PEER_HEADERS: dict[str, Any] = {}  # its IdentifyHeaders
_PEER_BARRIER: Any = None


def _peer_init(barrier: Any) -> None:
    import pymupdf4llm

    global _PEER_BARRIER
    pymupdf4llm.use_layout(False)
    _PEER_BARRIER = barrier


def _peer_doc(path: str) -> Any:
    import pymupdf

    if path not in _PEER_DOCS:
        for doc in _PEER_DOCS.values():
            doc.close()
        _PEER_DOCS.clear()
        _PEER_HEADERS.clear()
        _PEER_DOCS[path] = pymupdf.open(path)
    return _PEER_DOCS[path]


def _peer_warmup(path: str) -> None:
    import pymupdf4llm

    pymupdf4llm.to_markdown(_peer_doc(path), pages=[0], show_progress=False)
    _PEER_BARRIER.wait(300)  # one warm-up task per process: each is started and warm before timing


def _peer_headers(path: str) -> bytes:
    """pymupdf4llm's header scan of the whole document, which every to_markdown call starts with."""
    from pymupdf4llm.helpers.pymupdf_rag import IdentifyHeaders

    return pickle.dumps(IdentifyHeaders(_peer_doc(path)))


def _peer_page(task: tuple[str, int, bytes]) -> str:
    import pymupdf4llm

    path, index, headers = task
    doc = _peer_doc(path)
    if path not in _PEER_HEADERS:
        _PEER_HEADERS[path] = pickle.loads(headers)
    return pymupdf4llm.to_markdown(doc, pages=[index], hdr_info=_PEER_HEADERS[path], show_progress=False)


def _peer_document(path: str, n: int) -> str:
    import pymupdf4llm

    return pymupdf4llm.to_markdown(_peer_doc(path), pages=list(range(n)), show_progress=False)


def run_peer(files: list[tuple[Path, int]], processes: int) -> tuple[float, int]:
    """(seconds, markdown characters) of pymupdf4llm over ``files`` in ``processes`` processes, started
    and warmed up (one page each) before the clock starts. One process: one to_markdown call per
    document. More: per document, the header scan once, then the processes take one page at a time,
    as our pipeline's workers do; the text is the same one to_markdown call gives."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    chars = 0
    with ctx.Pool(processes, initializer=_peer_init, initargs=(ctx.Barrier(processes),)) as pool:
        pool.map(_peer_warmup, [str(files[0][0])] * processes, chunksize=1)
        started = time.perf_counter()
        for path, n in files:
            if processes == 1:
                chars += len(pool.apply(_peer_document, (str(path), n)))
                continue
            headers = pool.apply(_peer_headers, (str(path),))
            tasks = [(str(path), i, headers) for i in range(n)]
            chars += sum(len(text) for text in pool.imap(_peer_page, tasks, chunksize=1))
        seconds = time.perf_counter() - started
    return seconds, chars


def run_ours(files: list[tuple[Path, int]], options: object) -> tuple[float, dict[tuple[str, int], tuple]]:
    """(seconds, per page: words, table boxes, markdown length) of our pipeline over ``files``."""
    from posttrain.preprocess.pipeline import process_document

    pages: dict[tuple[str, int], tuple] = {}
    started = time.perf_counter()
    for path, n in files:
        for page in process_document(path, options, pages=range(1, n + 1)):  # type: ignore[arg-type]
            pages[(str(path), page.page_number)] = (page.words, [t.bbox for t in page.tables], len(page.markdown or ""))
    return time.perf_counter() - started, pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-pages", type=int, default=None, help="use at most this many pages (quick run)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--render-pages", type=int, default=40, help="pages rendered for the render figure")
    parser.add_argument("--ocr-pages", type=int, default=3, help="pages OCRed for the OCR figure")
    args = parser.parse_args(argv)

    from posttrain.preprocess.options import PreprocessOptions
    from posttrain.preprocess.pipeline import process_document

    files = corpus(args.max_pages)
    n_pages = sum(n for _, n in files)
    emit({"figure": "corpus", "files": len(files), "pages": n_pages, "globs": CORPUS_GLOBS})
    if n_pages == 0:
        emit({"error": "no corpus: apt-get install texlive-latex-base-doc python-reportlab-doc glpk-doc"})
        return 1

    # 1. our full extraction pipeline and the peer, in --workers processes each, then in one process each.
    # Warm-up, the same for both: one page of the first document (imports, worker start-up), untimed.
    options = PreprocessOptions(workers=args.workers, render_dpi=None, tables="auto", encodings=True)
    t0 = time.perf_counter()
    list(process_document(files[0][0], options, pages=[1]))
    emit({"figure": "startup", "seconds": round(time.perf_counter() - t0, 2)})
    import pymupdf

    ours_s, ours = run_ours(files, options)
    peer_s, peer_chars = run_peer(files, args.workers)
    ours_1_s, _ = run_ours(files, options.model_copy(update={"workers": 1}))
    assert pymupdf._get_layout is not None, "this process forks our workers: it must not switch pymupdf4llm's mode"
    peer_1_s, _ = run_peer(files, 1)
    pages_per_s, peer_pages_per_s = n_pages / ours_s, n_pages / peer_s
    pages_per_s_1, peer_pages_per_s_1 = n_pages / ours_1_s, n_pages / peer_1_s
    peer = {
        "name": "pymupdf4llm.to_markdown",
        "version": importlib.metadata.version("pymupdf4llm"),
        "mode": "classic (use_layout(False))",
        "processes": args.workers,
        "split": "per document, the processes take one page at a time (as ours)",
        "warmup": "one page of the first document in each process, untimed (as ours)",
        "rounds": 1,
    }
    emit(
        {
            "figure": "extraction",
            "pages": n_pages,
            "processes": args.workers,
            "seconds": round(ours_s, 2),
            "pages_per_s": round(pages_per_s, 2),
            "peer_pages_per_s": round(peer_pages_per_s, 2),
            "speedup": round(pages_per_s / peer_pages_per_s, 2),
            "peer": peer,
            "peer_markdown_chars": peer_chars,
        }
    )
    emit(
        {
            "figure": "extraction_1_process",
            "pages": n_pages,
            "processes": 1,
            "seconds": round(ours_1_s, 2),
            "pages_per_s": round(pages_per_s_1, 2),
            "peer_pages_per_s": round(peer_pages_per_s_1, 2),
            "speedup": round(pages_per_s_1 / peer_pages_per_s_1, 2),
            "peer": {**peer, "processes": 1, "split": "one to_markdown call per document"},
        }
    )

    # 2. renders and OCR, timed apart
    from posttrain.preprocess.ocr import ocr_image
    from posttrain.preprocess.pdf import render_page

    rendered = 0
    t = time.perf_counter()
    for path, n in files:
        with pymupdf.open(path) as doc:
            for i in range(min(n, args.render_pages - rendered)):
                render_page(doc[i], 144)
                rendered += 1
        if rendered >= args.render_pages:
            break
    render_s = time.perf_counter() - t
    emit(
        {
            "figure": "render",
            "dpi": 144,
            "pages": rendered,
            "pages_per_s": round(rendered / render_s, 2) if rendered else None,
        }
    )

    from PIL import Image

    ocred = 0
    t = time.perf_counter()
    with pymupdf.open(files[0][0]) as doc:
        for i in range(min(args.ocr_pages, doc.page_count)):
            pix = doc[i].get_pixmap(dpi=300, colorspace=pymupdf.csGRAY)
            ocr_image(Image.frombytes("L", (pix.width, pix.height), pix.samples))
            ocred += 1
    ocr_s = time.perf_counter() - t
    emit({"figure": "ocr", "dpi": 300, "pages": ocred, "pages_per_s": round(ocred / ocr_s, 3) if ocred else None})

    # 3. word-level F1 against pdftotext
    overlap = ours_total = ref_total = 0
    for path, n in files:
        for number, ref_text in enumerate(pdftotext_pages(path, n), start=1):
            words = ours[(str(path), number)][0]
            o, a, b = f1_counts(words_of(" ".join(w.text for w in words)), words_of(ref_text))
            overlap, ours_total, ref_total = overlap + o, ours_total + a, ref_total + b
    precision = overlap / ours_total if ours_total else 0.0
    recall = overlap / ref_total if ref_total else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    emit(
        {"figure": "f1_vs_pdftotext", "precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4)}
    )

    emit(
        {
            "figure": "preprocess",
            "pages": n_pages,
            "pages_per_s": round(pages_per_s, 2),
            "peer_pages_per_s": round(peer_pages_per_s, 2),
            "speedup": round(pages_per_s / peer_pages_per_s, 2),
            "pages_per_s_1_process": round(pages_per_s_1, 2),
            "peer_pages_per_s_1_process": round(peer_pages_per_s_1, 2),
            "speedup_1_process": round(pages_per_s_1 / peer_pages_per_s_1, 2),
            "f1": round(f1, 4),
            "render_pages_per_s": round(rendered / render_s, 2) if rendered else None,
            "ocr_pages_per_s": round(ocred / ocr_s, 3) if ocred else None,
            "workers": args.workers,
            "peer": peer,
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
