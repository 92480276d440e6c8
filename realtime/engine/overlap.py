"""Overlap: the event loop's Python runs while the device computes, not while the engine prepares.

The engine thread and the event loop share one GIL. Three pieces keep them out of each
other's way.

**The launch gate.** A world batch's sessions come back to the engine's queue together,
and their previous chunks' sends become ready on the loop at that same moment, just as the
engine starts the next batch. Each of the engine's Python steps before the device work is
queued (the inputs' copy, the graph replay) would then wait for the loop to drop the GIL,
and the GPU would idle meanwhile. So the engine ``close``\\ s the gate when it starts a batch
and ``open``\\ s it once the device has the work (the adapter's launch listener,
``ModelAdapter.set_launch_listener``) or the forward ends; a send that finds it closed
waits (``wait``), at most ``LAUNCH_HOLD_MAX_S``, and goes out while the device computes
instead. Nothing is dropped or reordered: each session's sends still go in chunk order.
Only a model that has said it launches device work closes the gate: the others compute
inside ``run_batch``, and holding sends would only delay them. With the gate, the maze's
batch of 32 sessions on the H200 takes 16.3 ms served against 15.8 ms bare at one tick in
flight (``bench/results/world_serving_curve_h200.json``, the ``model_ms`` of the ``rgb8``
row's profile).

**Held results.** A model that announces its launches gets its batch's results resolved
once the *next* batch's device work is queued, not as soon as the batch ends. Sessions
whose next tick is already queued (a world session with ticks in flight,
``Session.max_in_flight``) then wake the event loop while the device computes, and the
loop's Python does not take the GIL from the engine while it prepares the next batch::

    engine:  [prep N+1][launch]--- device N+1 ---[sync][post]   [prep N+2][launch] ...
    loop:                  results N: commit, queue N+2, send chunk N

Nothing waits on a held result: the engine flushes them before it waits (idle, or for
returners), before controls and other models' batches, before a failure is reported, and
when a batch ends at the latest. Only a model whose last batch queued its device work
within ``LAUNCH_HOLD_MAX_S`` of its start is held (a model that computes inside
``run_batch`` and says so at the end would hold its results for a whole forward).

**GIL hand-off.** The one session of the engine's last batch coming back (a world session
alone, one robot) hands it the GIL at once (``hand_off_gil``). Otherwise the woken engine
would wait for the loop's next Python (the send, the next message) or for the switch
interval (``EngineConfig.switch_interval_s``) before it could prepare the batch. Nothing
else hands over: a batch that more sessions could still join would be taken smaller, and
after a returner wait of several sessions the engine's preparation would contend with the
loop's work for them (bench/results/world_handoff_ab2_h200.json: 8 sessions at one tick in
flight, 0.80-0.86x of bare with that hand-off, 0.84-0.87x without).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any, Callable, Iterable, Sequence

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
                loop.call_soon_threadsafe(_let_through, futs)
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
        timer = loop.call_later(self.max_hold_s, _let_through, [fut])
        try:
            await fut
        finally:
            timer.cancel()


def _let_through(futs: list[asyncio.Future]) -> None:
    for fut in futs:
        if not fut.done():
            fut.set_result(None)


class HeldResults:
    """Which models hold their results, and the held ones (engine thread, or whoever holds the
    engine's owner lock). ``resolve`` resolves a list of (job, result) on their loops."""

    def __init__(self, models: Iterable[str], gate: LaunchGate,
                 resolve: Callable[[Sequence[tuple[Any, Any]]], None]) -> None:
        self.gate = gate
        self._resolve = resolve
        # Per model: seconds from its last launching batch's start to its launch; inf until
        # it first launches (then it launches, and the gate closes for its batches).
        self._launch_s = {n: math.inf for n in models}
        self._started = 0.0
        self._held: list[tuple[Any, Any]] = []

    def __len__(self) -> int:
        return len(self._held)

    def holds(self, model: str) -> bool:
        """Whether ``model``'s results wait for the next launch: its last batch queued its
        device work within ``LAUNCH_HOLD_MAX_S`` of its start."""
        return self._launch_s[model] <= LAUNCH_HOLD_MAX_S

    def batch_started(self, model: str, now: float) -> None:
        """A forward of ``model`` starts: the gate closes if the model launches."""
        self._started = now
        if self._launch_s[model] < math.inf:
            self.gate.close()

    def launched(self, model: str, now: float) -> None:
        """``model``'s device work for this batch is queued (its launch listener): the loop
        may send, and take the last batch's results, while the device computes."""
        self._launch_s[model] = now - self._started
        self.gate.open()
        self.flush()

    def batch_ended(self) -> None:
        """The forward ended: the gate opens, and a batch that launched nothing keeps the last
        one's results waiting no longer."""
        self.gate.open()
        self.flush()

    def hold(self, done: Sequence[tuple[Any, Any]]) -> None:
        """Keep a batch's results until the next launch."""
        self._held.extend(done)

    def flush(self) -> None:
        """Resolve the held results."""
        if self._held:
            held, self._held = self._held, []
            self._resolve(held)


def hand_off_gil() -> None:
    """Let a thread waiting for the GIL (the engine, just woken) take it now (see "GIL
    hand-off"): sleeping releases it, and CPython's switching makes this thread wait until
    the waiter has had it."""
    time.sleep(0)
