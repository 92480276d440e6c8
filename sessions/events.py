"""Session events: immutable, deep-frozen prompt and control updates.

The wire shape of an ``event`` is parsed by ``protocols.world_v1.parse_client``;
:meth:`SessionEvent.from_wire` turns that message into the session's own type,
deep-freezing every control's data (so the client's objects can never reach a
queued event). Whether a track exists and its data is valid, and whether the id is
stale or a duplicate, is checked against the session in ``Session.accept_event``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocols import world_v1
from protocols.world_v1 import MAX_PROMPT_CHARS
from sessions.errors import ErrorCode, SessionError
from sessions.frozen import FrozenDict, deep_freeze

__all__ = ["MAX_PROMPT_CHARS", "ControlInput", "SessionEvent", "check_prompt"]


@dataclass(frozen=True)
class ControlInput:
    """One update of one control track. ``data`` is deep-frozen on construction
    (a plain dict is copied and frozen), so it can never change afterwards."""

    track: str
    schema: str
    data: FrozenDict

    def __post_init__(self) -> None:
        # Always copy: a FrozenDict built directly may still hold mutable values.
        object.__setattr__(self, "data", deep_freeze(self.data, "control.data"))


@dataclass(frozen=True)
class SessionEvent:
    """One client update as the session queues it: an optional new prompt and at
    most one update per track (the wire parser guarantees the shape)."""

    event_id: int
    prompt: str | None = None
    controls: tuple[ControlInput, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "controls", tuple(self.controls))

    @classmethod
    def from_wire(cls, event: world_v1.Event) -> SessionEvent:
        """The session's copy of a parsed ``event``. Raises ``SessionError(BAD_REQUEST)``
        (with the event's id) for control data that is not a plain JSON value."""
        controls = []
        for i, control in enumerate(event.controls):
            try:
                data = deep_freeze(control.data, f"controls[{i}].data")
            except SessionError as exc:
                raise SessionError(exc.code, exc.message, event_id=event.event_id) from None
            controls.append(ControlInput(control.track, control.schema, data))
        return cls(event.event_id, event.prompt, tuple(controls))

    def control(self, track: str) -> ControlInput | None:
        """This event's update of ``track``, if any."""
        for control in self.controls:
            if control.track == track:
                return control
        return None


def check_prompt(prompt: Any, where: str = "prompt", eid: int | None = None) -> None:
    """Raise ``SessionError(BAD_REQUEST)`` unless ``prompt`` is None or a str of at
    most ``MAX_PROMPT_CHARS`` characters."""
    problem = world_v1.prompt_problem(prompt, where)
    if problem is not None:
        raise SessionError(ErrorCode.BAD_REQUEST, problem, event_id=eid)
