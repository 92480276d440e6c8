"""``WS /v1/realtime/world``: one world session per connection (world.v1).

Two tasks per connection, both on the event loop:

- the reader parses client frames and answers each at once (``event.accepted``,
  ``error``); reset and close go straight to the engine's control lane;
- the driver runs the session's ticks while the client holds credits: snapshot
  (``Session.begin_tick``) -> ``engine.submit`` -> commit -> send ``chunk`` and
  its frames. It spends one credit per chunk, so a slow client stops the driver
  instead of growing a buffer. A session created with ``stream_frames`` gets its
  frames as the model makes them (``chunk.frames``, ``FrameStream``) and the
  ``chunk`` after them as the commit, or an ``error`` if the tick fails.

The model is a ``WorldAdapter``: it turns a snapshot into its tick, checks its own
chunks (identities, frame shape) on the engine thread, and declares the geometry
sent in ``session.created``. Socket mechanics, error mapping and the live-session
registry are ``realtime/endpoints/connection.py``'s.

Close: the client's ``session.close``, its disconnect, an admin close and the server's
drain may overlap; the first runs the close and the others wait for it (``close_session``),
so one close answers the client and none finds the session already gone. A cleanup that
fails leaves the session a CLEANUP_FAILED tombstone (its id
cannot be reused); ``session.close`` again on the same connection retries it, and so
does ``session.close`` with its ``session_id`` from a new connection after a disconnect.

Next tick first: once a tick commits, the driver queues the session's next tick before
anything else it does for that chunk (the live-session entry, the idle clock, waiting
for the chunk before to be out, starting this chunk's send). A session alone on the
server has one tick in flight, so the engine idles from the end of its forward until
that submit; the rest then runs while the next forward computes (the send itself
waits for its launch, ``launch_gate``). A streamed tick's next one is queued after
the send task it must follow.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from typing import Any, Callable

import numpy as np
from starlette.websockets import WebSocket

from models.world.base import WorldAdapter, WorldChunk, WorldGeometry
from protocols import world_v1 as wire
from protocols.close_codes import CLOSE_IDLE_TIMEOUT, IDLE_TIMEOUT_REASON
from protocols.echo import shown
from realtime.endpoints.connection import (
    CLOSE_ADMIN,
    ENGINE_ERRORS,
    WORLD_CODES,
    Connection,
    Failure,
    LiveSession,
    TooLarge,
    engine_failure,
    run_handler,
)
from realtime.engine import Engine
from realtime.server.limits import GOODBYE_TIMEOUT_S, IDLE, IdleClock, Slot, client_address, receive_or_idle
from realtime.media import encode_chunk
from sessions import (
    ChunkMetadata,
    ErrorCode,
    Session,
    SessionError,
    SessionEvent,
    SessionManager,
    SessionState,
    TickRequest,
)

log = logging.getLogger(__name__)

KIND = "world"


class _IdleClosed(Exception):
    """The connection was closed for idleness while a message was being handled."""


class WorldConnection:
    def __init__(self, ws: WebSocket) -> None:
        state = ws.app.state
        self.conn = Connection(ws)
        self.engine: Engine = state.engine
        self.manager: SessionManager = state.world_sessions
        self.world_models: list[str] = state.inventory.names(KIND)
        self.max_pending: int = state.config.world.max_pending_events
        self.ticks_in_flight: int = state.config.world.session_ticks_in_flight
        self.ticks_in_flight_alone: int | None = state.config.world.session_ticks_in_flight_alone
        self.live = state.live_sessions
        self.client = client_address(ws)
        self.slots = state.client_slots
        self.slot: Slot | None = None  # this session's hold on its client's count
        self.idle = IdleClock(state.config.limits.idle_timeout_s)
        self.session: Session | None = None
        self.entry: LiveSession | None = None
        self.adapter: WorldAdapter | None = None
        self.model: str = ""
        self.format = "jpeg"
        self.seed = 0
        self.options: dict[str, Any] = {}
        self.image: np.ndarray | None = None  # the session's first image, if it has one
        self.stream_frames = False
        self.credits = 0
        self._wake = asyncio.Event()
        self._driver: asyncio.Task | None = None
        self._sending: asyncio.Task | None = None  # the driver's chunk send in progress
        self._ahead: collections.deque[_Queued] = collections.deque()  # the driver's ticks in the engine
        self._stopping = False
        self.idle_closing = False  # the idle goodbye is being sent (a drain then does not close)
        self._closing: asyncio.Future | None = None  # resolved when the close in progress ends
        self._resetting: asyncio.Future | None = None  # resolved when the reset in progress ends
        self._evicted: str | None = None  # why the model dropped the session, until reset

    # ------------------------------------------------------------------ sending
    async def send(self, msg: dict[str, Any], timeout: float | None = None) -> None:
        """One reply (``timeout``: dropped if not taken by then; the idle timeout by default)."""
        await self.conn.send(wire.dumps(msg), timeout=timeout or self.idle.reply_timeout_s)

    async def send_error(self, code: str, message: str, event_id: int | None = None,
                         timeout: float | None = None, **extra: Any) -> None:
        sid = self.session.session_id if self.session else "-"
        log.info("session %s: error %s: %s", sid, code, message)
        await self.send(wire.error(code, message, event_id=event_id, **extra), timeout=timeout)

    # ------------------------------------------------------------------ reader
    async def run(self) -> None:
        if not await self.conn.accept():
            return
        self.live.attach(self)
        try:
            while True:
                try:
                    frame = await receive_or_idle(self.idle, self._receive, self._busy)
                except TooLarge:
                    await self.send_error(wire.MESSAGE_TOO_LARGE, f"text frame over {wire.MAX_TEXT_BYTES} bytes")
                    await self.conn.close(wire.CLOSE_TOO_BIG)
                    break
                if frame is IDLE:
                    await self.idle_close()
                    break
                if frame is None:
                    break
                if frame.data is not None:
                    await self.send_error(wire.BAD_REQUEST, "binary frames are not accepted from clients")
                    await self.conn.close(wire.CLOSE_UNSUPPORTED_DATA)
                    break
                try:
                    await self.handle_text(frame.text or "")
                except _IdleClosed:
                    break
        finally:
            self.idle.close()
            try:
                await self.close_session(notify=False)
            finally:
                if self.slot is not None:  # a tombstone left behind no longer counts against the client
                    self.slot.release()
                self.live.detach(self)

    def _receive(self) -> Any:
        return self.conn.receive(wire.MAX_TEXT_BYTES, max_binary=None)

    def _busy(self) -> bool:
        """A tick of this session is in the engine: not idle, however long it takes. Ticks
        done there whose chunks wait for the client to read do not count: a client that
        stopped reading is idle, whatever the driver queued before it stalled."""
        return any(not queued.future.done() for queued in self._ahead)

    async def idle_close(self) -> None:
        """The client sent nothing and took no chunk for the idle timeout: ``idle_timeout``,
        the session ends as on ``session.close`` (its dropped events reported in
        ``session.closed``), and the socket closes with CLOSE_IDLE_TIMEOUT. A client that
        does not read takes none of it and is dropped after GOODBYE_TIMEOUT_S."""
        self.idle_closing = True  # a drain from now on leaves the close to this one
        timeout = self.idle.timeout_s
        session = self.session
        sid = session.session_id if session is not None else "-"
        log.info("session %s: idle for %g s (no message, no chunk taken): closing", sid, timeout)
        sending = self._sending
        if sending is not None and not sending.done():
            # A client that stopped reading never takes this chunk; the session cannot end behind it.
            sending.cancel()
        what = "no message and no chunk taken" if session is not None else "no message"
        await self.conn.send(wire.dumps(wire.error(wire.IDLE_TIMEOUT, f"{what} for {timeout:g} s (the server's "
                                                   "idle timeout, --idle-timeout-s): closing")),
                             timeout=GOODBYE_TIMEOUT_S)
        if session is not None:
            dropped = await self.close_session(notify=False)
            if dropped is not None:
                await self.conn.send(wire.dumps(wire.closed(session.session_id, dropped)), timeout=GOODBYE_TIMEOUT_S)
        await self.conn.close(CLOSE_IDLE_TIMEOUT, IDLE_TIMEOUT_REASON, timeout=GOODBYE_TIMEOUT_S)

    async def handle_text(self, text: str) -> None:
        event_id = None
        try:
            msg = wire.parse(text)
            event_id = msg.get("event_id") if isinstance(msg.get("event_id"), int) else None
            kind = msg["type"]
            if kind == "session.create":
                await self.create(msg)
            elif kind == "event":
                await self.event(msg)
            elif kind == "credit":
                self._need_session()
                self.credits = min(self.credits + wire.parse_credit(msg).chunks, wire.MAX_CREDITS)
                self._wake.set()
            elif kind == "session.reset":
                wire.parse_reset(msg)
                await self.reset()
            elif kind == "session.close":
                await self.close(wire.parse_close(msg).session_id)
        except wire.ProtocolError as exc:
            await self.send_error(exc.code, exc.message, exc.event_id if exc.event_id is not None else event_id)
        except SessionError as exc:
            await self.send_error(exc.code.value, exc.message, exc.event_id if exc.event_id is not None else event_id)

    def _need_session(self) -> Session:
        if self.session is None:
            raise SessionError(ErrorCode.NO_SESSION, "no session on this connection: send session.create first")
        return self.session

    # ------------------------------------------------------------------ messages
    async def create(self, msg: dict[str, Any]) -> None:
        if self.session is not None:
            raise SessionError(
                ErrorCode.BAD_REQUEST,
                f"this connection already has session {self.session.session_id!r}; close it first",
            )
        req = wire.parse_create(msg, default_model=self.world_models[0])
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
        image = await self._first_image(req, adapter, data) if data is not None else None
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
                release=lambda: engine.post_release(model, sid),
                # A streamed tick's frames go out before its commit: one tick at a time.
                max_in_flight=1 if req.stream_frames else self.ticks_in_flight,
            )
            await self._admit(adapter, model, sid, options)
        except BaseException:
            slot.release()
            raise
        self.slot = slot
        self.session, self.options = session, options
        self.adapter, self.model, self.image = adapter, model, image
        self.format, self.seed, self.credits = req.format, req.seed, req.credits
        self.stream_frames = req.stream_frames
        self.entry = self.live.add(KIND, sid, model, owner=self)
        log.info("session %s: created on %s (format %s, credits %d)", sid, model, self.format, self.credits)
        await self.send(
            wire.created(sid, model, height=geometry.height, width=geometry.width,
                         frames_per_chunk=geometry.frames_per_chunk, fps=geometry.fps,
                         format=self.format, credits=self.credits)
        )
        self._start_driver()

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
            self.engine.post_release(model, sid)
            raise SessionError(code, refusal)

    async def _image_bytes(self, spec: wire.ImageSpec) -> bytes:
        """The binary message of ``spec.bytes`` bytes that follows ``session.create``;
        ``SessionError(BAD_REQUEST)`` naming what arrived instead."""
        try:
            frame = await receive_or_idle(
                self.idle, lambda: self.conn.receive(wire.MAX_TEXT_BYTES, max_binary=spec.bytes), lambda: False)
        except TooLarge as exc:
            got = "a binary message" if exc.binary else "a text frame (over the text limit)"
            raise SessionError(ErrorCode.BAD_REQUEST, f"image: {got} of {exc.size} bytes where the announced "
                                                      f"binary message of {spec.bytes} bytes was due") from None
        if frame is IDLE:  # announced, never sent
            await self.idle_close()
            raise _IdleClosed()
        if frame is None:
            raise SessionError(ErrorCode.BAD_REQUEST, "image: the connection closed before the image arrived")
        if frame.data is None:
            raise SessionError(ErrorCode.BAD_REQUEST, f"image: expected a binary message of {spec.bytes} bytes "
                                                      "right after session.create, got a text frame")
        if len(frame.data) != spec.bytes:
            raise SessionError(ErrorCode.BAD_REQUEST, f"image: a binary message of {len(frame.data)} bytes, "
                                                      f"announced {spec.bytes}")
        return frame.data

    async def _first_image(self, req: wire.CreateRequest, adapter: WorldAdapter, data: bytes) -> np.ndarray:
        """The model's first frame from the image bytes, or ``SessionError(BAD_REQUEST)``
        naming the reason (then nothing is created)."""
        assert req.image is not None
        if not adapter.takes_image:
            raise SessionError(ErrorCode.BAD_REQUEST, f"world model {req.model!r} takes no first image")
        try:
            # Decoding up to 64 megapixels takes a while: off the event loop.
            return await asyncio.to_thread(adapter.first_image, data, req.image.format)
        except ValueError as exc:
            raise SessionError(ErrorCode.BAD_REQUEST, f"image: {exc}") from None

    async def event(self, msg: dict[str, Any]) -> None:
        session = self._need_session()
        event = SessionEvent.from_wire(wire.parse_event(msg))
        status = session.accept_event(event)
        await self.send(wire.event_accepted(event.event_id, status.value))
        self._wake.set()

    async def reset(self) -> None:
        session = self._need_session()
        self._resetting = asyncio.get_running_loop().create_future()
        try:
            await self._reset(session)
        finally:
            resetting, self._resetting = self._resetting, None
            resetting.set_result(None)

    async def _reset(self, session: Session) -> None:
        await self._stop_driver(stall_timeout=self.idle.reply_timeout_s)  # the client goes on: its idle bound
        if session.in_flight is not None:
            session.fail_tick("tick abandoned by reset", asked=True)
        dropped = session.reset()
        self._evicted = None
        await self.engine.reset(self.model, session.session_id)
        if self.session is not session or session.state is not SessionState.ACTIVE:
            return  # the session failed or went meanwhile (a close waits for this reset): that answers the client
        self._mark("active", 0)
        log.info("session %s: reset (dropped events %s)", session.session_id, list(dropped))
        await self.send(wire.reset_done(session.session_id, list(dropped)))
        self._start_driver()

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
                watch = _StallWatch(self.conn, GOODBYE_TIMEOUT_S, session)
                try:
                    await asyncio.shield(self._resetting)
                finally:
                    watch.cancel()
            await self._stop_driver()
            dropped = list(session.pending_event_ids)
            if not await self._cleanup(sid, self.model):
                self._mark("cleanup_failed")
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

    async def drain(self) -> None:
        """Server shutdown: the session closes once its running tick is committed and
        sent; ``session.closed`` lists the accepted events no chunk applied, then the
        socket closes with 1001 (at once on a connection without a session). A connection
        whose idle close is under way is left to it: one close, not two."""
        self.idle.stop()  # the drain closes this socket, never the idle timeout
        if self.idle_closing:
            return
        session = self.session
        if session is not None:
            dropped = await self.close_session(notify=False)
            if dropped is not None:
                await self.send(wire.closed(session.session_id, dropped))
            log.info("session %s: drained after %d committed chunks", session.session_id, session.chunk_index)
        await self.conn.close(wire.CLOSE_GOING_AWAY, "server shutting down")

    async def admin_close(self, session_id: str) -> None:
        """An operator closed the session: ``closed_by_admin``, then its running tick
        finishes, the session ends (``session.closed`` lists the accepted events no chunk
        applied) and the socket closes with CLOSE_ADMIN."""
        await self.send_error(wire.CLOSED_BY_ADMIN, f"session {session_id} was closed by the server's operator",
                              timeout=GOODBYE_TIMEOUT_S)
        session = self.session
        dropped = await self.close_session(notify=False)
        if session is not None and dropped is not None:  # the accepted events no chunk applied, as on any close
            await self.send(wire.closed(session.session_id, dropped), timeout=GOODBYE_TIMEOUT_S)
        await self.conn.close(CLOSE_ADMIN, "closed by admin")

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
            await self.engine.release(model, sid)
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
            self.slot.release()
            self.slot = None
        self.session, self.entry, self.adapter, self.image = None, None, None, None

    def _mark(self, state: str, chunk_index: int | None = None) -> None:
        if self.entry is not None:
            self.entry.state = state
            if chunk_index is not None:
                self.entry.chunk_index = chunk_index

    def dropped(self, reason: str) -> None:
        """The model dropped this session's state (LRU with a full host budget).

        Runs on the event loop before any later result of this session's ticks (both
        travel through ``call_soon_threadsafe`` in order); the model refuses further
        ticks of the session until it is reset, so nothing restarts silently.
        """
        session = self.session
        if session is None or session.state is not SessionState.ACTIVE:
            return
        self._evicted = reason
        if session.in_flight is None:
            pending = list(session.pending_event_ids)
            session.fail_tick(f"evicted: {reason}")
            self._mark("failed")
            asyncio.ensure_future(self._report_failure(pending))
        # else: the queued tick fails in the model and the driver reports it.

    async def engine_dead(self, reason: str) -> None:
        """The engine died: an idle session fails now (a running tick fails on its own)."""
        session = self.session
        if session is None or session.state is not SessionState.ACTIVE or session.in_flight is not None:
            return
        await self._fail(session, f"engine dead: {reason}", Failure.ENGINE, f"engine unavailable: {reason}")

    async def _fail(self, session: Session, reason: str, failure: Failure, detail: str,
                    sending: asyncio.Task | None = None) -> None:
        """Fail the session's ticks (``reason`` for the log), let the chunk being sent go
        out, then tell the client, with the accepted events no chunk applied."""
        pending = list(session.pending_event_ids)
        if session.state is SessionState.ACTIVE:  # a reducer's prepare failed it already (begin_tick)
            session.fail_tick(reason)
        self._mark("failed")
        await _finish(sending)
        await self._report_failure(pending, failure, detail)

    async def _report_failure(self, pending: list[int], failure: Failure = Failure.MODEL, detail: str = "") -> None:
        if self._evicted is not None:
            await self.send_error(wire.SESSION_EVICTED, f"session state was dropped ({self._evicted}); "
                                  "reset or close the session", pending_event_ids=pending)
        else:
            await self.send_error(WORLD_CODES[failure], f"tick failed: {detail}; reset or close the session",
                                  pending_event_ids=pending)

    # ------------------------------------------------------------------ driver
    def _start_driver(self) -> None:
        self._stopping = False
        self._driver = asyncio.create_task(self._drive())

    async def _stop_driver(self, stall_timeout: float | None = GOODBYE_TIMEOUT_S) -> None:
        """Stop queueing ticks and wait for the driver: its running tick is committed and
        sent, however long the tick takes. But a chunk send that the client leaves untaken
        (it stopped reading) for ``stall_timeout`` drops the client: it would hold the
        close, and with it the session, for as long as the client liked."""
        task, self._driver = self._driver, None
        if task is None:
            return
        self._stopping = True
        self._wake.set()
        if self.session is not None:
            # Drop the session's queued tick (the control lane runs ahead of it); a
            # tick already running finishes and is committed and sent as usual.
            self.engine.post_cancel(self.model, self.session.session_id)
        watch = None if stall_timeout is None else _StallWatch(self.conn, stall_timeout, self.session)
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this task is being cancelled (shutdown), not only the driver
        except Exception:  # noqa: BLE001 - a bug (the driver fails its session itself): the stop goes on
            log.exception("session %s: the tick driver ended with an error",
                          self.session.session_id if self.session is not None else "-")
        finally:
            if watch is not None:
                watch.cancel()

    async def _drive(self) -> None:
        """Tick while credits last. Chunk N is sent while chunk N+1 is generated: the
        driver commits, queues its next tick, and then sends, so a batch's sessions are
        back in the engine's queue moments after it ends. With ``ticks_in_flight`` 2
        (``Session.max_in_flight``) tick N+1 is queued while N runs, so the engine takes
        it without waiting for this loop (each queued tick holds one of the credits;
        ``_depth`` says how many, at every tick). Sends stay in chunk order. Once stopped,
        no tick is queued; the ones the engine took are committed and sent, the others
        were dropped by ``_stop_driver``."""
        session, adapter = self.session, self.adapter
        assert session is not None and adapter is not None
        sending: asyncio.Task | None = None
        ahead = self._ahead = collections.deque()  # submitted ticks, oldest first
        try:
            while True:
                if (unstarted := self._fill(session, adapter, sending)) is not None:
                    await self._fail_unstarted(session, unstarted, sending)
                    return
                if not ahead:
                    if self._stopping:
                        return
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                queued = ahead[0]
                try:
                    chunk: WorldChunk = await queued.future
                except ENGINE_ERRORS as exc:
                    ahead.popleft()
                    if queued.stream is not None:  # what was streamed goes out before the error
                        await queued.stream.finish()
                    failure = engine_failure(exc)
                    if failure is Failure.CANCELLED:
                        return  # reset/close purged it; they take it from here
                    await self._fail(session, str(exc), failure, str(exc), sending)
                    return
                ahead.popleft()
                tick_ms = (time.perf_counter() - queued.started) * 1000.0
                try:
                    committed = session.complete_tick(_metadata(chunk))
                except SessionError as exc:
                    if queued.stream is not None:
                        await queued.stream.finish()
                    await _finish(sending)
                    await self.send_error(exc.code.value, exc.message)
                    return
                self.credits -= 1
                # The next tick goes to the engine before this chunk's bookkeeping and send,
                # which then run while it computes (see "Next tick first"). A streamed tick's
                # next one needs this chunk's send task: it waits for the top of the loop.
                unstarted = self._fill(session, adapter, sending) if queued.stream is None else None
                if self.entry is not None:
                    self.entry.ticked(committed.chunk_index)
                self.idle.touch()  # idleness counts from the tick's end (its chunk is sent next)
                await _finish(sending)  # chunk N-1 is out before chunk N starts
                # The commit goes out after the streamed frames (_send_chunk finishes the stream).
                sending = self._sending = asyncio.create_task(
                    self._send_chunk(committed, chunk, tick_ms, queued.stream))
                if unstarted is not None:  # told after the chunk committed before it
                    await self._fail_unstarted(session, unstarted, sending)
                    return
        except Exception as exc:  # noqa: BLE001 - a bug here must not leave the session behind its client
            log.error("session %s: the tick driver failed: %r", session.session_id, exc, exc_info=True)
            if sending is not None:
                await asyncio.wait({sending})  # the chunk being sent goes first, whatever became of it
            await self._fail(session, f"tick driver failed: {exc!r}", Failure.MODEL, f"{type(exc).__name__}: {exc}")
        finally:
            await _finish(sending)
            for queued in ahead:  # ticks this driver leaves unfinished (cancelled, failed)
                if queued.stream is not None:
                    queued.stream.cancel()
                _drop(queued.future)

    def _fill(self, session: Session, adapter: WorldAdapter, sending: asyncio.Task | None) -> "_NotStarted | None":
        """Queue the session's next ticks while it may have more in the engine (state,
        ``_depth``, a credit for each); a tick that could not start is returned, for the
        driver to report after what it has to send first."""
        ahead = self._ahead
        while (not self._stopping and session.state is SessionState.ACTIVE
               and len(ahead) < self._depth(session) and self.credits > len(ahead)):
            try:
                ahead.append(self._queue_tick(session, adapter, sending))
            except _NotStarted as exc:
                return exc
        return None

    async def _fail_unstarted(self, session: Session, exc: "_NotStarted", sending: asyncio.Task | None) -> None:
        """A tick that failed before the engine took it fails its session like any failed
        tick, told (uncaught, it would end the driver silently: the client would wait
        forever and the session outlive its socket). A value the session's reducers
        accepted and then could not prepare is a validation gap, the model's ``tick``
        raising its own bug: either way one warning (``Session.fail_tick``'s), no traceback."""
        error = exc.error
        detail = error.message if isinstance(error, SessionError) else f"{type(error).__name__}: {error}"
        await self._fail(session, f"tick could not start: {detail}", Failure.MODEL, detail, sending)

    def _depth(self, session: Session) -> int:
        """Ticks to keep queued now: the session's most, or ``ticks_in_flight_alone`` while it is
        the server's only world session (``--ticks-in-flight auto``; read at every tick)."""
        if self.ticks_in_flight_alone is not None and len(self.manager) <= 1:
            return max(1, min(self.ticks_in_flight_alone, session.max_in_flight))
        return session.max_in_flight

    def _queue_tick(self, session: Session, adapter: WorldAdapter, sending: asyncio.Task | None) -> "_Queued":
        """Begin the session's next tick and hand it to the engine; ``_NotStarted`` if anything
        failed on the way (a reducer's ``prepare``, which fails the session in ``begin_tick``;
        the model's ``tick``; the hand-over itself): the caller fails the session."""
        stream: FrameStream | None = None
        try:
            request = session.begin_tick()
            started = time.perf_counter()
            # The format travels on the tick: the model may encode jpeg on its device.
            work = adapter.tick(request, self.seed, self.options, format=self.format)
            if self.image is not None and request.chunk_index == 0:
                work = dataclasses.replace(work, image=self.image)
            # Streaming sessions have one tick in flight (create): ``sending`` is the chunk before.
            if self.stream_frames:
                stream = FrameStream(self.conn, request, self.format, adapter.geometry, after=sending,
                                     taken=self.idle.touch)
                work = dataclasses.replace(work, frame_sink=stream.sink)
            try:
                future = self.engine.submit_future(self.model, work, session_id=session.session_id)
            except ENGINE_ERRORS as exc:  # a dead or stopped engine: the driver reports it in order
                future = asyncio.get_running_loop().create_future()
                future.set_exception(exc)
        except Exception as exc:  # noqa: BLE001 - reported by the driver
            if stream is not None:
                stream.cancel()
            raise _NotStarted(exc) from exc
        return _Queued(future, started, stream)

    async def _send_chunk(self, request: TickRequest, chunk: WorldChunk, tick_ms: float,
                          stream: "FrameStream | None" = None) -> None:
        # Encoded by the model on its device (WorldChunk.encoded) or here off the loop
        # (realtime/media.py); chunk N+1's send starts only after this one's, so chunks
        # stay in order. A streamed chunk's frames go first.
        frames = chunk.frames
        try:
            streamed = await stream.finish() if stream is not None else None
        except asyncio.CancelledError:
            if stream is not None:  # an idle close cancels the send; the pump must not outlive it
                stream.cancel()
            raise
        # While the engine prepares the next batch this send would take the GIL from it.
        await self.engine.launch_gate.wait()
        if stream is not None:
            payloads = []
        elif chunk.encoded is not None:
            payloads = list(chunk.encoded)
        else:
            payloads = await encode_chunk(frames, self.format)
        header = wire.chunk(
            request.session_id, request.request_id, request.chunk_index, list(request.applied_event_ids),
            frames=len(payloads), format=self.format, height=frames.shape[1], width=frames.shape[2], tick_ms=tick_ms,
            streamed=streamed, info=chunk.info,
        )
        # One locked send: no other message comes between a chunk and its frames.
        if await self.conn.send(wire.dumps(header), *payloads):
            self.idle.touch()  # the client took a chunk: it is not idle


class FrameStream:
    """One tick's frames sent as the model makes them, before the tick commits (``stream_frames``).

    ``sink`` is the tick's ``WorldTick.frame_sink``: the engine thread calls it and it
    only queues onto the event loop. A pump sends each batch of frames as a
    ``chunk.frames`` message and its binary frames once the previous chunk is fully out
    (``after``), so a chunk's frames never overtake the commit before them. The
    engine resolves the tick after its last sink call, and both go through
    ``call_soon_threadsafe`` in order, so ``finish`` (on the loop, after the tick)
    sees every frame queued.
    """

    def __init__(self, conn: Connection, request: TickRequest, fmt: str, geometry: WorldGeometry,
                 after: asyncio.Task | None, taken: Callable[[], None] | None = None) -> None:
        self.conn, self.request, self.format, self.geometry = conn, request, fmt, geometry
        self.taken = taken  # called when the client took a batch of frames (it is not idle)
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, np.ndarray] | None] = asyncio.Queue()
        self.count = 0
        self._pump = asyncio.create_task(self._run(after))

    def sink(self, first: int, frames: np.ndarray) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (first, frames))

    async def _run(self, after: asyncio.Task | None) -> None:
        await _finish(after)
        r, g = self.request, self.geometry
        while (item := await self.queue.get()) is not None:
            first, frames = item
            payloads = await encode_chunk(frames, self.format)
            header = wire.chunk_frames(r.session_id, r.request_id, r.chunk_index, first=first,
                                       frames=len(payloads), format=self.format, height=g.height, width=g.width)
            if await self.conn.send(wire.dumps(header), *payloads) and self.taken is not None:
                self.taken()
            self.count += len(payloads)

    async def finish(self) -> int:
        """Send what is queued and stop; returns how many frames went out."""
        self.queue.put_nowait(None)
        await asyncio.shield(self._pump)
        return self.count

    def cancel(self) -> None:
        """Stop the pump if the driver ends without finishing the tick (no-op after ``finish``)."""
        self._pump.cancel()


class _StallWatch:
    """While a driver stops: every ``timeout`` s, a chunk send the client is not taking
    (``Connection.stalled``) drops the client (``abort``), which ends that send."""

    def __init__(self, conn: Connection, timeout: float, session: Session | None) -> None:
        self.conn, self.timeout = conn, timeout
        self.sid = session.session_id if session is not None else "-"
        self._timer = asyncio.get_running_loop().call_later(timeout, self._check)

    def _check(self) -> None:
        if self.conn.stalled:
            log.info("session %s: a chunk not taken within %.1f s of the session's stop: dropping the client",
                     self.sid, self.timeout)
            self.conn.abort()
            return
        self._timer = asyncio.get_running_loop().call_later(self.timeout, self._check)

    def cancel(self) -> None:
        self._timer.cancel()


@dataclasses.dataclass
class _Queued:
    """A tick the driver handed to the engine."""

    future: asyncio.Future
    started: float
    stream: "FrameStream | None"


class _NotStarted(Exception):
    """A tick failed before the engine took it: ``error`` is what was raised (by
    ``Session.begin_tick``, the model's ``tick``, or the hand-over to the engine)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(repr(error))
        self.error = error


def _drop(future: asyncio.Future) -> None:
    """Give up a queued tick's future: the engine skips it if it has not started; an
    outcome that came already is taken, so that nothing logs it as never retrieved."""
    if future.done():
        if not future.cancelled():
            future.exception()
    else:
        future.cancel()


async def _finish(task: asyncio.Task | None) -> None:
    """Wait for a chunk send (a vanished peer only ends the send; the reader cleans up)."""
    if task is not None:
        await asyncio.shield(task)


def _metadata(chunk: WorldChunk) -> ChunkMetadata:
    """The identities the model echoed (checked by its base), as the session commits them."""
    return ChunkMetadata(chunk.session_id, chunk.request_id, chunk.chunk_index, chunk.applied_event_ids)


async def world_endpoint(ws: WebSocket) -> None:
    await run_handler(WorldConnection(ws).run(), ws.app.state.live_sessions)
