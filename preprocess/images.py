"""Images with Pillow: PNG, JPEG, TIFF (multi-page), WebP, BMP; each image (frame) is a page.

Every frame is opened lazily, checked against the pixel limit before it is
decoded (decompression bombs), turned upright by its EXIF orientation,
converted to RGB (alpha flattened on white) and scaled down to the size limit.
"""

from __future__ import annotations

import io
import time
import warnings
from pathlib import Path

from PIL import Image, ImageOps, UnidentifiedImageError

from posttrain.preprocess.encode import attach_encodings
from posttrain.preprocess.errors import CorruptDocument, EmptyDocument, ImageTooLarge, TooManyPages
from posttrain.preprocess.models import Block, DocumentInfo, FileKind, PageImage, PageResult, Word
from posttrain.preprocess.ocr import ocr_image
from posttrain.preprocess.ocr_layout import ocr_to_page_content
from posttrain.preprocess.options import PreprocessOptions

_MULTI_FRAME = {"TIFF"}


def _open(path: Path | str, options: PreprocessOptions) -> Image.Image:
    name = Path(path).name
    Image.MAX_IMAGE_PIXELS = options.max_image_pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(path)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageTooLarge(
            f"{name!r} has more than {options.max_image_pixels} pixels (a possible decompression bomb); "
            "scale it down or raise max_image_pixels"
        ) from None
    except FileNotFoundError:
        raise CorruptDocument(f"{name!r} cannot be read; check that the file exists") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise CorruptDocument(f"{name!r} is not a readable image ({exc}); re-export it as PNG or JPEG") from None
    return image


def _frame_count(image: Image.Image) -> int:
    if image.format in _MULTI_FRAME:
        return int(getattr(image, "n_frames", 1))
    return 1


def image_info(path: Path | str, kind: FileKind, options: PreprocessOptions) -> DocumentInfo:
    """Validate an image file and count its pages (frames)."""
    name = Path(path).name
    with _open(path, options) as image:
        try:
            count = _frame_count(image)
        except Exception as exc:
            raise CorruptDocument(f"{name!r} has a damaged frame table ({exc}); re-export it") from None
        _check_pixels(image, name, options)
        metadata = {"format": str(image.format), "mode": str(image.mode), "size": f"{image.width}x{image.height}"}
    if count == 0:
        raise EmptyDocument(f"{name!r} holds no image frames; check the file")
    if count > options.max_pages:
        raise TooManyPages(
            f"{name!r} has {count} frames, over the limit of {options.max_pages}; split it or raise max_pages"
        )
    return DocumentInfo(kind=kind, page_count=count, metadata=metadata)


def _check_pixels(image: Image.Image, name: str, options: PreprocessOptions) -> None:
    if image.width * image.height > options.max_image_pixels:
        raise ImageTooLarge(
            f"{name!r} is {image.width}x{image.height} = {image.width * image.height} pixels, over the limit of "
            f"{options.max_image_pixels} (a possible decompression bomb); scale it down or raise max_image_pixels"
        )
    if image.width == 0 or image.height == 0:
        raise CorruptDocument(f"{name!r} has an empty size {image.width}x{image.height}; re-export it")


def normalize_image(image: Image.Image, max_side: int) -> Image.Image:
    """Upright (EXIF), RGB (alpha on white) and no side longer than ``max_side``."""
    image = ImageOps.exif_transpose(image)
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        image = background
    elif image.mode != "RGB":
        if image.mode in ("I;16", "I;16B", "I;16L", "I"):
            image = image.point(lambda v: v / 256).convert("L")
        image = image.convert("RGB")
    if max(image.size) > max_side:
        image = image.copy()
        image.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    return image


def load_frame(path: Path | str, index: int, options: PreprocessOptions) -> Image.Image:
    """Frame ``index`` (0-based) of the image file, normalised."""
    name = Path(path).name
    with _open(path, options) as image:
        _check_pixels(image, name, options)
        try:
            image.seek(index)
            _check_pixels(image, name, options)
            image.load()
            return normalize_image(image, options.max_image_side)
        except (ImageTooLarge, CorruptDocument):
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise ImageTooLarge(
                f"{name!r} frame {index + 1} is over {options.max_image_pixels} pixels; scale it down"
            ) from None
        except Exception as exc:  # truncated or corrupt pixel data
            raise CorruptDocument(
                f"{name!r} frame {index + 1} cannot be decoded ({exc}); the file is truncated or corrupt, re-export it"
            ) from None


def extract_image_page(path: Path | str, index: int, options: PreprocessOptions | None = None) -> PageResult:
    """One image frame as a page: OCR words (unless ocr='never') and the normalised image as its render."""
    options = options or PreprocessOptions()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    image = load_frame(path, index, options)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    render = PageImage(png=buf.getvalue(), width=image.width, height=image.height, dpi=72.0)
    timings["decode"] = time.perf_counter() - t0
    blocks: list[Block] = []
    words: list[Word] = []
    confidence: float | None = None
    ocr = False
    if options.ocr != "never":
        t = time.perf_counter()
        found = ocr_image(image.convert("L"), language=options.ocr_language, timeout_s=options.page_timeout_s)
        blocks, words, confidence = ocr_to_page_content(found, scale=1.0)
        ocr = True
        timings["ocr"] = time.perf_counter() - t
    result = PageResult(
        page_number=index + 1,
        source="image",
        width=float(image.width),
        height=float(image.height),
        blocks=blocks,
        words=words,
        ocr=ocr,
        ocr_confidence=confidence,
        render=render,
        timings=timings,
    )
    if options.encodings:
        result = attach_encodings(result)
    return result
