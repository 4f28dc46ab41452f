"""OCR with the Tesseract command line (Debian: tesseract-ocr, tesseract-ocr-eng).

The image goes in on stdin as PNG; TSV comes back with one row per word,
its box in pixels and its confidence (0-100).
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from dataclasses import dataclass

from PIL import Image

from posttrain.preprocess.errors import OcrFailed, OcrUnavailable

INSTALL_HINT = "install it with: apt-get install tesseract-ocr tesseract-ocr-eng"


@dataclass(frozen=True)
class OcrWord:
    text: str
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 in pixels
    confidence: float
    block: int
    line: tuple[int, int, int]  # block, paragraph, line


def tesseract_path() -> str:
    path = shutil.which("tesseract")
    if path is None:
        raise OcrUnavailable(f"OCR needs the tesseract program, which is not on PATH; {INSTALL_HINT}")
    return path


def ocr_image(image: Image.Image, *, language: str = "eng", timeout_s: float = 120.0) -> list[OcrWord]:
    """Run Tesseract on ``image`` and return its words with boxes and confidences."""
    exe = tesseract_path()
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    try:
        proc = subprocess.run(
            [exe, "stdin", "stdout", "-l", language, "--psm", "3", "tsv"],
            input=buf.getvalue(),
            capture_output=True,
            timeout=timeout_s,
            env={"OMP_THREAD_LIMIT": "1", "PATH": "/usr/bin:/bin"},
        )
    except subprocess.TimeoutExpired:
        raise OcrFailed(f"tesseract took longer than {timeout_s:.0f}s on one page; raise page_timeout_s") from None
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()
        if "Failed loading language" in err or "Error opening data file" in err:
            raise OcrUnavailable(
                f"tesseract has no language data for {language!r}; install tesseract-ocr-{language.split('+')[0]}"
            )
        raise OcrFailed(f"tesseract failed with exit code {proc.returncode}: {err[-300:]}")
    return parse_tsv(proc.stdout.decode("utf-8", "replace"))


def parse_tsv(tsv: str) -> list[OcrWord]:
    words: list[OcrWord] = []
    reader = csv.DictReader(io.StringIO(tsv), delimiter="\t", quoting=csv.QUOTE_NONE)
    for row in reader:
        if row.get("level") != "5":
            continue
        text = (row.get("text") or "").strip()
        conf = float(row.get("conf") or -1)
        if not text or conf < 0:
            continue
        left, top = int(row["left"]), int(row["top"])
        width, height = int(row["width"]), int(row["height"])
        block, par, line = int(row["block_num"]), int(row["par_num"]), int(row["line_num"])
        words.append(OcrWord(text, (left, top, left + width, top + height), conf, block, (block, par, line)))
    return words
