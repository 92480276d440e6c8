"""Frame encoding off the loop gives the same bytes, in order, as encoding inline."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
from PIL import Image

from realtime import media


@pytest.mark.parametrize("fmt", ["jpeg", "png", "rgb8"])
def test_encode_chunk_matches_inline(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (3, 16, 24, 3), dtype=np.uint8)
    inline = media.encode_frames(frames, fmt)
    monkeypatch.setattr(media, "ENCODE_WORKERS", 2)
    assert asyncio.run(media.encode_chunk(frames, fmt)) == inline
    monkeypatch.setattr(media, "ENCODE_WORKERS", 0)
    assert asyncio.run(media.encode_chunk(frames, fmt)) == inline
    if fmt == "png":  # lossless: each payload decodes back to its own frame, in order
        for frame, payload in zip(frames, inline):
            assert np.array_equal(np.asarray(Image.open(io.BytesIO(payload))), frame)


def test_unknown_format_raises_through_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(media, "ENCODE_WORKERS", 2)
    with pytest.raises(ValueError, match="unknown frame format"):
        asyncio.run(media.encode_chunk(np.zeros((1, 4, 4, 3), np.uint8), "webp"))
