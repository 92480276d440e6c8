"""First-image decoding: formats, size limits, the bomb guard, resize and centre crop."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from models.world.image import MAX_IMAGE_BYTES, ImageError, cover_crop, decode_image


def _png(w, h, color=(10, 20, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, "PNG")
    return buf.getvalue()


def test_png_and_jpeg_are_resized_and_centre_cropped():
    out = decode_image(_png(64, 32), "png", 16, 16)
    assert out.shape == (16, 16, 3) and out.dtype == np.uint8 and (out == [10, 20, 30]).all()
    buf = io.BytesIO()
    Image.new("RGB", (40, 40), (200, 100, 50)).save(buf, "JPEG")
    assert decode_image(buf.getvalue(), "jpeg", 8, 16).shape == (8, 16, 3)


def test_centre_crop_keeps_the_middle():
    rgb = np.zeros((10, 30, 3), np.uint8)
    rgb[:, 10:20] = 255                       # a white middle third
    out = cover_crop(rgb, 10, 10)
    assert (out[:, 2:8] == 255).all()


@pytest.mark.parametrize("data,fmt,match", [
    (b"", "png", "empty"),
    (b"x" * (MAX_IMAGE_BYTES + 1), "png", "at most"),
    (b"not an image", "png", "not a valid png"),
    (_png(8, 8), "jpeg", "not a valid jpeg"),
    (_png(8, 8), "gif", "format must be"),
])
def test_bad_images_are_refused_with_the_reason(data, fmt, match):
    with pytest.raises(ImageError, match=match):
        decode_image(data, fmt, 16, 16)


def test_a_decompression_bomb_is_refused_before_decoding():
    # A 10000 x 10000 PNG of one colour compresses to a few hundred KB.
    buf = io.BytesIO()
    Image.new("1", (10000, 10000)).save(buf, "PNG")
    assert len(buf.getvalue()) < MAX_IMAGE_BYTES
    with pytest.raises(ImageError, match="pixels|bomb"):
        decode_image(buf.getvalue(), "png", 16, 16)
