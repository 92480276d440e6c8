"""Session errors: one code per failure a client can be told about.

A :class:`SessionError` is recoverable from the server's point of view: it is
answered to the client as an ``error`` frame and the server keeps serving. Misuse
of the session API by server code (an illegal state transition, completing a tick
that was never begun) is a programming error and raises
:class:`~sessions.session.SessionStateError` instead. The codes themselves are the
world protocol's (``protocols.world_v1.ErrorCode``), defined there once.
"""

from __future__ import annotations

from typing import Any

from protocols.world_v1 import ErrorCode

__all__ = ["ErrorCode", "SessionError"]


class SessionError(Exception):
    """A failure to report to the client, with its wire code and, when it concerns
    one event, that event's id."""

    def __init__(self, code: ErrorCode, message: str, *, event_id: int | None = None) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message
        self.event_id = event_id

    def __str__(self) -> str:
        if self.event_id is None:
            return f"{self.code.value}: {self.message}"
        return f"{self.code.value} (event {self.event_id}): {self.message}"

    def __repr__(self) -> str:
        return f"SessionError(ErrorCode.{self.code.name}, {self.message!r}, event_id={self.event_id!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only event_id: the default Exception pickling would drop it.
        return (_rebuild, (self.code, self.message, self.event_id))

    def to_wire(self) -> dict[str, Any]:
        """The ``error`` frame: ``{"type", "code", "message"}`` plus ``event_id`` if set."""
        wire: dict[str, Any] = {"type": "error", "code": self.code.value, "message": self.message}
        if self.event_id is not None:
            wire["event_id"] = self.event_id
        return wire


def _rebuild(code: ErrorCode, message: str, event_id: int | None) -> SessionError:
    return SessionError(code, message, event_id=event_id)
