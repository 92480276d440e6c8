"""models/world/device_jpeg.py and the world base's host copy: CUDA frames, jpeg on the GPU or not.

The CPU tests run everywhere: torch frames become numpy in ``run_batch``, and without
torchvision or CUDA the jpeg path is PIL (the server's pool) with nothing encoded. The
CUDA tests need torchvision's nvJPEG and skip without it.
"""

from __future__ import annotations

import io
from typing import Sequence

import numpy as np
import pytest
import torch
from PIL import Image

from models.base import ModelError
from models.world.base import WorldAdapter, WorldChunk, WorldGeometry, WorldTick
from models.world.device_jpeg import NVJPEG, PIL, DeviceJpeg, encode_nvjpeg, nvjpeg_available


class TorchFrames(WorldAdapter):
    """Frames as torch tensors on ``device``: a smooth gradient plus the chunk index."""

    name = "torch-frames"

    def __init__(self, device: str = "cpu", dtype: torch.dtype = torch.uint8) -> None:
        self.geometry = WorldGeometry(height=48, width=64, frames_per_chunk=2, fps=10.0)
        self.device, self.dtype = device, dtype

    def generate(self, works: Sequence[WorldTick]) -> list[WorldChunk]:
        ramp = torch.linspace(0, 200, 64, device=self.device).expand(2, 48, 64)
        out = []
        for w in works:
            frames = (ramp[..., None].expand(2, 48, 64, 3) + w.chunk_index).to(self.dtype)
            out.append(WorldChunk.answering(w, frames))
        return out


def tick(i: int, fmt: str = "rgb8") -> WorldTick:
    return WorldTick(f"s{i}", f"s{i}:0", i, (), None, (frozenset(), frozenset()), format=fmt)


def test_torch_frames_come_out_as_numpy_with_nothing_encoded():
    model = TorchFrames()
    chunks = model.run_batch([tick(0, "jpeg"), tick(1)])
    for i, c in enumerate(chunks):
        assert isinstance(c.frames, np.ndarray) and c.frames.dtype == np.uint8 and c.frames.shape == (2, 48, 64, 3)
        assert c.encoded is None  # CPU frames: the server's pool encodes them
        assert int(c.frames[0, 0, 0, 0]) == i and int(c.frames[0, 0, -1, 0]) == 200 + i
    assert model.device_jpeg is None  # no CUDA frame, nothing measured


def test_torch_frames_of_the_wrong_dtype_fail_the_batch():
    with pytest.raises(ModelError, match=r"frames must be uint8 \[2, 48, 64, 3\], got torch.float32"):
        TorchFrames(dtype=torch.float32).run_batch([tick(0)])


def test_without_cuda_or_torchvision_the_path_is_pil():
    if nvjpeg_available():
        pytest.skip("nvJPEG is available here")
    assert DeviceJpeg().path == PIL
    assert DeviceJpeg(NVJPEG).path == PIL  # asked for, falls back cleanly
    assert DeviceJpeg().encode([torch.zeros(4, 4, 3, dtype=torch.uint8)]) is None


def test_a_bad_path_is_refused():
    with pytest.raises(ValueError, match="jpeg path must be one of"):
        DeviceJpeg("gpu")


needs_nvjpeg = pytest.mark.skipif(not nvjpeg_available(), reason="needs CUDA and torchvision (nvJPEG)")


def _decode(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@needs_nvjpeg
def test_nvjpeg_batch_decodes_back_to_the_frames():
    frames = [torch.full((48, 64, 3), v, dtype=torch.uint8, device="cuda") for v in (10, 120, 250)]
    payloads = encode_nvjpeg(frames)
    assert len(payloads) == 3
    for v, data in zip((10, 120, 250), payloads):
        assert data[:2] == b"\xff\xd8"  # a JPEG start-of-image marker
        assert abs(int(np.median(_decode(data))) - v) <= 2


@needs_nvjpeg
def test_cuda_jpeg_ticks_are_encoded_on_the_forced_gpu_path():
    model = TorchFrames("cuda")
    model.device_jpeg = DeviceJpeg(NVJPEG)
    chunks = model.run_batch([tick(0, "jpeg"), tick(1), tick(2, "jpeg")])
    assert chunks[1].encoded is None  # rgb8 stays raw
    for c in (chunks[0], chunks[2]):
        assert c.encoded is not None and len(c.encoded) == 2
        decoded = _decode(c.encoded[1])
        assert decoded.shape == (48, 64, 3)
        assert np.abs(decoded.astype(int) - c.frames[1].astype(int)).mean() < 3


@needs_nvjpeg
def test_the_first_cuda_jpeg_batch_measures_and_picks():
    model = TorchFrames("cuda")
    chunks = model.run_batch([tick(i, "jpeg") for i in range(4)])
    m = model.device_jpeg.measurement
    assert m is not None and m["frames"] == 8 and m["path"] in (NVJPEG, PIL)
    assert m["nvjpeg_ms_per_frame"] > 0 and m["pil_ms_per_frame"] > 0
    assert (chunks[0].encoded is not None) == (m["path"] == NVJPEG)


def test_the_pick_times_each_path_after_an_untimed_first_call():
    """A first call's one-time cost (a codec's set-up, a plugin's import) is not timed."""
    from models.world.device_jpeg import MEASURE_REPEATS, time_warm

    calls: list[int] = []

    def path() -> int:
        calls.append(len(calls))
        if len(calls) == 1:
            import time

            time.sleep(0.2)   # the set-up
        return len(calls)

    ms, value = time_warm(path)
    assert len(calls) == 1 + MEASURE_REPEATS and value == 1 + MEASURE_REPEATS
    assert ms < 100
