"""Counters the engine thread writes and ``GET /metrics`` reads, without a lock.

The engine thread is the only writer of everything here; the scrape (event loop)
only reads. Python ints and floats are replaced whole under the GIL, so a reader
sees an old or a new value, never a torn one, and the engine never waits on the
scrape (a lock shared with it would put the scrape on the tick's critical path).
Per-model structures are made once, at engine start, so no dict the scrape walks
changes size; the failure ``Counter`` can gain a key, and the scrape copies it with
``dict()`` (one C call, atomic under the GIL).
"""

from __future__ import annotations

import bisect
import collections
from dataclasses import dataclass, field

# Seconds: a CPU tick is milliseconds to a second; a robot call on a large policy, seconds.
LATENCY_BUCKETS_S: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                                        5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128)


class Buckets:
    """A histogram with one writer: counts per upper bound (the last is +Inf) and a sum."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        """``[(le, count)]`` as Prometheus wants it, the last ``le`` "+Inf"."""
        out, total = [], 0
        counts = list(self.counts)
        for bound, count in zip((*[repr(float(b)) for b in self.bounds], "+Inf"), counts):
            total += count
            out.append((bound, float(total)))
        return out


@dataclass
class ModelStats:
    """One model's tick counters (engine thread writes)."""

    ticks: int = 0  # works that ended committed
    failures: collections.Counter = field(default_factory=collections.Counter)  # models.base.failure_code
    busy_seconds: float = 0.0
    tick_seconds: Buckets = field(default_factory=lambda: Buckets(LATENCY_BUCKETS_S))  # queued -> done
    batch_size: Buckets = field(default_factory=lambda: Buckets(BATCH_BUCKETS))


@dataclass
class EngineStats:
    """The engine's counters, written by whoever holds its owner lock (the engine thread, or
    ``Engine.run_now`` on the event loop: one at a time)."""

    batches: int = 0
    works: int = 0
    inline_works: int = 0  # of works, those run by ``Engine.run_now`` on the event loop
    failed_works: int = 0
    controls: int = 0
    busy_seconds: float = 0.0
    batch_sizes: collections.Counter = field(default_factory=collections.Counter)
    models: dict[str, ModelStats] = field(default_factory=dict)  # per model, made at engine start
