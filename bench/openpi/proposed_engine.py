"""A proposed change to ``realtime/engine.py``'s batching, measured by the OpenPI benchmarks.

Not used by the server: ``bench_loopback.py`` runs our server twice, with the
committed engine ("ours") and with this one swapped in ("ours-proposed"), in the
same run as the reference. The change is only *when to stop waiting* for a
fuller batch in ``Engine._take_batch``.

The committed engine waits up to ``batch_wait_ms`` after the oldest queued tick
whenever the queue is short of ``max_batch``. Two costs follow:

1. A lone robot always waits: every call pays ``batch_wait_ms`` (loopback p50
   3.5 ms instead of ~1 ms).
2. A busy fleet stays split. With N robots in tight loops and an F ms forward,
   the robots answered by batch k come back a few ms after it ends; by then the
   oldest queued tick (queued during batch k) is long past its deadline, so
   batch k+1 starts with only the robots that queued during batch k. The fleet
   settles into two half batches for good (16 robots, 50 ms: ~8 per forward,
   ~155 calls/s)::

        committed:  [=== 8 ===][=== 8 ===][=== 8 ===][=== 8 ===]   each robot every 2 forwards
        proposed:   [=== 8 ===]w[=== 16 ==]w[=== 16 ==]w[== 16 ==]  w: until the returners are back

The proposal: wait only for *returners*, the sessions of this model's previous
batch, and only until ``return_wait_ms`` after that batch ended. They are the
sessions known to be in a loop; a stranger never makes anyone wait, so a lone
robot (or robots calling at random times, as ``ActionChunkBroker`` does every
``action_horizon`` steps) is served at once, and a fleet in lockstep rejoins
into full batches. Nothing else changes (controls first, one tick per session
per batch, cancelled ticks skipped).
"""

from __future__ import annotations

import time
from typing import Any

from realtime.engine import Engine, _Job


class ReturnAwareEngine(Engine):
    def __init__(self, *args: Any, return_wait_ms: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Per model: how long after a batch ends its sessions may take to come back.
        self._return_wait = (return_wait_ms if return_wait_ms is not None else 20.0) / 1000.0
        self._returners: dict[str, set[str]] = {}
        self._free_since: dict[str, float] = {}

    def _take_batch(self) -> list[_Job]:
        with self._cv:
            ready = [(q[0].enqueued, name) for name, q in self._ticks.items() if q]
            if not ready:
                return []
            _, name = min(ready)
            queue = self._ticks[name]
            limit = max(1, self._adapters[name].max_batch)
            returners = self._returners.get(name, set())
            deadline = self._free_since.get(name, 0.0) + self._return_wait
            while (
                len(queue) < limit
                and not returners <= {j.session_id for j in queue}
                and not self._controls
                and not self._stopping
            ):
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                self._cv.wait(remaining)
            if self._controls or self._stopping or not queue:
                return []  # serve controls first; the ticks stay queued
            batch: list[_Job] = []
            seen: set[str] = set()
            skipped: list[_Job] = []
            while queue and len(batch) < limit:
                job = queue.popleft()
                if job.session_id is not None and job.session_id in seen:
                    skipped.append(job)
                    continue
                if job.future.cancelled():
                    continue
                if job.session_id is not None:
                    seen.add(job.session_id)
                batch.append(job)
            queue.extendleft(reversed(skipped))
            return batch

    def _run_batch(self, batch: list[_Job]) -> None:
        try:
            super()._run_batch(batch)
        finally:
            model = batch[0].model
            self._returners[model] = {j.session_id for j in batch if j.session_id is not None}
            self._free_since[model] = time.perf_counter()
