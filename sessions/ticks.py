"""Tick snapshots and the metadata that must come back with their results.

A :class:`TickRequest` is everything one tick of one session runs on, fixed when
the tick begins. The engine echoes the four identities of the request with its
output; the session commits the tick only if that :class:`ChunkMetadata` matches
the snapshot field for field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sessions.errors import ErrorCode, SessionError
from sessions.frozen import FrozenDict
from sessions.reducers import decode_control, encode_control

_REQUEST_FIELDS = (
    "session_id",
    "request_id",
    "chunk_index",
    "applied_event_ids",
    "prompt",
    "controls",
)
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

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON form (key sets as sorted lists)."""
        return {
            "session_id": self.session_id,
            "request_id": self.request_id,
            "chunk_index": self.chunk_index,
            "applied_event_ids": list(self.applied_event_ids),
            "prompt": self.prompt,
            "controls": {
                track: encode_control(track, value) for track, value in self.controls.items()
            },
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TickRequest:
        """Inverse of :meth:`to_dict`: ``TickRequest.from_dict(r.to_dict()) == r``."""
        _check_fields(d, _REQUEST_FIELDS, "tick request")
        ids = _check_identities(d)
        prompt = d["prompt"]
        if prompt is not None and type(prompt) is not str:
            raise SessionError(ErrorCode.BAD_REQUEST, "tick request: prompt must be str or null")
        controls = d["controls"]
        if not isinstance(controls, Mapping):
            raise SessionError(ErrorCode.BAD_REQUEST, "tick request: controls must be an object")
        return cls(
            session_id=d["session_id"],
            request_id=d["request_id"],
            chunk_index=d["chunk_index"],
            applied_event_ids=ids,
            prompt=prompt,
            controls=FrozenDict(
                {track: decode_control(track, value) for track, value in controls.items()}
            ),
        )


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "request_id": self.request_id,
            "chunk_index": self.chunk_index,
            "applied_event_ids": list(self.applied_event_ids),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChunkMetadata:
        _check_fields(d, _METADATA_FIELDS, "chunk metadata")
        ids = _check_identities(d)
        return cls(d["session_id"], d["request_id"], d["chunk_index"], ids)


def _check_fields(d: Mapping[str, Any], fields: tuple[str, ...], what: str) -> None:
    if not isinstance(d, Mapping) or set(d) != set(fields):
        got = sorted(map(str, d)) if isinstance(d, Mapping) else type(d).__name__
        raise SessionError(ErrorCode.BAD_REQUEST, f"{what}: fields must be {fields}, got {got}")


def _check_identities(d: Mapping[str, Any]) -> tuple[int, ...]:
    if type(d["session_id"]) is not str or type(d["request_id"]) is not str:
        raise SessionError(ErrorCode.BAD_REQUEST, "session_id and request_id must be strings")
    if type(d["chunk_index"]) is not int or d["chunk_index"] < 0:
        raise SessionError(ErrorCode.BAD_REQUEST, "chunk_index must be a non-negative int")
    ids = d["applied_event_ids"]
    if not isinstance(ids, (list, tuple)) or any(type(i) is not int for i in ids):
        raise SessionError(ErrorCode.BAD_REQUEST, "applied_event_ids must be a list of ints")
    return tuple(ids)
