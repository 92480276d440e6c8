"""Frame encoding for world.v1 binary messages (jpeg, png or raw rgb8)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def encode_frame(frame: np.ndarray, fmt: str) -> bytes:
    """Encode one ``[H, W, 3]`` uint8 frame. 64x64 frames take well under 1 ms."""
    if fmt == "rgb8":
        return np.ascontiguousarray(frame).tobytes()
    buf = io.BytesIO()
    if fmt == "jpeg":
        Image.fromarray(frame).save(buf, format="JPEG", quality=92)
    elif fmt == "png":
        Image.fromarray(frame).save(buf, format="PNG", compress_level=1)
    else:
        raise ValueError(f"unknown frame format {fmt!r}")
    return buf.getvalue()
