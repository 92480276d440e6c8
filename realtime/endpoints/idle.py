"""How long a session may idle: ``IdleClock`` and ``receive_or_idle``.

A session whose client sends nothing and takes nothing for ``LimitsConfig.idle_timeout_s``
is idle; the endpoint's lifecycle (``realtime/endpoints/lifecycle.py``) tells the client in
its protocol (``idle_timeout``) and closes with ``CLOSE_IDLE_TIMEOUT``. Work in flight for
the session (a tick, a decoder window, an inference) keeps it alive however long it takes.

Event loop only.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")

# How long the goodbye of an idle session (its error, ``session.closed``, the close frame)
# may take: a client that does not read cannot take it, and its socket is then dropped.
GOODBYE_TIMEOUT_S = 2.0


class IdleClock:
    """When the session was last active. ``timeout_s`` 0 turns the timeout off.

    While ``receive_or_idle`` waits, one timer of the clock watches the deadline. It is
    not set again per message: ``touch`` only moves ``_last``, and a timer that fires
    early (the session was active since it was set) sets itself for the new deadline. So
    a session that talks every few milliseconds costs one timer per ``timeout_s``, not
    one per message (``asyncio.timeout`` per receive was ~13 us of a ~0.5 ms OpenPI call).
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = float(timeout_s)
        self._last = time.monotonic()
        self.stopped = False  # the server drains: the drain closes the socket, never the timeout
        self._timer: asyncio.TimerHandle | None = None
        self._waiter: asyncio.Task | None = None  # the task in receive_or_idle's receive
        self._expired = False  # the timer cancelled the waiter (not anyone else)

    def stop(self) -> None:
        """From now on ``receive_or_idle`` only receives (the connection's drain began)."""
        self.stopped = True

    def close(self) -> None:
        """The connection has ended: cancel the timer now. Left armed, it would hold this
        clock in the event loop for up to ``timeout_s`` after the socket is gone, one per
        closed connection, however fast a client reconnects. Idempotent."""
        self.stopped = True
        self._waiter = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def enabled(self) -> bool:
        return self.timeout_s > 0

    @property
    def reply_timeout_s(self) -> float | None:
        """How long a reply may wait for the client to take it before the client is dropped:
        the idle timeout (None while it is off). A client that stops reading would otherwise
        hold the task sending it, and no idle close could run there."""
        return self.timeout_s if self.enabled else None

    def touch(self) -> None:
        """The client sent something, or took output."""
        self._last = time.monotonic()

    def left(self) -> float:
        """Seconds until the session counts as idle (<= 0: it does now)."""
        return self._last + self.timeout_s - time.monotonic()

    def _watch(self, task: asyncio.Task) -> None:
        """``task`` waits in a receive: cancel it once the deadline passes (event loop)."""
        self._waiter, self._expired = task, False
        if self._timer is None:
            self._timer = task.get_loop().call_later(max(0.0, self.left()), self._check)

    def _unwatch(self) -> None:
        self._waiter, self._expired = None, False

    def _check(self) -> None:
        """The timer: set again for a deadline that moved, else cancel the waiting receive.
        Nobody waiting (the session is busy, or gone): no timer until the next wait."""
        self._timer = None
        waiter = self._waiter
        if waiter is None or self.stopped or waiter.done():
            return
        left = self.left()
        if left > 0:
            self._timer = waiter.get_loop().call_later(left, self._check)
            return
        self._expired = True
        waiter.cancel()


class Idle:
    """``receive_or_idle``'s answer when the session went idle."""


IDLE = Idle()


async def receive_or_idle(clock: IdleClock, receive: Callable[[], Awaitable[T]],
                          busy: Callable[[], bool]) -> T | Idle:
    """``receive()``'s result, or ``IDLE`` once nothing arrived and nothing was taken for the
    clock's timeout while ``busy()`` (work in flight for the session) was false. Never
    ``IDLE`` once the clock is stopped (a drain closes the socket itself, with 1001).

    The time counts from this call: handling the previous message (a ``session.create``
    waiting for the engine) is not the client's idleness. ``receive`` must be safe to
    cancel (starlette's ``WebSocket.receive`` is: uvicorn's queue keeps a message that was
    not taken).
    """
    clock.touch()
    while True:
        if not clock.enabled or clock.stopped:  # checked again after every timeout
            return await receive()
        if clock.left() <= 0:
            if not busy():
                return IDLE
            clock.touch()  # work in flight: the timeout counts from now again
            continue
        task = asyncio.current_task()
        assert task is not None
        clock._watch(task)
        try:
            return await receive()
        except asyncio.CancelledError:
            # The clock's own cancel (and nobody else's) is the timeout: look again.
            if not clock._expired or task.uncancel() > 0:
                raise
        finally:
            clock._unwatch()
