"""The maze model's CPU number format: float32, or bfloat16 where this CPU is faster at it.

``models.cpu_format`` decides (float32 unless the CPU has native bf16, then the
faster of one timed frame pass in each). bfloat16 is the format the model card's
evaluation runs in (on CUDA), so either choice is one whose quality figures are
measured.
"""

from __future__ import annotations

from typing import Any

import torch

from models.cpu_format import faster_format, steady_ms
from models.world.maze.cache import FrameCache
from models.world.maze.model import MazeDiT


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
    return steady_ms(lambda: model.forward_frame(x, t, a, pos, sink, view), repeats=repeats)


def pick_cpu_dtype(models: dict[torch.dtype, MazeDiT], window: int) -> tuple[torch.dtype, dict[str, Any]]:
    """The faster of ``models`` (float32 and bfloat16 copies) on one frame pass; (dtype, timings)."""
    return faster_format("maze", {dt: (lambda m=m: frame_pass_ms(m, window)) for dt, m in models.items()})
