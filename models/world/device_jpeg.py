"""JPEG for frames that a world model made on CUDA: nvJPEG in one batch, or PIL, by measurement.

A world model whose frames are CUDA tensors (LingBot's VAE decode, the maze on CUDA)
can have the ``jpeg`` ones encoded on the GPU, in one ``torchvision.io.encode_jpeg``
call for the whole batch, instead of copied to the host and encoded by PIL on the
server's encoder pool. Which is faster depends on the frame size, the batch and the
host (issue 19 measured on the H200 at 480x832: PIL q90 1.3 ms a frame for a smooth
image and 4.0 ms for noise; nvJPEG 0.18 ms a frame in a batch of 32), so
``DeviceJpeg`` measures both on the first real batch and keeps the winner:

    first jpeg batch on CUDA ──> time nvJPEG on it and PIL on one thread for the same
                                  frames (each: one untimed call for its set-up, then
                                  the median of MEASURE_REPEATS)
                             ──> "nvjpeg" if its time per frame is lower, else "pil"

PIL here means: leave ``encoded`` empty, the server encodes on its pool as for any
host frames. Without torchvision or CUDA the path is "pil" and nothing is measured.
The engine thread is the only caller (it owns every CUDA tensor).
"""

from __future__ import annotations

import io
import logging
import statistics
import time
from typing import Any, Callable, Sequence, TypeVar

from protocols.world_v1 import JPEG_QUALITY

log = logging.getLogger(__name__)

NVJPEG = "nvjpeg"
PIL = "pil"
PATHS = (NVJPEG, PIL)
# Timed calls of each path on the first batch, after an untimed one (their median counts).
MEASURE_REPEATS = 3

T = TypeVar("T")


def nvjpeg_available() -> bool:
    """torchvision's CUDA JPEG encoder can run here (torchvision importable, CUDA present)."""
    try:
        import torch
        import torchvision.io  # noqa: F401 - the GPU box has it; the dev venv may not
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def encode_nvjpeg(frames: Sequence[Any], quality: int = JPEG_QUALITY) -> list[bytes]:
    """JPEG bytes of each ``[H, W, 3]`` uint8 CUDA frame, in one batched nvJPEG call and
    one device-to-host copy."""
    import torch
    from torchvision.io import encode_jpeg

    if not frames:
        return []
    chw = [f.permute(2, 0, 1).contiguous() for f in frames]
    out = encode_jpeg(chw, quality=quality)
    sizes = [int(t.numel()) for t in out]
    flat = torch.cat([t.reshape(-1) for t in out]).cpu().numpy().tobytes()
    payloads, at = [], 0
    for n in sizes:
        payloads.append(flat[at:at + n])
        at += n
    return payloads


def encode_pil(frame: Any, quality: int = JPEG_QUALITY) -> bytes:
    """One ``[H, W, 3]`` uint8 numpy frame through PIL, as the server's pool encodes it."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


class DeviceJpeg:
    """The JPEG path for one model's CUDA frames: forced, or picked on the first batch."""

    def __init__(self, path: str | None = None) -> None:
        if path is not None and path not in PATHS:
            raise ValueError(f"jpeg path must be one of {PATHS} or None (measure), got {path!r}")
        self.path = path if path is not None else (None if nvjpeg_available() else PIL)
        if self.path == NVJPEG and not nvjpeg_available():
            log.warning("nvjpeg asked for but torchvision or CUDA is missing: jpeg stays on the CPU pool")
            self.path = PIL
        self.measurement: dict[str, Any] | None = None

    def encode(self, frames: Sequence[Any]) -> list[bytes] | None:
        """JPEG bytes of ``frames`` (CUDA uint8 ``[H, W, 3]`` each) on the GPU, or None: leave
        them to the server's PIL pool. The first call without a forced path measures."""
        if not frames or self.path == PIL:
            return None
        if self.path is None:
            return self._measure(frames)
        try:
            return encode_nvjpeg(frames)
        except Exception as exc:  # noqa: BLE001 - a codec failure must not fail the tick
            log.warning("nvjpeg failed (%r): jpeg goes back to the CPU pool", exc)
            self.path = PIL
            return None

    def _measure(self, frames: Sequence[Any]) -> list[bytes] | None:
        import torch

        def nvjpeg() -> list[bytes]:
            payloads = encode_nvjpeg(frames)
            torch.cuda.synchronize()
            return payloads

        try:
            nv_ms, payloads = time_warm(nvjpeg)
        except Exception as exc:  # noqa: BLE001
            log.warning("nvjpeg unusable (%r): jpeg stays on the CPU pool", exc)
            self.path, self.measurement = PIL, {"error": repr(exc)}
            return None
        host = [f.cpu().numpy() for f in frames]
        pil_ms, _ = time_warm(lambda: [encode_pil(f) for f in host])
        n = len(frames)
        self.path = NVJPEG if nv_ms < pil_ms else PIL
        h, w = frames[0].shape[:2]
        self.measurement = {"frames": n, "height": int(h), "width": int(w),
                            "nvjpeg_ms_per_frame": nv_ms / n, "pil_ms_per_frame": pil_ms / n, "path": self.path}
        log.info("jpeg for CUDA frames: %s (nvjpeg %.3f ms/frame in a batch of %d, PIL %.3f ms/frame)",
                 self.path, nv_ms / n, n, pil_ms / n)
        return payloads if self.path == NVJPEG else None


def time_warm(fn: Callable[[], T], repeats: int = MEASURE_REPEATS) -> tuple[float, T]:
    """Median ms of ``repeats`` calls of ``fn`` after one untimed call, and the last value.

    The untimed call takes each path's one-time costs (nvJPEG's codec set-up; PIL's
    import of its JPEG plugin and libjpeg's first use, which made PIL look 50x slower
    than it is: 4.3 ms a 64x64 frame measured that way on the H200 host against 0.08 ms
    in ``bench/results/jpeg_paths_h200.json``, so nvJPEG was picked for the maze).
    """
    value = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), value
