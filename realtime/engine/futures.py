"""A queued tick's future, and resolving futures from the engine thread.

The asyncio side awaits futures of its own event loop; the engine thread resolves them
with ``loop.call_soon_threadsafe``, one hand-off per event loop and batch (each wakes the
loop: a batch of 128 resolved one by one would wake it 128 times while the engine still
works through the batch, and the two threads would trade the GIL all the while). On the
loop's own thread (``Engine.run_now``'s failure path) a future is set at once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from realtime.engine.scheduler import Tick


@dataclass(kw_only=True)
class Job(Tick):
    """A queued tick with its work, its postcondition and the future its caller awaits."""

    work: Any
    validate: Callable[[Any], None] | None
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop

    def cancelled(self) -> bool:
        return self.future.cancelled()


def resolve_all(done: Sequence[tuple[Job, Any]]) -> None:
    """Resolve each job's future with its result, one hand-off per event loop."""
    if len(done) == 1:  # a batch of one
        job, value = done[0]
        resolve(job.loop, job.future, value)
        return
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, Any]]] = {}
    for job, value in done:
        by_loop.setdefault(job.loop, []).append((job.future, value))
    for loop, items in by_loop.items():
        def set_results(items: list[tuple[asyncio.Future, Any]] = items) -> None:
            for fut, value in items:
                if not fut.done():
                    fut.set_result(value)

        call(loop, set_results)


def resolve(loop: asyncio.AbstractEventLoop | None, fut: asyncio.Future, value: Any) -> None:
    def set_result() -> None:
        if not fut.done():
            fut.set_result(value)

    call(loop, set_result)


def reject(loop: asyncio.AbstractEventLoop | None, fut: asyncio.Future, exc: BaseException) -> None:
    def set_exception() -> None:
        if not fut.done():
            fut.set_exception(exc)

    call(loop, set_exception)


def call(loop: asyncio.AbstractEventLoop | None, fn: Callable[[], Any]) -> None:
    """``fn()`` on ``loop``: at once on its own thread, else through ``call_soon_threadsafe``;
    nothing if it has closed."""
    if loop is None or loop.is_closed():
        return
    if asyncio._get_running_loop() is loop:
        fn()
        return
    try:
        loop.call_soon_threadsafe(fn)
    except RuntimeError:  # the loop closed between the check and the call
        pass
