"""Client events: immutable, deep-frozen prompt and control updates.

A wire event looks like::

    {"event_id": 7,
     "prompt": "a foggy harbour",                        # optional, str or null
     "controls": [{"track": "keys", "schema": "keys.v1",  # optional
                   "data": {"mode": "state", "held": ["w", "d"]}}]}

``from_wire`` checks the shape only. Whether a track exists and its data is valid
is the session's business (it owns the reducers), checked in ``accept_event``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sessions.errors import ErrorCode, SessionError
from sessions.frozen import FrozenDict, deep_freeze, thaw

MAX_PROMPT_CHARS = 2000
# One entry per track, and there are only a few tracks; the cap bounds the work a
# single event can ask for before the track names are even looked at.
MAX_CONTROLS = 16
# Event ids are client-chosen; keep them in a range every consumer can store.
MAX_EVENT_ID = 2**63 - 1
# "type" is the envelope field of the wire message the event arrives in.
_EVENT_FIELDS = frozenset({"type", "event_id", "prompt", "controls"})
_CONTROL_FIELDS = frozenset({"track", "schema", "data"})


@dataclass(frozen=True)
class ControlInput:
    """One update of one control track. ``data`` is deep-frozen on construction
    (a plain dict is copied and frozen), so it can never change afterwards."""

    track: str
    schema: str
    data: FrozenDict

    def __post_init__(self) -> None:
        _check_control(self.track, self.schema, self.data, "control", None)
        # Always copy: a FrozenDict built directly may still hold mutable values.
        object.__setattr__(self, "data", deep_freeze(self.data, "control.data"))

    def to_wire(self) -> dict[str, Any]:
        return {"track": self.track, "schema": self.schema, "data": thaw(self.data)}


@dataclass(frozen=True)
class SessionEvent:
    """One client update: an optional new prompt and at most one update per track."""

    event_id: int
    prompt: str | None = None
    controls: tuple[ControlInput, ...] = ()

    def __post_init__(self) -> None:
        if type(self.event_id) is not int or not 0 <= self.event_id <= MAX_EVENT_ID:
            raise SessionError(
                ErrorCode.BAD_REQUEST,
                f"event_id must be an integer in [0, {MAX_EVENT_ID}], got {self.event_id!r}",
            )
        eid = self.event_id
        check_prompt(self.prompt, "prompt", eid)
        controls = tuple(self.controls)
        if len(controls) > MAX_CONTROLS:
            raise SessionError(
                ErrorCode.BAD_REQUEST,
                f"controls: {len(controls)} entries, at most {MAX_CONTROLS}",
                event_id=eid,
            )
        seen: dict[str, int] = {}
        for i, control in enumerate(controls):
            if not isinstance(control, ControlInput):
                raise SessionError(
                    ErrorCode.BAD_REQUEST, f"controls[{i}] is not a ControlInput", event_id=eid
                )
            if control.track in seen:
                raise SessionError(
                    ErrorCode.BAD_REQUEST,
                    f"controls[{i}]: track {control.track!r} already updated by "
                    f"controls[{seen[control.track]}]; one update per track per event",
                    event_id=eid,
                )
            seen[control.track] = i
        object.__setattr__(self, "controls", controls)

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> SessionEvent:
        """Parse a decoded JSON event. Raises ``SessionError(BAD_REQUEST)`` naming
        the first malformed field; ``event_id`` is set on it once that is known."""
        if not isinstance(obj, Mapping):
            raise SessionError(ErrorCode.BAD_REQUEST, "event must be a JSON object")
        if "event_id" not in obj:
            raise SessionError(ErrorCode.BAD_REQUEST, "event_id is required")
        eid = obj["event_id"]
        if type(eid) is not int or not 0 <= eid <= MAX_EVENT_ID:
            raise SessionError(
                ErrorCode.BAD_REQUEST,
                f"event_id must be an integer in [0, {MAX_EVENT_ID}], got {eid!r}",
            )
        unknown = sorted(str(k) for k in obj if k not in _EVENT_FIELDS)
        if unknown:
            raise SessionError(
                ErrorCode.BAD_REQUEST, f"unknown event fields: {', '.join(unknown)}", event_id=eid
            )
        prompt = obj.get("prompt")
        check_prompt(prompt, "prompt", eid)
        raw_controls = obj.get("controls", ())
        if raw_controls is None:
            raw_controls = ()
        if not isinstance(raw_controls, (list, tuple)):
            raise SessionError(
                ErrorCode.BAD_REQUEST, "controls must be a list", event_id=eid
            )
        if len(raw_controls) > MAX_CONTROLS:
            raise SessionError(
                ErrorCode.BAD_REQUEST,
                f"controls: {len(raw_controls)} entries, at most {MAX_CONTROLS}",
                event_id=eid,
            )
        controls = []
        for i, raw in enumerate(raw_controls):
            where = f"controls[{i}]"
            if not isinstance(raw, Mapping):
                raise SessionError(
                    ErrorCode.BAD_REQUEST, f"{where} must be an object", event_id=eid
                )
            fields = set(raw)
            if fields != _CONTROL_FIELDS:
                missing = sorted(_CONTROL_FIELDS - fields)
                extra = sorted(str(k) for k in fields - _CONTROL_FIELDS)
                detail = "; ".join(
                    part
                    for part in (
                        f"missing {', '.join(missing)}" if missing else "",
                        f"unknown {', '.join(extra)}" if extra else "",
                    )
                    if part
                )
                raise SessionError(
                    ErrorCode.BAD_REQUEST,
                    f"{where} needs exactly track, schema, data ({detail})",
                    event_id=eid,
                )
            _check_control(raw["track"], raw["schema"], raw["data"], where, eid)
            try:
                data = deep_freeze(raw["data"], f"{where}.data")
            except SessionError as exc:
                raise SessionError(exc.code, exc.message, event_id=eid) from None
            controls.append(ControlInput(raw["track"], raw["schema"], data))
        return cls(event_id=eid, prompt=prompt, controls=tuple(controls))

    def to_wire(self) -> dict[str, Any]:
        """Plain JSON form; ``from_wire(event.to_wire()) == event``."""
        wire: dict[str, Any] = {"event_id": self.event_id}
        if self.prompt is not None:
            wire["prompt"] = self.prompt
        wire["controls"] = [control.to_wire() for control in self.controls]
        return wire

    def control(self, track: str) -> ControlInput | None:
        """This event's update of ``track``, if any."""
        for control in self.controls:
            if control.track == track:
                return control
        return None


def check_prompt(prompt: Any, where: str = "prompt", eid: int | None = None) -> None:
    """Raise ``SessionError(BAD_REQUEST)`` unless ``prompt`` is None or a str of at
    most ``MAX_PROMPT_CHARS`` characters."""
    if prompt is None:
        return
    if type(prompt) is not str:
        raise SessionError(
            ErrorCode.BAD_REQUEST,
            f"{where} must be a string or null, got {type(prompt).__name__}",
            event_id=eid,
        )
    if len(prompt) > MAX_PROMPT_CHARS:
        raise SessionError(
            ErrorCode.BAD_REQUEST,
            f"{where}: {len(prompt)} characters, at most {MAX_PROMPT_CHARS}",
            event_id=eid,
        )


def _check_control(track: Any, schema: Any, data: Any, where: str, eid: int | None) -> None:
    if type(track) is not str or not track:
        raise SessionError(
            ErrorCode.BAD_REQUEST, f"{where}.track must be a non-empty string", event_id=eid
        )
    if type(schema) is not str or not schema:
        raise SessionError(
            ErrorCode.BAD_REQUEST, f"{where}.schema must be a non-empty string", event_id=eid
        )
    if not isinstance(data, Mapping):
        raise SessionError(
            ErrorCode.BAD_REQUEST, f"{where}.data must be an object", event_id=eid
        )

