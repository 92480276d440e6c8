"""The maze model's CPU number format: float32, or bfloat16 where this CPU is faster at it.

bfloat16 halves the bytes of weights and KV, but only a CPU with native bf16
arithmetic (AMX tiles, or AVX512-BF16) computes it faster than float32; elsewhere
every bf16 op converts to float32 and back, and the frame gets slower. So the
default is float32, and on a CPU that reports native bf16 one steady-state frame
pass is timed in both formats at start (a fraction of a second) and the faster
one kept. bfloat16 is the format the model card's evaluation runs in (on CUDA),
so either choice is one whose quality figures are measured.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any

import torch

from models.world.maze.cache import FrameCache
from models.world.maze.model import MazeDiT

log = logging.getLogger(__name__)


def native_bf16() -> bool:
    """Whether this CPU has bf16 arithmetic (AMX tiles or AVX512-BF16), per torch's own checks."""
    cpu = torch.cpu
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


@torch.no_grad()
def frame_pass_ms(model: MazeDiT, window: int, rows: int = 1, repeats: int = 5) -> float:
    """Median ms of one denoising pass of ``rows`` frames against a full sink + ``window`` context."""
    cfg = model.cfg
    dtype = model.embed.weight.dtype
    cache = FrameCache(cfg, rows, window, "cpu", dtype)
    cache.slot_valid[:] = True
    view = cache.view()
    x = torch.zeros(rows, 3, 64, 64)
    t = torch.full((rows,), 0.5)
    a = torch.zeros(rows, 8)
    pos = torch.full((rows,), window + 1, dtype=torch.long)
    sink = torch.zeros(rows, dtype=torch.bool)
    times = []
    for i in range(2 + repeats):
        t0 = time.perf_counter()
        model.forward_frame(x, t, a, pos, sink, view)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def pick_cpu_dtype(models: dict[torch.dtype, MazeDiT], window: int) -> tuple[torch.dtype, dict[str, Any]]:
    """The faster of ``models`` (float32 and bfloat16 copies) on one frame pass; (dtype, timings)."""
    # Two interleaved rounds, the better of each kept: a format's first passes also pay for
    # its kernels' setup, and a neighbour's burst on a shared machine hits one round only.
    timings: dict[str, float] = {}
    for _ in range(2):
        for dt, m in models.items():
            ms = frame_pass_ms(m, window)
            timings[_name(dt)] = min(ms, timings.get(_name(dt), ms))
    best = min(models, key=lambda dt: timings[_name(dt)])
    log.info("maze CPU number format: %s (one frame pass: %s ms)", _name(best),
             {k: round(v, 1) for k, v in timings.items()})
    return best, {"frame_pass_ms": timings, "picked": _name(best)}
