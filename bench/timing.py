"""The figures a benchmark takes of its timings: device synchronisation around a timed span,
and the median, mean and 99th percentile of a run's samples (rounded to the microsecond in ms)."""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a no-op off CUDA), so that a clock read after it counts it."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def med(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def mean(xs: list[float]) -> float | None:
    return round(statistics.fmean(xs), 3) if xs else None


def p99(xs: list[float]) -> float | None:
    """The 99th percentile by nearest rank (with few samples: the largest)."""
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)], 3)
