"""The session contract: events, tick snapshots, reducers, Session and SessionManager.

Pure Python (no torch, no Starlette) so the engine and every endpoint can share it.
"""

from sessions.applied import AppliedIds
from sessions.errors import ErrorCode, SessionError
from sessions.events import MAX_PROMPT_CHARS, ControlInput, SessionEvent, check_prompt
from sessions.frozen import Frozen, FrozenDict, deep_freeze, thaw
from sessions.manager import SESSION_ID_RE, SessionManager
from sessions.reducers import (
    ControlReducer,
    KeysReducer,
    Prepared,
    default_reducers,
)
from sessions.session import AcceptResult, Session, SessionState, SessionStateError
from sessions.ticks import ChunkMetadata, TickRequest

__all__ = [
    "AcceptResult",
    "AppliedIds",
    "ChunkMetadata",
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
    "SessionState",
    "SessionStateError",
    "TickRequest",
    "check_prompt",
    "deep_freeze",
    "default_reducers",
    "thaw",
]
