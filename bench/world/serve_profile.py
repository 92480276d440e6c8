"""Where a served batch's wall time goes: the engine step and the hand-off, per batch.

``ServeProfile.attach(adapter)`` wraps three methods of one adapter instance (the
engine and the endpoint call them; nothing else changes):

- ``run_batch`` (engine thread): the model's own time, batch size;
- ``end_tick`` (engine thread, right after): the engine's per-work post-processing
  (validate + end_tick) ends with the last one of a batch;
- ``tick`` (event loop, each driver building its next tick): when each session of
  the last batch came back.

One batch's cycle, from the end of batch k to the start of batch k+1::

    model | post (validate, end_tick) | hand-off + loop (resolve, commit, send, next tick) | wake | model
          t_end                        t_post                                               t_last_return   t_next

``loop_first_ms``: the first returner's delay after ``t_post`` (the hand-off itself);
``loop_last_ms``: the last one's (every session of the batch processed by the loop);
``wake_ms``: last returner to the next batch's start (engine wake-up + batch assembly).
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any


class ServeProfile:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.batches: list[dict[str, float]] = []  # start, end, post, n
        self.returns: list[float] = []  # tick() times on the loop
        self.recording = False

    def attach(self, adapter: Any) -> None:
        run_batch, end_tick, tick = adapter.run_batch, adapter.end_tick, adapter.tick
        clock = time.perf_counter

        def timed_run_batch(works):  # type: ignore[no-untyped-def]
            start = clock()
            out = run_batch(works)
            if self.recording:
                self.batches.append({"start": start, "end": clock(), "post": clock(), "n": len(works)})
            return out

        def timed_end_tick(session_id, committed):  # type: ignore[no-untyped-def]
            end_tick(session_id, committed)
            if self.recording and self.batches:
                self.batches[-1]["post"] = clock()

        # The same arguments as the seam's ``tick`` (request, seed, options, ...): a wrapper
        # that named them once broke every served tick when ``options`` was added.
        def timed_tick(*args, **kwargs):  # type: ignore[no-untyped-def]
            work = tick(*args, **kwargs)
            if self.recording:
                self.returns.append(clock())
            return work

        adapter.run_batch, adapter.end_tick, adapter.tick = timed_run_batch, timed_end_tick, timed_tick

    def start(self) -> None:
        self.batches.clear()
        self.returns.clear()
        self.recording = True

    def stop(self) -> dict[str, Any]:
        """Medians over the recorded batches (ms), and each phase's share of the wall time."""
        self.recording = False
        b, returns = self.batches, sorted(self.returns)
        if len(b) < 3:
            return {"batches": len(b)}
        rows = []
        j = 0
        for k in range(len(b) - 1):
            cur, nxt = b[k], b[k + 1]
            # The returners of batch k: tick() calls between its post and the next start.
            while j < len(returns) and returns[j] < cur["post"]:
                j += 1
            first = last = None
            while j < len(returns) and returns[j] <= nxt["start"]:
                first = returns[j] if first is None else first
                last = returns[j]
                j += 1
            if first is None:
                first = last = nxt["start"]
            rows.append({
                "model": cur["end"] - cur["start"],
                "post": cur["post"] - cur["end"],
                "loop_first": first - cur["post"],
                "loop_last": last - cur["post"],
                "wake": nxt["start"] - last,
                "cycle": nxt["start"] - cur["start"],
            })
        wall = b[-1]["start"] - b[0]["start"]
        med = {f"{key}_ms_p50": 1000 * statistics.median(r[key] for r in rows) for key in rows[0]}
        share = {f"{key}_share": sum(r[key] for r in rows) / wall
                 for key in ("model", "post", "loop_last", "wake")}
        return {"batches": len(b), "mean_batch": statistics.mean(x["n"] for x in b), **med, **share}
