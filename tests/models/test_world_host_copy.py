"""models/world/base.py's host copy: torch frames leave ``run_batch`` as numpy; the ``jpeg``
ticks' CUDA frames go through the server's ``device_jpeg`` first (realtime/media.py).

The CPU tests run everywhere. The CUDA tests need torchvision's nvJPEG and skip without it.
"""

from __future__ import annotations

import io
from typing import Any, Sequence

import numpy as np
import pytest
import torch
from PIL import Image

from models.base import ModelError
from models.world.base import WorldAdapter, WorldChunk, WorldGeometry, WorldTick
from realtime.media import NVJPEG, PIL, DeviceJpeg, nvjpeg_available


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


class Counting:
    """A device encoder that counts its calls and encodes nothing (the server's PIL path)."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def encode(self, frames: Sequence[Any]) -> list[bytes] | None:
        self.calls.append(len(frames))
        return None


def tick(i: int, fmt: str = "rgb8") -> WorldTick:
    return WorldTick(f"s{i}", f"s{i}:0", i, (), None, (frozenset(), frozenset()), format=fmt)


def test_torch_frames_come_out_as_numpy_with_nothing_encoded():
    model = TorchFrames()
    model.device_jpeg = counting = Counting()
    chunks = model.run_batch([tick(0, "jpeg"), tick(1)])
    for i, c in enumerate(chunks):
        assert isinstance(c.frames, np.ndarray) and c.frames.dtype == np.uint8 and c.frames.shape == (2, 48, 64, 3)
        assert c.encoded is None  # CPU frames: the server encodes them on the host
        assert int(c.frames[0, 0, 0, 0]) == i and int(c.frames[0, 0, -1, 0]) == 200 + i
    assert counting.calls == []  # no CUDA frame: the device encoder is never asked


def test_torch_frames_of_the_wrong_dtype_fail_the_batch():
    with pytest.raises(ModelError, match=r"frames must be uint8 \[2, 48, 64, 3\], got torch.float32"):
        TorchFrames(dtype=torch.float32).run_batch([tick(0)])


needs_nvjpeg = pytest.mark.skipif(not nvjpeg_available(), reason="needs CUDA and torchvision (nvJPEG)")


def _decode(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@needs_nvjpeg
def test_cuda_jpeg_ticks_are_encoded_on_the_forced_gpu_path_in_one_call():
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
def test_cuda_frames_without_a_device_encoder_or_with_a_sink_are_left_to_the_host_path():
    model = TorchFrames("cuda")
    (plain,) = model.run_batch([tick(0, "jpeg")])  # no app set one: nothing encoded here
    assert plain.encoded is None and isinstance(plain.frames, np.ndarray)
    model.device_jpeg = counting = Counting()
    sunk: list[int] = []
    streamed = WorldTick("s1", "s1:0", 1, (), None, (frozenset(), frozenset()), format="jpeg",
                         frame_sink=lambda first, frames: sunk.append(len(frames)))
    chunks = model.run_batch([tick(0, "jpeg"), streamed])
    assert counting.calls == [2]  # only the unstreamed tick's two frames
    assert sunk == [2] and all(c.encoded is None for c in chunks)


@needs_nvjpeg
def test_the_first_cuda_jpeg_batch_measures_and_picks():
    model = TorchFrames("cuda")
    model.device_jpeg = DeviceJpeg()
    chunks = model.run_batch([tick(i, "jpeg") for i in range(4)])
    m = model.device_jpeg.measurement
    assert m is not None and m["frames"] == 8 and m["path"] in (NVJPEG, PIL)
    assert m["nvjpeg_ms_per_frame"] > 0 and m["pil_ms_per_frame"] > 0
    assert (chunks[0].encoded is not None) == (m["path"] == NVJPEG)
