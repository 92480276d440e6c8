"""Every open socket, for the server's drain: ``LiveSessions``.

``LiveSessions`` is the registry of every live session (``sessions/registry.py``) plus
every open socket's endpoint, so that a server shutdown drains each one (``drain``):
in-flight work finishes, then close 1001, whatever the kind. Event loop only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from protocols.close_codes import CLOSE_GOING_AWAY
from realtime.endpoints.idle import GOODBYE_TIMEOUT_S
from sessions.registry import SessionRegistry

if TYPE_CHECKING:
    from realtime.endpoints.lifecycle import SessionEndpoint

log = logging.getLogger(__name__)


class LiveSessions(SessionRegistry):
    """Every live session of every kind, and every open socket. Event loop only."""

    def __init__(self) -> None:
        super().__init__()
        self._sockets: set[SessionEndpoint] = set()
        self.draining = False  # the server is shutting down: no new socket, no new work

    def attach(self, owner: SessionEndpoint) -> None:
        """An endpoint's socket is open (drained at shutdown until ``detach``)."""
        self._sockets.add(owner)

    def detach(self, owner: SessionEndpoint) -> None:
        self._sockets.discard(owner)

    async def drain(self, timeout_s: float) -> None:
        """Server shutdown: every open socket drains at once (``SessionEndpoint.drain``); one
        still draining after ``timeout_s`` is closed with CLOSE_GOING_AWAY anyway (its
        work is abandoned), so every client gets the same close code. Sockets opened from
        now on are refused (``Connection.accept``)."""
        self.draining = True
        owners = list(self._sockets)
        if not owners:
            return
        log.info("drain: %d open sockets, waiting at most %.1f s for their in-flight work", len(owners), timeout_s)
        tasks = {asyncio.ensure_future(owner.drain()): owner for owner in owners}
        done, late = await asyncio.wait(tasks, timeout=timeout_s)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.warning("drain: a socket's drain failed: %r", task.exception())
        for task in late:
            # Left running: it ends on its own once its socket is closed (or is cancelled
            # with the server's other tasks); cancelling it here would cut its cleanup.
            log.warning("drain: in-flight work still running after %.1f s: closing its socket with %d",
                        timeout_s, CLOSE_GOING_AWAY)
            task.add_done_callback(_quiet)
        # All at once, each bounded: a client that stopped reading cannot take the close
        # frame either (an idle timeout no longer drops it while the server drains), so it
        # is dropped after GOODBYE_TIMEOUT_S.
        await asyncio.gather(*(tasks[task].conn.close(CLOSE_GOING_AWAY, "server shutting down",
                                                      timeout=GOODBYE_TIMEOUT_S) for task in late))


def _quiet(task: asyncio.Task) -> None:
    """Retrieve a late drain's outcome (it ran past the deadline; the socket is closed)."""
    if not task.cancelled() and task.exception() is not None:
        log.info("drain: a late drain ended with %r", task.exception())
