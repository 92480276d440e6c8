"""``WS /v1/realtime/world``: one world session per connection (world.v1).

Two tasks per connection, both on the event loop: the reader (this module) parses
client frames and answers each at once (``session.created``, ``event.accepted``,
``error``), with reset and close going straight to the engine's control lane; the tick
driver (``world_driver.py``) runs the session's ticks while the client holds credits.
What every kind shares (accept, idle, drain, admin close, goodbye) is ``lifecycle.py``'s.

The model is a ``WorldAdapter``: it turns a snapshot into its tick, checks its own
chunks (identities, frame shape) on the engine thread, and declares the geometry
sent in ``session.created``.

Close: the client's ``session.close``, its disconnect, an admin close and the server's
drain may overlap; the first runs the close and the others wait for it (``close_session``),
so one close answers the client and none finds the session already gone. A cleanup that
fails leaves the session a CLEANUP_FAILED tombstone (its id cannot be reused);
``session.close`` again on the same connection retries it, and so does ``session.close``
with its ``session_id`` from a new connection after a disconnect.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
from starlette.websockets import WebSocket

from models.world.base import WorldAdapter
from protocols import world_v1 as wire
from protocols.echo import shown
from realtime.endpoints.connection import Received, TooLarge
from realtime.endpoints.idle import GOODBYE_TIMEOUT_S
from realtime.endpoints.lifecycle import ENGINE_ERRORS, Failure, SessionEndpoint, Why, engine_failure
from sessions.registry import SessionRecord
from realtime.endpoints.world_driver import StallWatch, TickDriver
from realtime.endpoints.world_frames import SessionFrames, h264_settings
from realtime.endpoints.world_image import decode_image, read_image
from sessions import (
    ErrorCode,
    Session,
    SessionError,
    SessionEvent,
    SessionManager,
    SessionState,
)

log = logging.getLogger(__name__)

KIND = "world"


class _IdleClosed(Exception):
    """The connection was closed for idleness while a message was being handled."""


class WorldEndpoint(SessionEndpoint):
    kind = KIND
    slot_per_connection = False  # a slot per session.create, from create to close

    def __init__(self, ws: WebSocket) -> None:
        super().__init__(ws)
        state = ws.app.state
        self.manager: SessionManager = state.world_sessions
        self.world_models: list[str] = state.inventory.names(KIND)
        self.max_pending: int = state.config.world.max_pending_events
        self.ticks_in_flight: int = state.config.world.session_ticks_in_flight
        self.ticks_in_flight_alone: int | None = state.config.world.session_ticks_in_flight_alone
        self.frames = SessionFrames(state.encoder)  # the session's frame encoding (h264: its stream)
        self.session: Session | None = None
        self.entry: SessionRecord | None = None
        self.adapter: WorldAdapter | None = None
        self.model: str = ""
        self.format = "jpeg"
        self.seed = 0
        self.options: dict[str, Any] = {}
        self.image: np.ndarray | None = None  # the session's first image, if it has one
        self.stream_frames = False
        self.driver = TickDriver(self)
        self._closing: asyncio.Future | None = None  # resolved when the close in progress ends
        self._resetting: asyncio.Future | None = None  # resolved when the reset in progress ends

    # ------------------------------------------------------------------ lifecycle
    @property
    def log_id(self) -> str:
        return self.session.session_id if self.session is not None else "-"

    @property
    def idle_what(self) -> str:  # type: ignore[override]
        return "no message and no chunk taken" if self.session is not None else "no message"

    def receive(self) -> Any:
        return self.conn.receive(wire.MAX_TEXT_BYTES, max_binary=None)

    async def too_large(self, exc: TooLarge) -> bool:
        await self.send_error(wire.MESSAGE_TOO_LARGE, f"text frame over {wire.MAX_TEXT_BYTES} bytes")
        await self.conn.close(wire.CLOSE_TOO_BIG)
        return False

    async def handle(self, frame: Received) -> bool:
        if frame.data is not None:
            await self.send_error(wire.BAD_REQUEST, "binary frames are not accepted from clients")
            await self.conn.close(wire.CLOSE_UNSUPPORTED_DATA)
            return False
        try:
            await self.handle_text(frame.text or "")
        except _IdleClosed:
            return False
        return True

    async def tell(self, code: str | None, message: str, timeout: float | None = None) -> None:
        await self.send_error(code or wire.INTERNAL, message, timeout=timeout)

    def stop_output(self) -> None:
        sending = self.driver.sending
        if sending is not None and not sending.done():
            # A client that stopped reading never takes this chunk; the session cannot end behind it.
            sending.cancel()

    async def wind_down(self, why: Why) -> None:
        """The session closes once its running tick is committed and sent (a reset under
        way ends first); ``session.closed`` lists the accepted events no chunk applied."""
        session = self.session
        if session is None:
            return
        dropped = await self.close_session(notify=False)
        if dropped is not None:
            await self.send(wire.closed(session.session_id, dropped), timeout=GOODBYE_TIMEOUT_S)
        if why is Why.DRAIN:
            log.info("session %s: drained after %d committed chunks", session.session_id, session.chunk_index)

    async def ended(self) -> None:
        await self.close_session(notify=False)

    # ------------------------------------------------------------------ sending
    async def send(self, msg: dict[str, Any], timeout: float | None = None) -> None:
        """One reply (``timeout``: dropped if not taken by then; the idle timeout by default)."""
        await self.conn.send(wire.encode(msg), timeout=timeout or self.idle.reply_timeout_s)

    async def send_error(self, code: str, message: str, event_id: int | None = None,
                         timeout: float | None = None, **extra: Any) -> None:
        log.info("session %s: error %s: %s", self.log_id, code, message)
        self.metrics.refused(code)  # counted when it is a refusal (busy, too_many_sessions, ...)
        await self.send(wire.error(code, message, event_id=event_id, **extra), timeout=timeout)

    # ------------------------------------------------------------------ reader
    def busy(self) -> bool:
        """A tick of this session is in the engine (``TickDriver.busy``)."""
        return self.driver.busy()

    async def handle_text(self, text: str) -> None:
        event_id = None
        try:
            try:
                msg = wire.parse_client(text, default_model=self.world_models[0])
            except wire.ProtocolError as exc:
                event_id = exc.event_id
                self._check_state(exc.message_type)
                raise
            event_id = msg.event_id if isinstance(msg, wire.Event) else None
            self._check_state(msg.type)
            if isinstance(msg, wire.CreateRequest):
                await self.create(msg)
            elif isinstance(msg, wire.Event):
                await self.event(msg)
            elif isinstance(msg, wire.Credit):
                self.driver.credits = min(self.driver.credits + msg.chunks, wire.MAX_CREDITS)
                self.driver.wake.set()
            elif isinstance(msg, wire.Keyframe):
                self.frames.keyframe()
            elif isinstance(msg, wire.Reset):
                await self.reset()
            else:
                await self.close(msg.session_id)
        except wire.ProtocolError as exc:
            await self.send_error(exc.code, exc.message, exc.event_id)
        except SessionError as exc:
            await self.send_error(exc.code.value, exc.message, exc.event_id if exc.event_id is not None else event_id)

    def _check_state(self, message_type: str | None) -> None:
        """Refused before its fields: a second create, an event or credit without a session."""
        if message_type == wire.CreateRequest.type and self.session is not None:
            raise SessionError(ErrorCode.BAD_REQUEST, f"this connection already has session "
                                                      f"{self.session.session_id!r}; close it first")
        if message_type in (wire.Event.type, wire.Credit.type, wire.Keyframe.type):
            self._need_session()

    def _need_session(self) -> Session:
        if self.session is None:
            raise SessionError(ErrorCode.NO_SESSION, "no session on this connection: send session.create first")
        return self.session

    # ------------------------------------------------------------------ messages
    async def create(self, req: wire.CreateRequest) -> None:
        # The announced image is read before anything can refuse the create, so a
        # refused create never leaves its binary message behind as a stray frame.
        data = await self._image_bytes(req.image) if req.image is not None else None
        if req.model not in self.world_models:
            raise SessionError(ErrorCode.BAD_REQUEST,
                               f"unknown world model {shown(req.model)}; have {self.world_models}")
        if not self.engine.healthy:
            raise SessionError(ErrorCode.INTERNAL, f"engine unavailable: {self.engine.dead_reason}")
        adapter: WorldAdapter = self.engine.adapter(req.model)  # type: ignore[assignment]
        geometry = adapter.geometry
        h264 = h264_settings(req, geometry)  # refused before anything is taken
        image = await decode_image(req, adapter, data) if data is not None else None
        model, sid, engine = req.model, req.session_id, self.engine
        try:
            options = adapter.check_options(req.options)
        except ValueError as exc:
            raise SessionError(ErrorCode.BAD_REQUEST, str(exc)) from None
        slot = self.slots.take(self.client)
        if slot is None:
            raise SessionError(ErrorCode.TOO_MANY_SESSIONS, self.slots.refusal(self.client))
        try:
            session = self.manager.create(
                sid,
                reducers=adapter.reducers(),
                prompt=req.prompt,
                max_pending=self.max_pending,
                drop_state=lambda: engine.post_drop_session(model, sid),
                # A streamed tick's frames go out before its commit: one tick at a time.
                max_in_flight=1 if req.stream_frames else self.ticks_in_flight,
            )
            await self._admit(adapter, model, sid, options)
        except BaseException:
            slot.give_back()
            raise
        self.slot, self.session, self.options = slot, session, options
        self.adapter, self.model, self.image = adapter, model, image
        self.format, self.seed, self.driver.credits = req.format, req.seed, req.credits
        self.stream_frames, codec = req.stream_frames, self.frames.start(req.format, h264, sid)
        self.entry = self.live.add(KIND, sid, model, owner=self)
        log.info("session %s: created on %s (format %s, credits %d)", sid, model, self.format, req.credits)
        await self.send(
            wire.created(sid, model, height=geometry.height, width=geometry.width,
                         frames_per_chunk=geometry.frames_per_chunk, fps=geometry.fps,
                         format=self.format, credits=req.credits, codec=codec)
        )
        self.driver.start()

    async def _admit(self, adapter: WorldAdapter, model: str, sid: str, options: dict[str, Any]) -> None:
        """The model takes the session in (engine thread), or ``busy`` and the id is freed again."""
        try:
            refusal = await self.engine.control(lambda: adapter.admit(sid, options))
        except Exception as exc:  # noqa: BLE001 - the model's own failure, reported, nothing created
            refusal, code = f"model could not open the session: {exc}", ErrorCode.INTERNAL
        else:
            code = ErrorCode.BUSY
        if refusal is not None:
            self.manager.begin_close(sid)
            self.manager.finish_close(sid, True)
            self.engine.post_drop_session(model, sid)
            raise SessionError(code, refusal)

    async def _image_bytes(self, spec: wire.ImageSpec) -> bytes:
        data = await read_image(self.conn, self.idle, spec)
        if data is None:  # announced, never sent
            await self.idle_close()
            raise _IdleClosed()
        return data

    async def event(self, msg: wire.Event) -> None:
        session = self._need_session()
        event = SessionEvent.from_wire(msg)
        status = session.accept_event(event)
        self.driver.accepted(event.event_id, status)  # timed from here; wakes the driver
        await self.send(wire.event_accepted(event.event_id, status.value))

    async def reset(self) -> None:
        session = self._need_session()
        self._resetting = asyncio.get_running_loop().create_future()
        try:
            await self._reset(session)
        finally:
            resetting, self._resetting = self._resetting, None
            resetting.set_result(None)

    async def _reset(self, session: Session) -> None:
        await self.driver.stop(stall_timeout=self.idle.reply_timeout_s)  # the client goes on: its idle bound
        if session.in_flight is not None:
            session.fail_tick("tick abandoned by reset", asked=True)
        dropped = session.reset()
        self.driver.eviction = None
        self.frames.restart()  # chunk 0 starts a new stream with an IDR
        await self.engine.reset(self.model, session.session_id)
        if self.session is not session or session.state is not SessionState.ACTIVE:
            return  # the session failed or went meanwhile (a close waits for this reset): that answers the client
        self.mark(SessionState.ACTIVE, 0)
        log.info("session %s: reset (dropped events %s)", session.session_id, list(dropped))
        await self.send(wire.reset_done(session.session_id, list(dropped)))
        self.driver.start()

    async def close(self, session_id: str | None) -> None:
        """``session.close``: this connection's session, or (on a connection without
        one) the CLEANUP_FAILED tombstone named ``session_id``, whose close is retried."""
        if self.session is None and session_id is not None:
            await self._retry_tombstone(session_id)
            return
        session = self._need_session()
        if session_id is not None and session_id != session.session_id:
            raise SessionError(ErrorCode.BAD_REQUEST, f"session.close names {shown(session_id)}, but this "
                                                      f"connection's session is {session.session_id!r}")
        sid = session.session_id
        dropped = await self.close_session(notify=True)
        if dropped is not None:
            await self.send(wire.closed(sid, dropped))

    async def close_session(self, *, notify: bool) -> list[int] | None:
        """Close this connection's session (client close, disconnect, admin, drain); the
        dropped event ids, or None if there was none, its cleanup failed (then it stays
        on this connection as a tombstone, so ``session.close`` retries it) or another
        close was already running: this one waits for that close to end and leaves the
        answer to it, so overlapping closes end the session once and answer once."""
        if self._closing is not None:
            await asyncio.shield(self._closing)
            return None
        session = self.session
        if session is None:
            return None
        self._closing = asyncio.get_running_loop().create_future()
        try:
            sid = session.session_id
            if self._resetting is not None:
                # A reset waiting for the running tick: it ends first (that tick is committed
                # and sent, the reset answered with its dropped events), then this close.
                watch = StallWatch(self.conn, GOODBYE_TIMEOUT_S, session)
                try:
                    await asyncio.shield(self._resetting)
                finally:
                    watch.cancel()
            await self.driver.stop()
            self.frames.close()
            dropped = list(session.pending_event_ids)
            if not await self._cleanup(sid, self.model):
                self.mark(SessionState.CLEANUP_FAILED)
                if notify:
                    await self.send_error(wire.INTERNAL, f"cleanup of {sid} failed; retry session.close")
                elif self.entry is not None:
                    self.entry.owner = None  # the connection is gone; the tombstone stays, closable by id
                return None
            self._forget()
            return dropped
        finally:
            closing, self._closing = self._closing, None
            closing.set_result(None)

    async def _retry_tombstone(self, session_id: str) -> None:
        entry = self.live.find(KIND, session_id)
        tomb = self.manager.get(session_id) if session_id in self.manager else None
        if entry is None or tomb is None or tomb.state is not SessionState.CLEANUP_FAILED or entry.owner is not None:
            raise SessionError(ErrorCode.NO_SESSION, f"no closable session {shown(session_id)}: a close by id retries "
                                                     "only a session whose cleanup failed")
        dropped = list(tomb.pending_event_ids)
        if await self._cleanup(session_id, entry.model):
            self.live.remove(entry)
            await self.send(wire.closed(session_id, dropped))
        else:
            await self.send_error(wire.INTERNAL, f"cleanup of {session_id} failed; retry session.close")

    async def _cleanup(self, sid: str, model: str) -> bool:
        """CLOSING -> release on the engine -> CLOSED (True) or CLEANUP_FAILED (False)."""
        self.manager.begin_close(sid)
        ok = True
        try:
            await self.engine.drop_session(model, sid)
        except ENGINE_ERRORS as exc:
            # A dead or stopped engine owns no state any more: nothing is left to release.
            ok = engine_failure(exc) is not Failure.MODEL
        except Exception as exc:  # noqa: BLE001 - the model's release failed: a tombstone
            log.warning("session %s: cleanup failed: %r", sid, exc)
            ok = False
        state = self.manager.finish_close(sid, ok)
        log.info("session %s: %s", sid, state.name.lower())
        return state is SessionState.CLOSED

    def _forget(self) -> None:
        if self.entry is not None:
            self.live.remove(self.entry)
        if self.slot is not None:
            self.slot.give_back()
            self.slot = None
        self.session, self.entry, self.adapter, self.image = None, None, None, None

    def mark(self, state: SessionState, chunk_index: int | None = None) -> None:
        if self.entry is not None:
            self.entry.state = state
            if chunk_index is not None:
                self.entry.chunk_index = chunk_index

    def dropped(self, reason: str) -> None:
        self.driver.evicted(reason)

    async def engine_dead(self, reason: str) -> None:
        await self.driver.engine_dead(reason)


async def world_endpoint(ws: WebSocket) -> None:
    await WorldEndpoint(ws).serve()
