"""How long a world event takes to be seen: from its acceptance to the first frame of the
chunk that applied it going out (``realtime_world_event_to_frame_seconds``).

::

    event 7 accepted ─┐        event 8 accepted ─┐
                      │ tick N (applies 7, 8) ... │ chunk N's frames out ──> observe(out - t7), observe(out - t8)

One ``EventClock`` per world connection, on the event loop. It holds the acceptance
time of the events no sent chunk has applied yet, at most ``limit`` of them (the
session's ``max_pending``: the session refuses events past that many anyway), so a
client cannot grow it. An event whose chunk never goes out (a failed tick, a reset
that drops it) is forgotten at the next ``restart``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Callable


class EventClock:
    """Acceptance times of one session's events until their chunk's frames are sent."""

    def __init__(self, observe: Callable[[float], None], limit: int) -> None:
        self.observe, self.limit = observe, limit
        self._accepted: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self._accepted)

    def restart(self) -> None:
        """A session starts (create, reset): the previous one's events are not coming."""
        self._accepted.clear()

    def accepted(self, event_id: int) -> None:
        """``event_id`` was accepted now (not timed once ``limit`` events wait)."""
        if len(self._accepted) < self.limit:
            self._accepted.setdefault(event_id, time.perf_counter())

    def shown(self, event_ids: Iterable[int]) -> None:
        """Frames of the chunk that applied ``event_ids`` went out: each one still waiting is
        observed once (a streamed chunk's later frames find them gone)."""
        if not self._accepted:
            return
        now = time.perf_counter()
        for event_id in event_ids:
            then = self._accepted.pop(event_id, None)
            if then is not None:
                self.observe(now - then)
