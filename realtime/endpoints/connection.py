"""What every WebSocket endpoint shares: the socket mechanics and the live sessions.

* ``Connection``: accept, a bounded receive, one locked send that tolerates a
  vanished peer (the client may close first at any moment: after its own
  ``session.close``, in the middle of a chunk), and a close that does the same.
  Nothing a client does on its side of the socket reaches the server log as a
  traceback.
* ``engine_failure(exc)``: what a failed ``engine.submit`` / ``release`` means to a
  client, one answer per exception type; each endpoint maps the three outcomes to
  its protocol's error code and close code (``WORLD_CODES``, ``TTS_CODES``; OpenPI
  has no codes, its client raises the text).
* ``new_session_id(kind)``: the one rule for server-made ids. A client-chosen id
  (world ``session_id``, OpenPI ``session_id``) is kept as sent; a session without
  one is ``<kind>-<12 hex>`` (random, so two servers never collide behind a proxy).
* ``LiveSessions``: one registry of live sessions across kinds, keyed by model and
  session id. It routes a model's drop notices (LRU eviction) to the session's
  owner whatever its kind, and lists every session for ``GET /v1/sessions``. It
  also holds every open socket's endpoint, so that a server shutdown drains each
  one (``drain``): in-flight work finishes, then close 1001, whatever the kind.

An endpoint on top of these only parses, hands messages to its session, and sends.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Protocol

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from models.base import EngineDeadError, ModelError
from starlette.responses import PlainTextResponse

from protocols import tts_v1, world_v1
from protocols.close_codes import CLOSE_GOING_AWAY
from realtime.engine import EngineStopped, TickCancelled
from realtime.server.limits import GOODBYE_TIMEOUT_S
from realtime.server.transport import ABORT_EXTENSION

log = logging.getLogger(__name__)

# RFC 6455 close codes that belong to no one protocol (world.v1's own are in its module).
CLOSE_NORMAL = 1000
CLOSE_INTERNAL = 1011
# An operator closed the session (DELETE /v1/sessions/...): RFC 6455 "policy violation".
CLOSE_ADMIN = 1008

# What a send or close raises once the peer has gone: starlette's WebSocketDisconnect,
# its "Cannot call send once a close message has been sent" RuntimeError, a socket error.
_PEER_GONE = (WebSocketDisconnect, RuntimeError, OSError)


def new_session_id(kind: str) -> str:
    """A server-made session id for a session the client did not name."""
    return f"{kind}-{uuid.uuid4().hex[:12]}"


# --------------------------------------------------------------------------- failures
class Failure(enum.Enum):
    """What a failed engine call means for the client."""

    MODEL = "model"  # the model failed this session's work; others are fine
    ENGINE = "engine"  # the engine is dead or stopping: nothing runs any more
    CANCELLED = "cancelled"  # a reset or close dropped the queued work


ENGINE_ERRORS = (ModelError, EngineDeadError, EngineStopped, TickCancelled)


def engine_failure(exc: BaseException) -> Failure:
    """The outcome of one of ``ENGINE_ERRORS``."""
    if isinstance(exc, TickCancelled):
        return Failure.CANCELLED
    if isinstance(exc, (EngineDeadError, EngineStopped)):
        return Failure.ENGINE
    return Failure.MODEL


# Each protocol's error code per outcome. world.v1 and tts.v1 name an internal error
# differently ("internal" / "internal_error"): both are on the wire already and the
# clients match them, so the difference stays and is documented (docs/protocols*.md).
# A cancelled tick is no error: the reset or close that cancelled it answers instead.
WORLD_CODES = {Failure.MODEL: world_v1.SESSION_FAILED, Failure.ENGINE: world_v1.SESSION_FAILED}
TTS_CODES = {Failure.MODEL: tts_v1.INTERNAL_ERROR, Failure.ENGINE: tts_v1.INTERNAL_ERROR}


# --------------------------------------------------------------------------- socket
@dataclass(frozen=True)
class Received:
    """One client frame: exactly one of ``text`` and ``data`` is set."""

    text: str | None = None
    data: bytes | None = None


class TooLarge(Exception):
    """A client frame over the endpoint's limit (the frame is dropped)."""

    def __init__(self, size: int, limit: int, binary: bool) -> None:
        super().__init__(f"{'binary' if binary else 'text'} frame of {size} bytes over the limit of {limit}")
        self.size, self.limit, self.binary = size, limit, binary


class Connection:
    """One accepted WebSocket: bounded receive, locked sends, a tolerant close."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self._lock = asyncio.Lock()
        self._open = True
        # realtime/server/transport.py: whether a send would go out without waiting (None: unknown).
        self._writable = ws.scope.get("extensions", {}).get(ABORT_EXTENSION, {}).get("writable")

    @property
    def open(self) -> bool:
        """False once the peer is gone or the server closed the socket."""
        return self._open

    @property
    def stalled(self) -> bool:
        """A send is under way and the transport takes no more writes: the peer has stopped
        reading (False where the transport does not tell)."""
        return self._lock.locked() and self._writable is not None and not self._writable()

    async def accept(self) -> bool:
        """Complete the handshake; False (the upgrade answered 503, nothing to do) while
        the server drains: a socket opened now would only be closed again."""
        live = getattr(self.ws.app.state, "live_sessions", None)
        if live is not None and live.draining:
            self._open = False
            await self.ws.send_denial_response(PlainTextResponse("server is shutting down\n", status_code=503))
            return False
        await self.ws.accept()
        return True

    async def receive(self, max_text: int | None, max_binary: int | None = None) -> Received | None:
        """The next client frame, or None once the peer has gone. ``TooLarge`` for a
        text frame over ``max_text`` UTF-8 bytes or a binary one over ``max_binary``
        (None: only uvicorn's ``ws_max_size`` bounds it, for protocols that answer an
        oversized body with their own error)."""
        try:
            msg = await self.ws.receive()
        except _PEER_GONE:
            self._open = False
            return None
        if msg["type"] == "websocket.disconnect":
            self._open = False
            return None
        data = msg.get("bytes")
        if data is not None:
            if max_binary is not None and len(data) > max_binary:
                raise TooLarge(len(data), max_binary, binary=True)
            return Received(data=data)
        text = msg.get("text") or ""
        # UTF-8 never has fewer bytes than characters: encode only when it might not fit.
        if max_text is not None and (len(text) > max_text or
                                     (4 * len(text) > max_text and len(text.encode("utf-8")) > max_text)):
            raise TooLarge(len(text.encode("utf-8")), max_text, binary=False)
        return Received(text=text)

    async def send(self, *frames: str | bytes, timeout: float | None = None) -> bool:
        """Send ``frames`` back to back (no other send comes between them). False if
        the peer has gone: nobody is left to tell, the reader sees the disconnect.
        ``timeout``: a client that has not taken them by then is dropped (``abort``)."""
        if not self._open:
            return False
        # One frame, no other send under way and a transport that takes writes: the send
        # cannot wait, so it needs no timer (asyncio.timeout costs ~13 us; OpenPI replies).
        if timeout is not None and len(frames) == 1 and not self._lock.locked() and self._writable is not None \
                and self._writable():
            timeout = None
        try:
            if timeout is None:
                async with self._lock:
                    await self._send_frames(frames)
            else:
                async with asyncio.timeout(timeout), self._lock:
                    await self._send_frames(frames)
        except TimeoutError:  # before _PEER_GONE: TimeoutError is an OSError
            log.info("%s: a send not taken within %.1f s: dropping the connection", self.peer, timeout)
            self.abort()
            return False
        except _PEER_GONE as exc:
            self._open = False
            log.debug("send on a closed socket: %r", exc)
            return False
        return True

    async def _send_frames(self, frames: tuple[str | bytes, ...]) -> None:
        for frame in frames:
            if isinstance(frame, str):
                await self.ws.send_text(frame)
            else:
                await self.ws.send_bytes(frame)

    async def close(self, code: int = CLOSE_NORMAL, reason: str = "", timeout: float = GOODBYE_TIMEOUT_S) -> None:
        """Close from the server side, unless the peer closed first (then: nothing).
        ``timeout``: a client that does not read cannot take the close frame; it is
        dropped (``abort``) after that long. Every close is bounded: a later close (an
        operator's, the drain's) finds this one under way and returns at once."""
        was_open, self._open = self._open, False
        if not was_open or self.ws.application_state is not WebSocketState.CONNECTED:
            return
        try:
            async with asyncio.timeout(timeout), self._lock:
                await self.ws.close(code, reason)
        except TimeoutError:  # before _PEER_GONE: TimeoutError is an OSError
            log.info("%s: the close frame not taken within %.1f s: dropping the connection", self.peer, timeout)
            self.abort()
        except _PEER_GONE as exc:
            log.debug("close raced the peer's close: %r", exc)

    def abort(self) -> None:
        """Drop the TCP connection now (realtime/server/transport.py): for a client that stopped
        reading, whose sends and close frame would wait forever. The reader then sees
        the disconnect and ends the session as usual."""
        self._open = False
        abort = self.ws.scope.get("extensions", {}).get(ABORT_EXTENSION, {}).get("abort")
        if abort is not None:
            abort()

    @property
    def peer(self) -> str:
        client = self.ws.client
        return f"{client.host}:{client.port}" if client is not None else "-"


# --------------------------------------------------------------------------- registry
class SessionOwner(Protocol):
    def dropped(self, reason: str) -> None:
        """The model dropped this session's state on its own (event loop)."""

    # Optional: ``async def admin_close(self, session_id: str) -> None``: tell the client
    # (its protocol's ``closed_by_admin``), end the session, close with CLOSE_ADMIN.
    # Optional: ``async def engine_dead(self, reason: str) -> None``, called once when the
    # engine dies: tell the client (an idle session has no queued work that would fail).


class SocketOwner(Protocol):
    """An endpoint's handler of one open socket, as the drain sees it."""

    conn: Connection

    async def drain(self) -> None:
        """The server stops (SIGTERM): let the in-flight work finish and be sent (a world
        tick, the utterance being spoken, a policy call), tell the client what did not
        run, and close the socket with CLOSE_GOING_AWAY. Refuse new work meanwhile."""


@dataclass
class LiveSession:
    """One live session as ``GET /v1/sessions`` shows it; its endpoint keeps it current."""

    kind: str
    session_id: str
    model: str
    owner: SessionOwner | None = field(default=None, repr=False, compare=False)
    state: str = "active"
    chunk_index: int = 0
    last_tick: float | None = None  # wall-clock time (time.time()) of the last committed tick
    # Set once the session leaves the registry (LiveSessions.remove): an endpoint waiting to
    # reuse its id waits for this.
    ended: asyncio.Event = field(default_factory=asyncio.Event, repr=False, compare=False)

    def ticked(self, chunk_index: int) -> None:
        self.chunk_index = chunk_index
        self.last_tick = time.time()

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "session_id": self.session_id, "model": self.model, "state": self.state,
                "chunk_index": self.chunk_index, "last_tick": self.last_tick}


class LiveSessions:
    """Every live session of every kind, by (model, session id). Event loop only."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], LiveSession] = {}
        self._sockets: set[SocketOwner] = set()
        self.draining = False  # the server is shutting down: no new socket, no new work

    def attach(self, owner: SocketOwner) -> None:
        """An endpoint's socket is open (drained at shutdown until ``detach``)."""
        self._sockets.add(owner)

    def detach(self, owner: SocketOwner) -> None:
        self._sockets.discard(owner)

    def add(self, kind: str, session_id: str, model: str, owner: SessionOwner | None = None) -> LiveSession:
        entry = LiveSession(kind, session_id, model, owner)
        self._by_key[(model, session_id)] = entry
        return entry

    def remove(self, entry: LiveSession) -> None:
        if self._by_key.get((entry.model, entry.session_id)) is entry:
            del self._by_key[(entry.model, entry.session_id)]
        entry.ended.set()

    def find(self, kind: str, session_id: str) -> LiveSession | None:
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
        """The engine died: every owner that can hear it is told (event loop, at once)."""
        log.error("engine dead (%s): failing %d live sessions", reason, len(self._by_key))
        for entry in list(self._by_key.values()):
            hook = getattr(entry.owner, "engine_dead", None)
            if hook is not None:
                asyncio.ensure_future(hook(reason))

    async def drain(self, timeout_s: float) -> None:
        """Server shutdown: every open socket drains at once (``SocketOwner.drain``); one
        still draining after ``timeout_s`` is closed with CLOSE_GOING_AWAY anyway (its
        work is abandoned), so every client gets the same close code. Sockets opened from
        now on are refused (``Connection.accept``)."""
        self.draining = True
        owners = list(self._sockets)
        if not owners:
            return
        log.info("drain: %d open sockets, waiting at most %.1f s for their in-flight work", len(owners), timeout_s)
        tasks = {asyncio.ensure_future(owner.drain()): owner for owner in owners}
        done, late = await asyncio.wait(tasks, timeout=timeout_s)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.warning("drain: a socket's drain failed: %r", task.exception())
        for task in late:
            # Left running: it ends on its own once its socket is closed (or is cancelled
            # with the server's other tasks); cancelling it here would cut its cleanup.
            log.warning("drain: in-flight work still running after %.1f s: closing its socket with %d",
                        timeout_s, CLOSE_GOING_AWAY)
            task.add_done_callback(_quiet)
        # All at once, each bounded: a client that stopped reading cannot take the close
        # frame either (an idle timeout no longer drops it while the server drains), so it
        # is dropped after GOODBYE_TIMEOUT_S.
        await asyncio.gather(*(tasks[task].conn.close(CLOSE_GOING_AWAY, "server shutting down",
                                                      timeout=GOODBYE_TIMEOUT_S) for task in late))

    def sessions(self) -> list[dict[str, Any]]:
        """Per session: kind, session_id, model, state, chunk_index, last_tick."""
        return [e.to_json() for e in self._by_key.values()]

    def __len__(self) -> int:
        return len(self._by_key)


def _quiet(task: asyncio.Task) -> None:
    """Retrieve a late drain's outcome (it ran past the deadline; the socket is closed)."""
    if not task.cancelled() and task.exception() is not None:
        log.info("drain: a late drain ended with %r", task.exception())


async def run_handler(handler: Awaitable[None], live: LiveSessions) -> None:
    """Run one socket's handler. Cancelled at shutdown (its socket was closed at the drain
    deadline and it still waited on the engine), it ends with one log line instead of
    uvicorn's traceback; any other cancellation propagates."""
    try:
        await handler
    except asyncio.CancelledError:
        if not live.draining:
            raise
        log.info("a socket's handler was cancelled at shutdown")
