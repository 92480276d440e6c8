"""A world session's first image: untrusted bytes to a uint8 frame at the model's resolution.

Used by every world model that takes a first image (``WorldAdapter.takes_image``).
PNG or JPEG only, at most ``MAX_IMAGE_BYTES`` (world.v1's wire bound); the declared format must match the
bytes; the header's pixel count is checked against ``MAX_PIXELS`` before any pixel
is decoded (a decompression bomb is refused, not expanded); then RGB, and the centre
box that covers the target's aspect resized to the target in one step, so the work
and memory after decoding are those of the output whatever the input's shape (a
100000x1 image resized to cover 832x480 first would have been 69 GB). A JPEG is decoded at
the smallest DCT scale that still covers the target, and a grey or RGB image is resized
before any conversion, so decoding holds one copy of the input at most.
"""

from __future__ import annotations

import io
import math
import warnings
from typing import Any

import numpy as np

from protocols.world_v1 import IMAGE_FORMATS, MAX_IMAGE_BYTES

MAX_PIXELS = 64_000_000           # e.g. 8000 x 8000
# world.v1's format names -> PIL's ("png" -> "PNG", "jpeg" -> "JPEG").
FORMATS = {name: name.upper() for name in IMAGE_FORMATS}


class ImageError(ValueError):
    """An image that is refused; the message says why."""


def decode_image(data: bytes, fmt: str, height: int, width: int) -> np.ndarray:
    """``data`` in ``fmt`` ("png" | "jpeg") -> uint8 ``[height, width, 3]``."""
    from PIL import Image

    if fmt not in FORMATS:
        raise ImageError(f"image format must be one of {sorted(FORMATS)}, got {fmt!r}")
    if not data:
        raise ImageError("image is empty")
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"image is {len(data)} bytes, at most {MAX_IMAGE_BYTES}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data), formats=[FORMATS[fmt]])
            w, h = im.size
            if w * h > MAX_PIXELS:
                raise ImageError(f"image is {w}x{h} pixels, at most {MAX_PIXELS} in all")
            if im.format == "JPEG":  # decoded at the smallest DCT scale that still covers the target
                scale = max(height / h, width / w)
                im.draft("RGB", (math.ceil(w * scale), math.ceil(h * scale)))
            im.load()
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageError("image refused as a decompression bomb") from None
    except Exception as e:  # PIL raises many types for bad data
        raise ImageError(f"image is not a valid {fmt}: {type(e).__name__}") from None
    if im.mode in ("L", "RGB"):  # resized in its own mode; grey made RGB at the output's size
        out = _cover(im, height, width)
        return out if out.ndim == 3 else np.repeat(out[..., None], 3, axis=2)
    return _cover(im.convert("RGB"), height, width)


def cover_crop(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize (bicubic) so the image covers ``height`` x ``width``, then crop the centre."""
    from PIL import Image

    return _cover(Image.fromarray(rgb), height, width)


def _cover(im: Any, height: int, width: int) -> np.ndarray:
    """``cover_crop`` of a PIL image: the centre box of the target's aspect, in the source's
    coordinates (fractional), resized straight to ``width`` x ``height``."""
    from PIL import Image

    w, h = im.size
    scale = max(height / h, width / w)
    box_w, box_h = width / scale, height / scale
    left, top = (w - box_w) / 2, (h - box_h) / 2
    out = im.resize((width, height), Image.BICUBIC, box=(left, top, left + box_w, top + box_h))
    return np.asarray(out, dtype=np.uint8).copy()
