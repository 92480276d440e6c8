"""Every live session of every kind, and what each kind's sessions share.

A session of any kind (a world, a voice, a robot's policy state) is named by its model and
session id, moves through one state machine (``SessionState``: active, failed, closing,
closed, cleanup_failed) and is listed here from its creation until its close ends; a
session whose cleanup failed stays as a CLEANUP_FAILED tombstone, so its id cannot be
reused while a model may still hold state under it. The registry routes what happens to a
session from outside its own messages to the endpoint that owns it, whatever its kind: a
model's drop notice (LRU eviction), the engine's death, an operator's close. Event loop
only.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from sessions.session import SessionState

log = logging.getLogger(__name__)


def new_session_id(kind: str) -> str:
    """A server-made id for a session the client did not name: ``<kind>-<12 hex>``
    (random, so two servers behind one proxy never collide). A client-chosen id (world
    ``session_id``, OpenPI ``session_id``) is kept as sent."""
    return f"{kind}-{uuid.uuid4().hex[:12]}"


class SessionOwner(Protocol):
    """The endpoint that owns a session, as the registry calls it."""

    def dropped(self, reason: str) -> None:
        """The model dropped the session's state on its own (LRU eviction)."""

    async def engine_dead(self, reason: str) -> None:
        """The engine died: tell the client if no work in flight will."""

    async def admin_close(self, session_id: str) -> None:
        """An operator closed the session: tell the client, end it, close the socket."""


@dataclass
class SessionRecord:
    """One live session of any kind, as ``GET /v1/sessions`` shows it; its endpoint keeps it current."""

    kind: str
    session_id: str
    model: str
    owner: SessionOwner | None = field(default=None, repr=False, compare=False)
    state: SessionState = SessionState.ACTIVE
    chunk_index: int = 0
    last_tick: float | None = None  # wall-clock time (time.time()) of the last committed tick
    # Set once the session leaves the registry (SessionRegistry.remove): an endpoint waiting to
    # reuse its id waits for this.
    ended: asyncio.Event = field(default_factory=asyncio.Event, repr=False, compare=False)

    def ticked(self, chunk_index: int) -> None:
        self.chunk_index = chunk_index
        self.last_tick = time.time()

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "session_id": self.session_id, "model": self.model, "state": self.state.value,
                "chunk_index": self.chunk_index, "last_tick": self.last_tick}


class SessionRegistry:
    """Every live session of every kind, by (model, session id)."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], SessionRecord] = {}

    def add(self, kind: str, session_id: str, model: str, owner: SessionOwner | None = None) -> SessionRecord:
        entry = SessionRecord(kind, session_id, model, owner)
        self._by_key[(model, session_id)] = entry
        return entry

    def remove(self, entry: SessionRecord) -> None:
        if self._by_key.get((entry.model, entry.session_id)) is entry:
            del self._by_key[(entry.model, entry.session_id)]
        entry.state = SessionState.CLOSED
        entry.ended.set()

    def find(self, kind: str, session_id: str) -> SessionRecord | None:
        """The session of ``kind`` named ``session_id`` on any model, if live."""
        for entry in self._by_key.values():
            if entry.kind == kind and entry.session_id == session_id:
                return entry
        return None

    def dropped(self, model: str, session_id: str, reason: str) -> None:
        """A model dropped a session's state: tell its owner, whatever its kind."""
        entry = self._by_key.get((model, session_id))
        if entry is None or entry.owner is None:
            log.info("session %s: %s dropped it (%s); no live owner", session_id, model, reason)
            return
        entry.owner.dropped(reason)

    def engine_dead(self, reason: str) -> None:
        """The engine died: every owner is told once (event loop, at once)."""
        log.error("engine dead (%s): failing %d live sessions", reason, len(self._by_key))
        for owner in {id(e.owner): e.owner for e in self._by_key.values() if e.owner is not None}.values():
            asyncio.ensure_future(owner.engine_dead(reason))

    def sessions(self) -> list[dict[str, Any]]:
        """Per session: kind, session_id, model, state, chunk_index, last_tick."""
        return [e.to_json() for e in self._by_key.values()]

    def __len__(self) -> int:
        return len(self._by_key)
