"""Frame encoding for world.v1 binary messages (jpeg, png or raw rgb8).

JPEG and PNG encode off the event-loop thread (64x64 maze frames take ~0.1 ms each,
480x832 frames 1-4 ms), in worker processes (``encode_pool.py``) that the app starts
with ``start_processes``: PIL's Python around each frame holds a GIL, and in a thread
it would be the engine's. Before the workers are up, after one fails, and where the app
started none, a small thread pool encodes instead (PIL drops the GIL inside its encoder).
``rgb8`` is one memory copy and stays inline: the hop would cost more than the work.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from PIL import Image

from protocols.world_v1 import JPEG_QUALITY
from realtime.encode_pool import EncodePool

log = logging.getLogger(__name__)

# Encoders (processes, and as many threads as their fallback): enough to keep up with a
# batch's chunks, few enough to leave cores to the engine and the loop. 0 encodes inline
# on the loop (bench_served's A/B). Below 4 cores the pool has no core of its own: on 2
# shared cores it halved jpeg throughput at 32 maze sessions
# (bench/results/world_served_instant_cpu_ab.json), so it is off.
# The cores this process may run on (taskset, a container's cpuset), not the host's.
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
ENCODE_WORKERS = min(4, _CORES - 2) if _CORES >= 4 else 0

_pool: ThreadPoolExecutor | None = None
_processes: EncodePool | None = None


def encode_frame(frame: np.ndarray, fmt: str) -> bytes:
    """Encode one ``[H, W, 3]`` uint8 frame."""
    if fmt == "rgb8":
        return np.ascontiguousarray(frame).tobytes()
    buf = io.BytesIO()
    if fmt == "jpeg":
        Image.fromarray(frame).save(buf, format="JPEG", quality=JPEG_QUALITY)
    elif fmt == "png":
        Image.fromarray(frame).save(buf, format="PNG", compress_level=1)
    else:
        raise ValueError(f"unknown frame format {fmt!r}")
    return buf.getvalue()


def encode_frames(frames: np.ndarray, fmt: str) -> list[bytes]:
    """Encode a chunk's ``[T, H, W, 3]`` frames, in order."""
    return [encode_frame(f, fmt) for f in frames]


async def encode_chunk(frames: np.ndarray, fmt: str) -> list[bytes]:
    """``encode_frames`` off the event-loop thread (jpeg, png): on the processes when they
    serve this loop and are up, otherwise one thread-pool hop per chunk."""
    if fmt == "rgb8" or ENCODE_WORKERS <= 0:
        return encode_frames(frames, fmt)
    procs = _processes
    if procs is not None and procs.usable and procs.loop is asyncio.get_running_loop():
        return await procs.encode(frames, fmt)
    return await encode_on_threads(frames, fmt)


async def encode_on_threads(frames: np.ndarray, fmt: str) -> list[bytes]:
    """``encode_frames`` on the thread pool (the processes' fallback)."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max(1, ENCODE_WORKERS), thread_name_prefix="encode")
    return await asyncio.get_running_loop().run_in_executor(_pool, encode_frames, frames, fmt)


def start_processes() -> EncodePool | None:
    """Start ``ENCODE_WORKERS`` encoder processes for the running loop (the app's start-up);
    none with fewer than 4 cores. They are used once all are up."""
    global _processes
    stop_processes()
    if ENCODE_WORKERS > 0:
        try:
            _processes = EncodePool(ENCODE_WORKERS, encode_on_threads)
        except (OSError, RuntimeError, ValueError) as exc:  # no processes here (limits, sandbox): threads
            log.warning("encoder processes not started (%s: %s); jpeg / png encode on threads", type(exc).__name__, exc)
    return _processes


def stop_processes() -> None:
    """Stop the encoder processes (the app's shutdown); later chunks encode on threads."""
    global _processes
    procs, _processes = _processes, None
    if procs is not None:
        procs.close()
