"""Image parts of chat messages: data URLs decoded and checked before they reach a model."""

from __future__ import annotations

import base64
import binascii
import io

from PIL import Image, UnidentifiedImageError

from posttrain.platform.serving.errors import bad_request


def decode_image_url(url: str, index: int, max_bytes: int, max_pixels: int) -> Image.Image:
    """Decode a ``data:image/...;base64,`` URL into an RGB image or raise a 400 naming the image."""
    if not url.startswith("data:"):
        raise bad_request(
            f"image {index}: only data: URLs (data:image/png;base64,...) are accepted; this server fetches no remote URLs",
            param="messages",
        )
    header, _, payload = url.partition(",")
    if ";base64" not in header:
        raise bad_request(f"image {index}: data URL must be base64-encoded", param="messages")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"image {index}: data URL payload is not valid base64", param="messages") from None
    if len(raw) > max_bytes:
        raise bad_request(f"image {index}: {len(raw)} bytes exceeds the limit of {max_bytes} bytes", param="messages")
    try:
        try:
            image = Image.open(io.BytesIO(raw))  # reads the header only
        except Image.DecompressionBombError:  # over Pillow's process-wide limit (preprocessing sets it)
            raise bad_request(f"image {index} decodes to more pixels than this deployment's limit of {max_pixels}; "
                              "send a smaller image", param="messages") from None  # fmt: skip
        width, height = image.size
        if width * height > max_pixels:
            raise bad_request(f"image {index} is {width}x{height} = {width * height} pixels, over this deployment's "
                              f"limit of {max_pixels}; send a smaller image", param="messages")  # fmt: skip
        image.load()
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise bad_request(f"image {index} is not a valid image: {exc}", param="messages") from None
    return image.convert("RGB")
