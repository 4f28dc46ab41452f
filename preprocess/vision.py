"""Encoding (c): the page image for a vision-language model, sized as Qwen2-VL's processor does.

Qwen2-VL cuts the image into 14-pixel patches and merges 2x2 of them into one
visual token, so both sides are multiples of 28 and the token count is
(height / 28) * (width / 28).
"""

from __future__ import annotations

import base64
import io
import math

from PIL import Image
from pydantic import BaseModel, ConfigDict

from posttrain.preprocess.errors import PreprocessError
from posttrain.preprocess.models import PageResult

PATCH_SIZE = 14
MERGE_SIZE = 2
FACTOR = PATCH_SIZE * MERGE_SIZE  # 28
MIN_PIXELS = 4 * FACTOR * FACTOR  # 3136, Qwen2-VL's default
MAX_PIXELS = 1280 * FACTOR * FACTOR  # 1003520, the commonly used cap
MAX_ASPECT = 200
VISION_WRAPPER_TOKENS = 2  # <|vision_start|> ... <|vision_end|>


class VisionEncoding(BaseModel):
    model_config = ConfigDict(extra="forbid")

    width: int
    height: int
    visual_tokens: int
    token_count: int  # visual tokens plus the vision start/end markers
    message_part: dict  # OpenAI-style content part: {"type": "image_url", "image_url": {"url": "data:..."}}


def smart_resize(
    height: int, width: int, factor: int = FACTOR, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS
) -> tuple[int, int]:
    """(height, width) rounded to multiples of ``factor`` with the area in [min_pixels, max_pixels]."""
    if height <= 0 or width <= 0:
        raise PreprocessError(f"image size {width}x{height} is empty; render the page first")
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise PreprocessError(f"image {width}x{height} has an aspect ratio over {MAX_ASPECT}; crop it before encoding")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def visual_token_count(height: int, width: int) -> int:
    """Visual tokens of an image already sized by :func:`smart_resize`."""
    return (height // FACTOR) * (width // FACTOR)


def encode_image(
    image: Image.Image, *, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS, image_format: str = "PNG"
) -> VisionEncoding:
    """Resize ``image`` the Qwen2-VL way and package it as a chat message part."""
    h, w = smart_resize(image.height, image.width, min_pixels=min_pixels, max_pixels=max_pixels)
    resized = image.convert("RGB").resize((w, h), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    resized.save(buf, format=image_format)
    mime = "image/png" if image_format.upper() == "PNG" else f"image/{image_format.lower()}"
    url = f"data:{mime};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"
    tokens = visual_token_count(h, w)
    return VisionEncoding(
        width=w,
        height=h,
        visual_tokens=tokens,
        token_count=tokens + VISION_WRAPPER_TOKENS,
        message_part={"type": "image_url", "image_url": {"url": url}},
    )


def encode_page_image(
    page: PageResult, *, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS
) -> VisionEncoding:
    """Encoding (c) of a processed page; the page must carry a render (set ``render_dpi``)."""
    if page.render is None:
        raise PreprocessError(
            f"page {page.page_number} has no rendered image; process the document with render_dpi set (e.g. 144)"
        )
    with Image.open(io.BytesIO(page.render.png)) as image:
        image.load()
        return encode_image(image, min_pixels=min_pixels, max_pixels=max_pixels)
