"""Every frame encoding of the server: models return frames, the edge encodes.

World frames go out as ``jpeg``, ``png`` or ``rgb8`` (world.v1 ``format``), one binary
payload a frame; ``h264`` is a stream per session, not a frame at a time: ``video.py``. ``encode_frames`` is the plain encoding; every other path gives the same
bytes (jpeg from nvJPEG: the same image, tests/realtime/test_media.py). The app makes one
``Encoder`` from its ``EncodeConfig`` and hands it to the world endpoints; ``encode`` is
its one entry for frames on the host, whatever the format:

    await encoder.encode(frames, fmt)
        rgb8        one memory copy, inline: a hop would cost more than the work
        jpeg, png   on the encoder processes (encode_pool.py) once all are up; on threads
                    before that, after one failed, or from another loop; inline on the
                    loop with 0 workers (``default_workers`` says when)

Processes, not threads: PIL's Python around each frame holds a GIL, and in a thread it is
the engine's (encode_pool.py has the measurement).

Frames on the GPU. A world model may return CUDA frames (LingBot's VAE decode, the maze on
CUDA). The app gives each world adapter the encoder's ``device_jpeg``; the world base
(models/world/base.py ``run_batch``) hands it the CUDA frames of a batch's ``jpeg`` ticks
just before its one copy to the host, and sends back the payloads with the chunks. That
call stays on the engine thread: the thread owns every CUDA tensor (the loop may not touch
them), and one nvJPEG call for the whole batch is what makes it pay (480x832 on the H200,
bench/results/jpeg_paths_h200.json: 0.24 ms a frame in a batch of 32, 0.36 alone, PIL
1.8). Small frames are the other way round (64x64: PIL 0.08 ms, nvJPEG 0.21), so unless
``EncodeConfig.cuda_jpeg`` forces a path, the first such batch measures both and keeps the
faster::

    first jpeg batch on CUDA ──> nvJPEG on it, and PIL (``encode_frames``) on one thread on
                                 its host copy: one untimed call each for its set-up, then
                                 the median of MEASURE_REPEATS
                             ──> "nvjpeg" if its time per frame is lower, else "pil"

"pil" returns None: the host copies go through ``encode`` like any other frames. For the
maze it picks PIL, as the served A/B agrees (bench/results/world_serving_curve_h200.json,
32 sessions in jpeg: 1952 frames/s, 1372 with nvJPEG forced). torch and torchvision are
imported only there: a CPU server needs neither.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence, TypeVar

import numpy as np
from PIL import Image

from protocols.world_v1 import JPEG_QUALITY
from realtime.encode_pool import EncodePool

log = logging.getLogger(__name__)

FORMATS = ("jpeg", "png", "rgb8")
# What the encoder processes run (encode_pool.py imports it by this name in each worker).
CODEC = "realtime.media:encode_frames"

NVJPEG = "nvjpeg"
PIL = "pil"
CUDA_JPEG_PATHS = (NVJPEG, PIL)
# Timed calls of each path on the first batch, after an untimed one (their median counts).
MEASURE_REPEATS = 3

T = TypeVar("T")


def encode_frames(frames: np.ndarray, fmt: str) -> list[bytes]:
    """The plain encoding of ``[T, H, W, 3]`` uint8 host frames: one payload each, in order."""
    if fmt == "rgb8":
        return [np.ascontiguousarray(f).tobytes() for f in frames]
    if fmt == "jpeg":
        options: dict[str, Any] = {"format": "JPEG", "quality": JPEG_QUALITY}
    elif fmt == "png":
        options = {"format": "PNG", "compress_level": 1}
    else:
        raise ValueError(f"unknown frame format {fmt!r}")
    payloads = []
    for frame in frames:
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, **options)
        payloads.append(buf.getvalue())
    return payloads


def default_workers(cores: int | None = None) -> int:
    """Encoder processes when ``EncodeConfig.workers`` is None, for ``cores`` (default: the
    cores this process may run on, taskset's or a container's cpuset, not the host's).

    Enough to keep up with a batch's chunks, few enough to leave two cores to the engine
    and the loop: up to 4. Below 4 cores the pool has no core of its own and jpeg/png
    encode inline: on 2 shared cores the pool halved jpeg throughput at 32 sessions
    (bench/results/world_served_instant_cpu_ab.json: 945 frames/s against 1674 inline).
    """
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    return min(4, cores - 2) if cores >= 4 else 0


class Encoder:
    """The server's frame encoder, one per app: ``encode`` for host frames (event loop), and
    ``device_jpeg`` for a batch's CUDA frames (engine thread, through the world base)."""

    def __init__(self, workers: int | None = None, cuda_jpeg: str | None = None) -> None:
        self.workers = default_workers() if workers is None else workers
        if self.workers < 0:
            raise ValueError(f"encoder workers must be 0 or more, got {self.workers}")
        self.device_jpeg = DeviceJpeg(cuda_jpeg)
        self._threads: ThreadPoolExecutor | None = None
        self._processes: EncodePool | None = None

    async def encode(self, frames: np.ndarray, fmt: str) -> list[bytes]:
        """``encode_frames(frames, fmt)``, off the event loop where that pays (module docstring)."""
        if fmt == "rgb8" or self.workers == 0:
            return encode_frames(frames, fmt)
        procs = self._processes
        if procs is not None and procs.usable and procs.loop is asyncio.get_running_loop():
            return await procs.encode(frames, fmt)
        return await self._on_threads(frames, fmt)

    async def _on_threads(self, frames: np.ndarray, fmt: str) -> list[bytes]:
        """``encode_frames`` on a thread pool: the processes' stand-in and fallback."""
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max(1, self.workers), thread_name_prefix="encode")
        return await asyncio.get_running_loop().run_in_executor(self._threads, encode_frames, frames, fmt)

    def start(self) -> EncodePool | None:
        """Start the encoder processes for the running loop (the app's start-up); none with 0
        workers, or where processes cannot start (threads then). Used once all are up."""
        self.close()
        if self.workers > 0:
            try:
                self._processes = EncodePool(self.workers, CODEC, self._on_threads)
            except (OSError, RuntimeError, ValueError) as exc:  # no processes here (limits, sandbox)
                log.warning("encoder processes not started (%s: %s); jpeg / png encode on threads",
                            type(exc).__name__, exc)
        return self._processes

    def close(self) -> None:
        """Stop the processes and threads (the app's shutdown); a later ``encode`` still answers,
        on new threads."""
        procs, self._processes = self._processes, None
        if procs is not None:
            procs.close()
        threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown(wait=False)


# ---------------------------------------------------------------------- CUDA frames
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
    out = encode_jpeg([f.permute(2, 0, 1).contiguous() for f in frames], quality=quality)
    sizes = [int(t.numel()) for t in out]
    flat = torch.cat([t.reshape(-1) for t in out]).cpu().numpy().tobytes()
    payloads, at = [], 0
    for n in sizes:
        payloads.append(flat[at:at + n])
        at += n
    return payloads


class DeviceJpeg:
    """JPEG for one batch's CUDA frames on the engine thread: nvJPEG, or None (the host copies
    go through ``Encoder.encode``). ``path`` forces one; None measures on the first batch."""

    def __init__(self, path: str | None = None) -> None:
        if path is not None and path not in CUDA_JPEG_PATHS:
            raise ValueError(f"cuda jpeg path must be one of {CUDA_JPEG_PATHS} or None (measure), got {path!r}")
        self.path = path
        self.measurement: dict[str, Any] | None = None
        self._checked = False  # torchvision and CUDA looked for (on the first call: no import before)

    def encode(self, frames: Sequence[Any]) -> list[bytes] | None:
        """JPEG bytes of ``frames`` (CUDA uint8 ``[H, W, 3]`` each), or None: leave them to
        ``Encoder.encode``. The first call without a forced path measures."""
        if not frames or self.path == PIL:
            return None
        if not self._checked:
            self._checked = True
            if not nvjpeg_available():
                if self.path == NVJPEG:
                    log.warning("nvjpeg asked for but torchvision or CUDA is missing: jpeg stays on the CPU pool")
                self.path = PIL
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
        host = torch.stack(list(frames)).cpu().numpy()
        pil_ms, _ = time_warm(lambda: encode_frames(host, "jpeg"))
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
