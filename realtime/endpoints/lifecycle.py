"""One session's life on its socket, the same for every kind: ``SessionEndpoint``.

::

    accept ── draining? 503 ─┐
      │ models loading, the kind unavailable, the engine dead, no client slot: goodbye ──> close
      │ opened (the kind's greeting)
      ├─ loop: next message ──> the kind's ``handle``      (each message touches the idle clock)
      │        too large      ──> the kind's ``too_large``
      │        idle           ──> idle goodbye, ``wind_down``, close 4408
      │        gone / handled ──> leave the loop
      ├─ meanwhile, from outside the loop:
      │        ``drain``        (SIGTERM)          ``wind_down`` ──> close 1001
      │        ``admin_close``  (DELETE /v1/...)   goodbye, ``wind_down`` ──> close 1008
      │        ``engine_dead``, ``dropped``        the kind's own answer
      └─ ended (the kind's cleanup), the slot given back, the socket forgotten

A kind (``world.py``, ``tts.py``, ``openpi.py``) supplies its protocol's parsing
(``receive``, ``handle``), its work and its error texts (``tell``); everything the
diagram shows is written here once. The goodbyes close idle, drained and closed
sessions of every kind with the same codes (``protocols/close_codes.py``) and the same
error codes (``protocols/errors.py``).

Overlaps: an idle close under way owns the socket's close, so a drain that comes
meanwhile only waits for it; a drain or admin close of a session that is already
closing waits in the kind's ``wind_down`` for that close to end.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import Awaitable, ClassVar

from starlette.websockets import WebSocket

from models.base import EngineDeadError, ModelError
from protocols import errors
from protocols.close_codes import (
    CLOSE_ADMIN,
    CLOSE_GOING_AWAY,
    CLOSE_IDLE_TIMEOUT,
    CLOSE_INTERNAL,
    CLOSE_TRY_AGAIN_LATER,
    IDLE_TIMEOUT_REASON,
    TOO_MANY_SESSIONS_REASON,
)
from realtime.endpoints.connection import Connection, Received, TooLarge
from realtime.endpoints.idle import GOODBYE_TIMEOUT_S, IDLE, Idle, IdleClock, receive_or_idle
from realtime.endpoints.live import LiveSessions
from realtime.engine import Engine, EngineStopped, TickCancelled
from realtime.server.limits import ClientSlots, Slot, client_address

log = logging.getLogger(__name__)

LOADING_REASON = "models loading"  # the close reason of a refusal with errors.LOADING


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


class Why(enum.Enum):
    """Why a session winds down from outside its own messages."""

    IDLE = "idle"  # nothing from the client and nothing taken for the idle timeout
    DRAIN = "drain"  # the server stops (SIGTERM)
    ADMIN = "admin"  # an operator closed it


class Goodbye(Exception):
    """End the connection: tell the client ``message`` (under ``code``, the protocol's error
    code, or none) and close with ``close_code`` / ``reason``."""

    def __init__(self, code: str | None, message: str, close_code: int = CLOSE_INTERNAL, reason: str = "") -> None:
        super().__init__(message)
        self.code, self.message, self.close_code, self.reason = code, message, close_code, reason


class SessionEndpoint:
    """One socket from accept to goodbye (module docstring). Subclasses set ``kind`` and
    implement ``receive``, ``handle`` and ``tell``; the other hooks have defaults."""

    kind: ClassVar[str]
    # The connection is the session (tts.v1, OpenPI): it takes its client slot when it
    # opens. A world connection takes one per session.create instead.
    slot_per_connection: ClassVar[bool] = True
    # What the idle goodbye says the client did not do (``"no request"``).
    idle_what: ClassVar[str] = "no message"

    def __init__(self, ws: WebSocket) -> None:
        state = ws.app.state
        self.conn = Connection(ws)
        self.engine: Engine = state.engine
        self.live: LiveSessions = state.live_sessions
        self.metrics = state.metrics
        self.client = client_address(ws)
        self.slots: ClientSlots = state.client_slots
        self.slot: Slot | None = None  # this session's hold on its client's count
        self.idle = IdleClock(state.config.limits.idle_timeout_s)
        self.draining = False  # the server is shutting down: no new work
        self.idle_closing = False  # the idle goodbye is under way (a drain then does not close)

    # ------------------------------------------------------------------ the kind's part
    @property
    def log_id(self) -> str:
        """The id the log names this connection by."""
        return "-"

    def unavailable(self) -> Goodbye | None:
        """Why this kind cannot serve the connection at all (no model, a dead engine)."""
        return None

    async def opened(self) -> None:
        """The kind's greeting (metadata, the session's settings), once the slot is held."""

    def receive(self) -> Awaitable[Received | None]:
        """The next client frame (None once the peer has gone), within the kind's bounds."""
        raise NotImplementedError

    async def next_message(self) -> Received | None | Idle:
        return await receive_or_idle(self.idle, self.receive, self.busy)

    def busy(self) -> bool:
        """Work of this session is in flight (it is not idle however long that takes)."""
        return False

    async def handle(self, frame: Received) -> bool:
        """One client frame; False ends the connection."""
        raise NotImplementedError

    async def too_large(self, exc: TooLarge) -> bool:
        """A frame over the kind's bound was dropped; False ends the connection."""
        await self.tell(errors.MESSAGE_TOO_LARGE, f"message of {exc.size} bytes; the limit is {exc.limit}")
        return True

    async def tell(self, code: str | None, message: str, timeout: float | None = None) -> None:
        """Send an error in the kind's protocol (``timeout``: the client is dropped if it
        has not taken it by then; the idle timeout by default)."""
        raise NotImplementedError

    def stop_output(self) -> None:
        """The client is idle: stop an output send it is not taking, before the goodbye."""

    async def wind_down(self, why: Why) -> None:
        """Before the socket closes for ``why``: finish or stop the session's work and tell
        the client what did not run."""

    async def ended(self) -> None:
        """The connection is over (whatever ended it): free what the session holds."""

    async def engine_dead(self, reason: str) -> None:
        """The engine died (called once per endpoint): tell the client if no work in flight
        will (an idle session has no queued work that would fail)."""

    def dropped(self, reason: str) -> None:
        """The model dropped one of this connection's sessions on its own (LRU eviction)."""
        log.info("session %s: the model dropped its state: %s", self.log_id, reason)

    # ------------------------------------------------------------------ written once
    async def serve(self) -> None:
        """Run the connection. Cancelled at shutdown (its socket was closed at the drain
        deadline while it still waited on the engine), it ends with one log line instead
        of uvicorn's traceback; any other cancellation propagates."""
        try:
            await self._run()
        except asyncio.CancelledError:
            if not self.live.draining:
                raise
            log.info("session %s: its handler was cancelled at shutdown", self.log_id)

    async def _run(self) -> None:
        if not await self.conn.accept():
            return
        self.live.attach(self)
        try:
            # No engine yet: the models are still loading (app.py starts it when they have).
            refusal = self.loading() if self.engine is None else self.unavailable()
            if refusal is None and self.slot_per_connection:
                self.slot = self.slots.take(self.client)
                if self.slot is None:
                    refusal = Goodbye(errors.TOO_MANY_SESSIONS, self.slots.refusal(self.client),
                                      CLOSE_TRY_AGAIN_LATER, TOO_MANY_SESSIONS_REASON)
            if refusal is not None:
                raise refusal
            await self.opened()
            while True:
                try:
                    frame = await self.next_message()
                except TooLarge as exc:
                    if not await self.too_large(exc):
                        break
                    continue
                if frame is IDLE:
                    await self.idle_close()
                    break
                if frame is None or not await self.handle(frame):  # type: ignore[arg-type]
                    break
        except Goodbye as goodbye:
            await self.goodbye(goodbye)
        finally:
            self.idle.close()
            try:
                await self.ended()
            finally:
                if self.slot is not None:
                    self.slot.give_back()
                self.live.detach(self)

    def loading(self) -> Goodbye:
        """The refusal of a connection made while the server loads its models: ``loading``
        (which model, how far), then close 1013; the client connects again later."""
        loading = self.conn.ws.app.state.loading
        where = f" ({loading.health().partition(': ')[2]})" if loading is not None else ""
        return Goodbye(errors.LOADING, f"the server is still loading its models{where}; connect again in a "
                       "few seconds (GET /healthz answers 200 once it is ready)", CLOSE_TRY_AGAIN_LATER, LOADING_REASON)

    async def goodbye(self, goodbye: Goodbye) -> None:
        """Tell, then close; a client that does not read is dropped after GOODBYE_TIMEOUT_S
        (it may have stopped reading on purpose, to keep its slot)."""
        log.info("session %s: closing: %s%s", self.log_id, f"{goodbye.code}: " if goodbye.code else "",
                 goodbye.message)
        await self.tell(goodbye.code, goodbye.message, timeout=GOODBYE_TIMEOUT_S)
        await self.conn.close(goodbye.close_code, goodbye.reason)

    async def idle_close(self) -> None:
        """Nothing from the client and nothing taken for the idle timeout: ``idle_timeout``,
        the session winds down, and the socket closes with CLOSE_IDLE_TIMEOUT. A client that
        does not read takes none of it and is dropped after GOODBYE_TIMEOUT_S."""
        self.idle_closing = True  # a drain from now on leaves the close to this one
        timeout = self.idle.timeout_s
        what = self.idle_what
        log.info("session %s: idle for %g s (%s): closing", self.log_id, timeout, what)
        self.stop_output()
        await self.tell(errors.IDLE_TIMEOUT, f"{what} for {timeout:g} s (the server's idle timeout, "
                        "--idle-timeout-s): closing", timeout=GOODBYE_TIMEOUT_S)
        await self.wind_down(Why.IDLE)
        await self.conn.close(CLOSE_IDLE_TIMEOUT, IDLE_TIMEOUT_REASON, timeout=GOODBYE_TIMEOUT_S)

    async def drain(self) -> None:
        """Server shutdown: the work in flight finishes and is sent (``wind_down``), then the
        socket closes with 1001. A connection whose idle close is under way is left to it:
        one close, not two."""
        self.draining = True
        self.idle.stop()  # the drain closes this socket, never the idle timeout
        if self.idle_closing:
            return
        await self.wind_down(Why.DRAIN)
        await self.conn.close(CLOSE_GOING_AWAY, "server shutting down")

    async def admin_close(self, session_id: str) -> None:
        """An operator closed ``session_id``: ``closed_by_admin``, the session winds down,
        and the socket closes with CLOSE_ADMIN (the reader then ends as on a disconnect)."""
        log.info("session %s: closing: %s closed by admin", self.log_id, session_id)
        await self.tell(errors.CLOSED_BY_ADMIN, f"session {session_id} was closed by the server's operator",
                        timeout=GOODBYE_TIMEOUT_S)
        await self.wind_down(Why.ADMIN)
        await self.conn.close(CLOSE_ADMIN, "closed by admin")
