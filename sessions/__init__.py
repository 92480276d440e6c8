"""The session contract.

What every kind (world, tts, policy) shares: a session's identity (model, session id,
``new_session_id``), its state machine (``SessionState``) and the registry of live sessions
with their close and tombstones (``registry.py``: ``SessionRegistry``, ``SessionRecord``).

What a session that ticks adds (the world kind today): events, tick snapshots, reducers,
the tick transaction (``Session``) and the id-checked manager of such sessions
(``SessionManager``).

Pure Python (no torch, no Starlette) so the engine and every endpoint can share it.
"""

from sessions.applied import AppliedIds
from sessions.errors import ErrorCode, SessionError
from sessions.events import MAX_PROMPT_CHARS, ControlInput, SessionEvent, check_prompt
from sessions.frozen import Frozen, FrozenDict, deep_freeze, thaw
from sessions.manager import SESSION_ID_RE, SessionManager
from sessions.registry import SessionOwner, SessionRecord, SessionRegistry, new_session_id
from sessions.reducers import (
    ControlReducer,
    KeysReducer,
    Prepared,
    default_reducers,
)
from sessions.session import AcceptResult, Session, SessionState, SessionStateError
from sessions.ticks import TickRequest

__all__ = [
    "AcceptResult",
    "AppliedIds",
    "ControlInput",
    "ControlReducer",
    "ErrorCode",
    "Frozen",
    "FrozenDict",
    "KeysReducer",
    "MAX_PROMPT_CHARS",
    "Prepared",
    "SESSION_ID_RE",
    "Session",
    "SessionError",
    "SessionEvent",
    "SessionManager",
    "SessionOwner",
    "SessionRecord",
    "SessionRegistry",
    "SessionState",
    "SessionStateError",
    "TickRequest",
    "check_prompt",
    "deep_freeze",
    "new_session_id",
    "default_reducers",
    "thaw",
]
