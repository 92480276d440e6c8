"""Session errors: one code per failure a client can be told about.

A :class:`SessionError` is recoverable from the server's point of view: it is
answered to the client as an ``error`` frame and the server keeps serving. Misuse
of the session API by server code (an illegal state transition, completing a tick
that was never begun) is a programming error and raises
:class:`~sessions.session.SessionStateError` instead. The codes themselves are the
world protocol's (``protocols.world_v1``), spelled there once; :class:`ErrorCode` is
them as one type.
"""

from __future__ import annotations

import enum
from typing import Any

from protocols import world_v1 as wire

__all__ = ["ErrorCode", "SessionError"]


class ErrorCode(str, enum.Enum):
    """Every world.v1 error code (``wire.ERROR_CODES``), by the name the protocol gives it."""

    BAD_REQUEST = wire.BAD_REQUEST
    UNKNOWN_TYPE = wire.UNKNOWN_TYPE
    STALE_EVENT = wire.STALE_EVENT
    QUEUE_FULL = wire.QUEUE_FULL
    SESSION_EXISTS = wire.SESSION_EXISTS
    NO_SESSION = wire.NO_SESSION
    SESSION_FAILED = wire.SESSION_FAILED
    MESSAGE_TOO_LARGE = wire.MESSAGE_TOO_LARGE
    INTERNAL = wire.INTERNAL
    SESSION_EVICTED = wire.SESSION_EVICTED
    SESSION_CLOSED = wire.SESSION_CLOSED
    BUSY = wire.BUSY
    CLOSED_BY_ADMIN = wire.CLOSED_BY_ADMIN
    IDLE_TIMEOUT = wire.IDLE_TIMEOUT
    TOO_MANY_SESSIONS = wire.TOO_MANY_SESSIONS
    FORMAT_UNAVAILABLE = wire.FORMAT_UNAVAILABLE
    LOADING = wire.LOADING


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
        return wire.error(self.code.value, self.message, event_id=self.event_id)


def _rebuild(code: ErrorCode, message: str, event_id: int | None) -> SessionError:
    return SessionError(code, message, event_id=event_id)
