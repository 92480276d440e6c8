"""CPU lanes: a batch's rows split across threads, one core each.

On CPU a batch gains almost nothing from being one big matrix (the maze model's
pass costs the same per row at 1 or 4 rows), while a second intra-op OpenMP thread
is worse than none under the server's passive wait (its wake-ups cost more than it
computes; ``realtime/server/cli.py``). Lanes use the other cores the other way round: each
lane is a thread running its share of the rows with the one intra-op thread it has,
so nothing waits at an OpenMP barrier, and torch drops the GIL inside every op.

    lanes = CpuLanes(default_lanes())
    outs = lanes.map(work, parts)      # work(part) for every part, part 0 on the caller's thread

``default_lanes``: the cores this process may run on divided by torch's intra-op threads.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Sequence, TypeVar

import torch

P = TypeVar("P")
R = TypeVar("R")


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_lanes() -> int:
    """One lane per core left over by torch's intra-op threads (cores // intra-op threads)."""
    return max(1, usable_cores() // max(1, torch.get_num_threads()))


def split_rows(rows: int, lanes: int) -> list[range]:
    """``rows`` split into at most ``lanes`` contiguous, near-equal, non-empty ranges (in order)."""
    parts = min(lanes, rows)
    bounds = [rows * i // parts for i in range(parts + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(parts)]


class CpuLanes:
    """``lanes - 1`` worker threads (the caller's thread is lane 0), each with the caller's intra-op threads."""

    def __init__(self, lanes: int) -> None:
        self.lanes = max(1, int(lanes))
        threads = torch.get_num_threads()
        self._pool = (ThreadPoolExecutor(self.lanes - 1, thread_name_prefix="cpu-lane",
                                         initializer=torch.set_num_threads, initargs=(threads,))
                      if self.lanes > 1 else None)

    def map(self, work: Callable[[P], R], parts: Sequence[P]) -> list[R]:
        """``[work(p) for p in parts]``, part 0 here and the others on the lanes. Returns only
        once every part has finished (also when one raises: the first error is raised then)."""
        if self._pool is None or len(parts) < 2:
            return [work(p) for p in parts]
        if len(parts) > self.lanes:
            raise ValueError(f"{len(parts)} parts for {self.lanes} lanes")
        futures: list[Future] = [self._pool.submit(work, p) for p in parts[1:]]
        first: R | None = None
        error: BaseException | None = None
        try:
            first = work(parts[0])
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after the lanes finish
            error = exc
        rest: list[R] = []
        for f in futures:
            try:
                rest.append(f.result())
            except BaseException as exc:  # noqa: BLE001 - the first error wins
                error = error or exc
        if error is not None:
            raise error
        return [first, *rest]  # type: ignore[list-item]

    def submit(self, work: Callable[[P], R], part: P) -> Future:
        """``work(part)`` on a lane thread, not waited for (needs ``lanes`` > 1; a ``map`` meanwhile
        queues its parts behind it)."""
        if self._pool is None:
            raise RuntimeError("one lane: nothing runs beside the caller")
        return self._pool.submit(work, part)
