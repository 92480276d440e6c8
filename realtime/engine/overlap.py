"""The launch gate: the event loop's bulk sends wait while the engine thread prepares a batch.

The engine thread and the event loop share one GIL. A world batch's sessions come back
to the engine's queue together, and their previous chunks' sends become ready on the
loop at that same moment, just as the engine starts the next batch. Each of the
engine's Python steps before the device work is queued (the inputs' copy, the graph
replay) then waits for the loop to drop the GIL, and the GPU idles meanwhile: on the
H200 the maze's batch took 18.5 ms served against 14.4 ms bare at 32 sessions
(``bench/results/world_serving_h200.json``, the ``model_ms`` of each row's profile).

So the engine ``close``\\ s the gate when it starts a batch and ``open``\\ s it once the
device has the work (the adapter's launch listener, ``ModelAdapter.set_launch_listener``)
or the forward ends; a send that finds it closed waits (``wait``), at most
``LAUNCH_HOLD_MAX_S``, and goes out while the device computes instead. Nothing is
dropped or reordered: each session's sends still go in chunk order.
"""

from __future__ import annotations

import asyncio
import threading

# The longest a send waits for a launch (seconds). A batch's preparation takes well under
# a millisecond; a first batch that captures CUDA graphs takes seconds, and its sends go
# out after this instead of waiting for it.
LAUNCH_HOLD_MAX_S = 0.02


class LaunchGate:
    """``close``/``open`` from the engine thread; ``await wait()`` on an event loop."""

    def __init__(self, max_hold_s: float = LAUNCH_HOLD_MAX_S) -> None:
        self.max_hold_s = max_hold_s
        self._closed = False
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """A batch is being prepared: sends from now on wait for ``open``."""
        self._closed = True

    def open(self) -> None:
        """The device has the batch's work (or the forward ended): wake the waiting sends,
        with one hand-off per event loop."""
        if not self._closed:
            return
        with self._lock:
            self._closed = False
            waiters, self._waiters = self._waiters, []
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future]] = {}
        for loop, fut in waiters:
            by_loop.setdefault(loop, []).append(fut)
        for loop, futs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_release, futs)
            except RuntimeError:  # that loop closed; its waiters are gone with it
                pass

    async def wait(self) -> None:
        """Return at once while the gate is open; else when it opens, or after ``max_hold_s``."""
        if not self._closed:
            return
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._lock:
            if not self._closed:  # opened between the check and the lock
                return
            self._waiters.append((loop, fut))
        timer = loop.call_later(self.max_hold_s, _release, [fut])
        try:
            await fut
        finally:
            timer.cancel()


def _release(futs: list[asyncio.Future]) -> None:
    for fut in futs:
        if not fut.done():
            fut.set_result(None)
