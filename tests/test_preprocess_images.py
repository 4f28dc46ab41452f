"""Images (Pillow) and OCR (Tesseract) on real photos and scans from Debian's opencv-doc."""

from __future__ import annotations

from pathlib import Path

import pymupdf
import pytest
from PIL import Image

from posttrain.preprocess.errors import CorruptDocument, ImageTooLarge
from posttrain.preprocess.images import load_frame
from posttrain.preprocess.options import PreprocessOptions
from posttrain.preprocess.pipeline import inspect_document, process_document

OPENCV = Path("/usr/share/doc/opencv-doc/examples/data")  # Debian package opencv-doc
PHOTO = OPENCV / "fruits.jpg"
SCAN = OPENCV / "imageTextN.png"  # a scanned book page
LTNEWS = Path("/usr/share/doc/texlive-doc/latex/base/ltnews30.pdf")
NO_OCR = PreprocessOptions(ocr="never", workers=1)


def test_real_photo_is_one_normalised_page() -> None:
    assert PHOTO.exists(), "install the Debian package opencv-doc"
    info = inspect_document(PHOTO)
    assert info.page_count == 1 and info.kind.value == "jpeg"
    (page,) = process_document(PHOTO, NO_OCR)
    with Image.open(PHOTO) as original:
        assert (page.width, page.height) == original.size
    assert page.render is not None and page.render.png.startswith(b"\x89PNG")


def test_size_limit_scales_down() -> None:
    image = load_frame(PHOTO, 0, PreprocessOptions(max_image_side=128))
    assert max(image.size) == 128 and image.mode == "RGB"


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    image = Image.new("RGB", (40, 20), (255, 0, 0))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    path = tmp_path / "rotated.jpg"
    image.save(path, exif=exif.tobytes())
    assert load_frame(path, 0, PreprocessOptions()).size == (20, 40)


def test_multipage_tiff_and_modes(tmp_path: Path) -> None:
    frames = [Image.new("L", (30, 20), 10), Image.new("RGBA", (20, 30), (0, 0, 0, 0)), Image.new("1", (10, 10))]
    path = tmp_path / "scan.tif"
    frames[0].save(path, save_all=True, append_images=frames[1:])
    pages = list(process_document(path, NO_OCR))
    assert [(p.page_number, p.width, p.height) for p in pages] == [(1, 30, 20), (2, 20, 30), (3, 10, 10)]
    assert load_frame(path, 1, PreprocessOptions()).getpixel((0, 0)) == (255, 255, 255)  # alpha on white


@pytest.mark.parametrize("fmt", ["WEBP", "BMP", "PNG"])
def test_other_formats(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"x.{fmt.lower()}"
    Image.new("P", (16, 12)).save(path, format=fmt)
    (page,) = process_document(path, NO_OCR)
    assert (page.width, page.height) == (16, 12)


def test_decompression_bomb_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bomb.png"
    Image.new("1", (12000, 12000)).save(path)  # 144 Mpx, compresses to a few KB
    with pytest.raises(ImageTooLarge, match="decompression bomb"):
        inspect_document(path, PreprocessOptions(max_image_pixels=50_000_000))


def test_truncated_image_is_corrupt(tmp_path: Path) -> None:
    data = PHOTO.read_bytes()
    path = tmp_path / "cut.jpg"
    path.write_bytes(data[: len(data) // 4])
    with pytest.raises(CorruptDocument, match="truncated or corrupt"):
        list(process_document(path, NO_OCR))


@pytest.mark.requires("tesseract")
def test_ocr_on_a_real_scan() -> None:
    (page,) = process_document(SCAN, PreprocessOptions(workers=1))
    assert page.ocr and page.ocr_confidence is not None and page.ocr_confidence > 60
    words = {w.text.lower().strip(".,") for w in page.words}
    assert {"students", "images", "projects"} <= words
    assert all(w.ocr and w.confidence is not None for w in page.words)
    for w in page.words:
        assert 0 <= w.bbox[0] < w.bbox[2] <= page.width and 0 <= w.bbox[1] < w.bbox[3] <= page.height
    assert page.layout and all(0 <= v <= 1000 for box in page.layout.boxes for v in box)


@pytest.mark.requires("tesseract")
def test_scanned_pdf_page_gets_ocr(tmp_path: Path) -> None:
    """A PDF page that is only a picture of text (no text layer) yields OCR words with boxes."""
    src = pymupdf.open(LTNEWS)
    pix = src[0].get_pixmap(dpi=150, clip=pymupdf.Rect(40, 160, 300, 340))
    doc = pymupdf.open()
    page = doc.new_page(width=260, height=180)
    page.insert_image(page.rect, stream=pix.tobytes("png"))
    path = tmp_path / "scanned.pdf"
    doc.save(path)
    (result,) = process_document(path, PreprocessOptions(workers=1, ocr_dpi=200))
    assert result.ocr and result.blocks and all(b.ocr for b in result.blocks)
    text = " ".join(w.text.lower() for w in result.words)
    assert "formats" in text and "available" in text and "environment" in text
    assert len(result.images) == 1
