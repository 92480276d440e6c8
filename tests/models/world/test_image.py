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


@pytest.mark.parametrize("w,h", [(2000, 1), (1, 2000), (100_000, 1), (1, 1)])
def test_the_work_is_bounded_by_the_output_whatever_the_shape(w, h):
    """A few bytes of PNG 100000x1: resized to cover 832x480 before the crop, it asked ~69 GB
    (2000x1 took 1.9 GB, 20000x1 a MemoryError). Run under a 2 GiB address-space limit."""
    import subprocess
    import sys

    data = _png(w, h, (7, 8, 9))
    assert len(data) < 1000
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
            "from models.world.image import decode_image\n"
            "out = decode_image(sys.stdin.buffer.read(), 'png', 480, 832)\n"
            "assert out.shape == (480, 832, 3) and (out == [7, 8, 9]).all(), out.shape\n")
    done = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]


def test_the_centre_box_matches_resize_then_crop():
    """The one-step resize of the centre box gives what resizing whole and cropping gave,
    within interpolation rounding."""
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (90, 160, 3), dtype=np.uint8)
    rgb = np.asarray(Image.fromarray(rgb).resize((160, 90), Image.BILINEAR))  # smooth enough to compare
    whole = np.asarray(Image.fromarray(rgb).resize((320, 180), Image.BICUBIC))[10:170, :]
    ours = cover_crop(rgb, 160, 320)
    assert ours.shape == (160, 320, 3)
    assert np.abs(ours.astype(int) - whole.astype(int)).mean() < 2.0


def test_a_large_jpeg_is_decoded_at_a_reduced_scale_and_grey_is_converted_after_the_resize():
    """An 4000x3000 JPEG for a 480x832 target decodes at 1/2 scale (no full-size copy); a grey
    PNG comes out grey in RGB."""
    buf = io.BytesIO()
    Image.new("RGB", (4000, 3000), (200, 100, 50)).save(buf, "JPEG")
    out = decode_image(buf.getvalue(), "jpeg", 480, 832)
    assert out.shape == (480, 832, 3) and np.abs(out.astype(int) - [200, 100, 50]).max() <= 3
    grey = io.BytesIO()
    Image.new("L", (64, 32), 77).save(grey, "PNG")
    out = decode_image(grey.getvalue(), "png", 16, 16)
    assert out.shape == (16, 16, 3) and (out == 77).all()
    for data, fmt in ((grey.getvalue(), "png"), (buf.getvalue(), "jpeg"), (_png(9, 7), "png")):
        assert decode_image(data, fmt, 16, 16).flags.writeable  # torch.from_numpy warns on a read-only one
