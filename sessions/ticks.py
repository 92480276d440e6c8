"""Tick snapshots and the metadata that must come back with their results.

A :class:`TickRequest` is everything one tick of one session runs on, fixed when
the tick begins. The engine echoes the four identities of the request with its
output; the session commits the tick only if that :class:`ChunkMetadata` matches
the snapshot field for field.
"""

from __future__ import annotations

from dataclasses import dataclass

from sessions.frozen import FrozenDict

_METADATA_FIELDS = ("session_id", "request_id", "chunk_index", "applied_event_ids")


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


@dataclass(frozen=True)
class ChunkMetadata:
    """The identities a tick's result carries back; see :meth:`matches`."""

    session_id: str
    request_id: str
    chunk_index: int
    applied_event_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        # A list from a decoder would otherwise never compare equal to the tuple.
        object.__setattr__(self, "applied_event_ids", tuple(self.applied_event_ids))

    @classmethod
    def for_request(cls, req: TickRequest) -> ChunkMetadata:
        return cls(req.session_id, req.request_id, req.chunk_index, req.applied_event_ids)

    def matches(self, req: TickRequest) -> bool:
        """True when all four identities equal the snapshot's."""
        return (
            self.session_id == req.session_id
            and self.request_id == req.request_id
            and self.chunk_index == req.chunk_index
            and self.applied_event_ids == req.applied_event_ids
        )

    def mismatch(self, req: TickRequest) -> list[str]:
        """Human-readable differences from ``req`` (empty when :meth:`matches`)."""
        return [
            f"{name} {getattr(self, name)!r} != {getattr(req, name)!r}"
            for name in _METADATA_FIELDS
            if getattr(self, name) != getattr(req, name)
        ]
