"""realtime/server/limits.py: ``receive_or_idle`` over one lazily re-armed timer per clock."""

from __future__ import annotations

import asyncio
import time

import pytest

from realtime.endpoints.idle import IDLE, IdleClock, receive_or_idle


def test_messages_then_idle_after_the_timeout_with_one_timer():
    async def main() -> None:
        clock = IdleClock(0.2)
        queue: asyncio.Queue[int] = asyncio.Queue()
        handles = set()

        async def feed() -> None:
            for i in range(10):
                await asyncio.sleep(0.01)
                queue.put_nowait(i)

        feeder = asyncio.ensure_future(feed())
        got = []
        for _ in range(10):
            got.append(await receive_or_idle(clock, queue.get, lambda: False))
            handles.add(id(clock._timer))
        # Ten receives, well within the timeout: the timer set by the first one still stands.
        assert got == list(range(10)) and len(handles) == 1
        started = time.monotonic()
        assert await receive_or_idle(clock, queue.get, lambda: False) is IDLE
        assert 0.15 < time.monotonic() - started < 1.0
        await feeder

    asyncio.run(main())


def test_busy_keeps_the_session_and_a_late_message_is_received():
    async def main() -> None:
        clock = IdleClock(0.1)
        queue: asyncio.Queue[str] = asyncio.Queue()
        asyncio.get_running_loop().call_later(0.35, queue.put_nowait, "late")
        # Three timeouts pass while busy: the clock starts again each time and the message arrives.
        assert await receive_or_idle(clock, queue.get, lambda: True) == "late"
        assert queue.empty()

    asyncio.run(main())


def test_someone_elses_cancel_is_not_swallowed():
    async def main() -> None:
        clock = IdleClock(5.0)
        queue: asyncio.Queue[int] = asyncio.Queue()
        task = asyncio.ensure_future(receive_or_idle(clock, queue.get, lambda: False))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert clock._waiter is None

    asyncio.run(main())


def test_a_stopped_clock_only_receives():
    async def main() -> None:
        clock = IdleClock(0.05)
        queue: asyncio.Queue[int] = asyncio.Queue()
        task = asyncio.ensure_future(receive_or_idle(clock, queue.get, lambda: False))
        await asyncio.sleep(0.01)
        clock.stop()  # the drain: never IDLE from now on
        await asyncio.sleep(0.15)
        assert not task.done()
        queue.put_nowait(7)
        assert await task == 7

    asyncio.run(main())


def test_close_cancels_the_armed_timer():
    async def main() -> None:
        clock = IdleClock(300.0)
        queue: asyncio.Queue[int] = asyncio.Queue()
        queue.put_nowait(1)
        assert await receive_or_idle(clock, queue.get, lambda: False) == 1
        timer = clock._timer
        assert timer is not None and not timer.cancelled()  # armed for the next wait, as designed
        clock.close()  # the connection ended: nothing of it stays in the loop for 300 s
        assert timer.cancelled() and clock._timer is None and clock.stopped
        clock.close()  # idempotent

    asyncio.run(main())
