"""A bounded memory of applied event ids, so a late resend reads as a duplicate."""

from __future__ import annotations

import bisect


class AppliedIds:
    """Applied event ids as sorted, disjoint, closed intervals.

    A commit only ever applies ids above the previous floor, so ids arrive in
    increasing order and a new id either extends the last interval or opens one::

        applied:  0 1 2 3 . . 6 7 . 9      intervals [0,3] [6,7] [9,9]
        add(10):                           intervals [0,3] [6,7] [9,10]
        add(12):                           intervals [0,3] [6,7] [9,10] [12,12]

    A client numbering its events 0, 1, 2, ... costs one interval forever. Gaps cost
    one interval each; past ``max_intervals`` the oldest are forgotten, and a
    forgotten id reads as never applied (the session then answers it as stale
    rather than duplicate, which is still a refusal).
    """

    def __init__(self, max_intervals: int = 1024) -> None:
        if max_intervals < 1:
            raise ValueError(f"max_intervals must be >= 1, got {max_intervals}")
        self.max_intervals = max_intervals
        self._lo: list[int] = []
        self._hi: list[int] = []

    @property
    def last(self) -> int:
        """The highest id added, or -1."""
        return self._hi[-1] if self._hi else -1

    @property
    def intervals(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self._lo, self._hi))

    def add(self, event_id: int) -> None:
        """Record ``event_id``, which must be above every id added before."""
        if event_id <= self.last:
            raise ValueError(f"event id {event_id} is not above the last applied id {self.last}")
        if self._hi and event_id == self._hi[-1] + 1:
            self._hi[-1] = event_id
            return
        self._lo.append(event_id)
        self._hi.append(event_id)
        if len(self._lo) > self.max_intervals:
            del self._lo[0], self._hi[0]

    def __contains__(self, event_id: object) -> bool:
        if type(event_id) is not int:
            return False
        # The last interval starting at or before event_id is the only candidate.
        i = bisect.bisect_right(self._lo, event_id) - 1
        return i >= 0 and event_id <= self._hi[i]
