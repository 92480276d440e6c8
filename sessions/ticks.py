"""Tick snapshots: everything one tick of one session runs on, fixed when the tick begins.

A :class:`TickRequest` carries the tick's four identities (``session_id``, ``request_id``,
``chunk_index``, ``applied_event_ids``) to the model. Its result must echo them; that is
checked once, by the kind's base on the engine thread (``models/world/base.py``,
``check_chunk``), and the session commits from that checked result
(``Session.complete_tick``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sessions.frozen import FrozenDict


@dataclass(frozen=True)
class TickRequest:
    """One tick's immutable snapshot.

    ``applied_event_ids`` are the events this tick applies, ascending. ``controls``
    maps every track to its reduced value for this tick (for ``keys``: one frozenset
    of held keys per frame).
    """

    session_id: str
    request_id: str
    chunk_index: int
    applied_event_ids: tuple[int, ...]
    prompt: str | None
    controls: FrozenDict

    def __post_init__(self) -> None:
        object.__setattr__(self, "applied_event_ids", tuple(self.applied_event_ids))
        if not isinstance(self.controls, FrozenDict):
            object.__setattr__(self, "controls", FrozenDict(self.controls))
