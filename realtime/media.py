"""Frame encoding for world.v1 binary messages (jpeg, png or raw rgb8).

JPEG and PNG encode on a small thread pool, off the event-loop thread: PIL drops
the GIL while it encodes, so a batch's chunks encode in parallel with the loop's
sends and the engine's Python, instead of one after another on the loop (64x64
maze frames take ~0.1 ms each, 480x832 frames 1-4 ms). ``rgb8`` is one memory copy
and stays inline: the hop would cost more than the work.
"""

from __future__ import annotations

import asyncio
import io
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from PIL import Image

from protocols.world_v1 import JPEG_QUALITY

# Encoder threads: enough to keep up with a batch's chunks, few enough to leave cores
# to the engine and the loop. 0 encodes inline on the loop (bench_served's A/B). Below
# 4 cores the pool has no core of its own: on 2 shared cores it halved jpeg throughput
# at 32 maze sessions (bench/results/world_served_instant_cpu_ab.json), so it is off.
_CORES = os.cpu_count() or 2
ENCODE_WORKERS = min(4, _CORES - 2) if _CORES >= 4 else 0

_pool: ThreadPoolExecutor | None = None


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
    """``encode_frames`` off the event-loop thread (jpeg, png); one hop per chunk."""
    if fmt == "rgb8" or ENCODE_WORKERS <= 0:
        return encode_frames(frames, fmt)
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(ENCODE_WORKERS, thread_name_prefix="encode")
    return await asyncio.get_running_loop().run_in_executor(_pool, encode_frames, frames, fmt)
