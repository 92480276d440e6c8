"""The SessionManager: the registry of live sessions and their ids."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping

from protocols.echo import shown
from sessions.errors import ErrorCode, SessionError
from sessions.reducers import ControlReducer
from sessions.session import Session, SessionState

log = logging.getLogger(__name__)

SESSION_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class SessionManager:
    """Owns every session by id: creation (unique ids, a bound on how many), lookup
    and the two-step close. A session whose cleanup failed stays registered as a
    CLEANUP_FAILED tombstone, so its id cannot be reused while worker state may
    still be held under it. Not thread-safe; one owner, like Session."""

    def __init__(self, *, max_sessions: int = 1024) -> None:
        if type(max_sessions) is not int or max_sessions < 1:
            raise ValueError(f"max_sessions must be a positive int, got {max_sessions!r}")
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}

    def create(
        self,
        session_id: str,
        *,
        reducers: Mapping[str, ControlReducer],
        prompt: str | None = None,
        max_pending: int = 64,
        drop_state: Callable[[], None] | None = None,
        max_in_flight: int = 1,
    ) -> Session:
        """Register a new ACTIVE session. BAD_REQUEST for an id outside
        ``[A-Za-z0-9._:-]{1,128}``, SESSION_EXISTS for a taken id (tombstones
        included), BUSY when ``max_sessions`` are registered."""
        if type(session_id) is not str or SESSION_ID_RE.fullmatch(session_id) is None:
            raise SessionError(
                ErrorCode.BAD_REQUEST,
                f"session_id {shown(session_id)} must match [A-Za-z0-9._:-]{{1,128}}",
            )
        existing = self._sessions.get(session_id)
        if existing is not None:
            raise SessionError(
                ErrorCode.SESSION_EXISTS,
                f"session {session_id} already exists ({existing.state.value})",
            )
        if len(self._sessions) >= self.max_sessions:
            raise SessionError(
                ErrorCode.BUSY, f"{len(self._sessions)} sessions open, at most {self.max_sessions}"
            )
        session = Session(
            session_id, reducers=reducers, prompt=prompt, max_pending=max_pending, drop_state=drop_state,
            max_in_flight=max_in_flight,
        )
        self._sessions[session_id] = session
        log.info("session %s: created (%d open)", session_id, len(self._sessions))
        return session

    def get(self, session_id: str) -> Session:
        """The session registered under ``session_id`` (NO_SESSION if none)."""
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionError(ErrorCode.NO_SESSION, f"no session {shown(session_id)}")
        return session

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)

    def sessions(self) -> list[Session]:
        """Registered sessions (tombstones included), in creation order."""
        return list(self._sessions.values())

    def begin_close(self, session_id: str) -> Session:
        """Move the session to CLOSING and return it (its in-flight tick is abandoned)."""
        session = self.get(session_id)
        session.begin_close()
        return session

    def finish_close(self, session_id: str, ok: bool) -> SessionState:
        """Finish a close begun with :meth:`begin_close`: a CLOSED session is
        unregistered, a CLEANUP_FAILED one stays as a tombstone."""
        session = self.get(session_id)
        session.finish_close(ok)
        if session.state is SessionState.CLOSED:
            del self._sessions[session_id]
            log.info("session %s: removed (%d open)", session_id, len(self._sessions))
        return session.state
