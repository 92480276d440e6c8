"""``WS /v1/realtime/world``: one world session per connection (world.v1).

Two tasks per connection, both on the event loop:

- the reader parses client frames and answers each at once (``event.accepted``,
  ``error``); reset and close go straight to the engine's control lane;
- the driver runs the session's ticks while the client holds credits: snapshot
  (``Session.begin_tick``) -> ``engine.submit`` -> commit -> send ``chunk`` and
  its frames. It spends one credit per chunk, so a slow client stops the driver
  instead of growing a buffer.

Every send goes through one lock, so a ``chunk`` message and its binary frames
are never split by another message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from models.base import EngineDeadError, ModelError, WorldChunk, WorldTick
from protocols import world_v1 as wire
from realtime.engine import Engine, EngineStopped, TickCancelled
from realtime.media import encode_frame
from sessions import (
    ChunkMetadata,
    ErrorCode,
    Session,
    SessionError,
    SessionEvent,
    SessionManager,
    SessionState,
    TickRequest,
    default_reducers,
)

log = logging.getLogger(__name__)


class WorldConnection:
    def __init__(self, ws: WebSocket) -> None:
        state = ws.app.state
        self.ws = ws
        self.engine: Engine = state.engine
        self.manager: SessionManager = state.world_sessions
        self.world_models: list[str] = state.world_models
        self.max_pending: int = state.config.world.max_pending_events
        self.registry: dict[str, WorldConnection] = state.world_connections
        self.session: Session | None = None
        self.model: str = ""
        self.format = "jpeg"
        self.seed = 0
        self.credits = 0
        self._send_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._driver: asyncio.Task | None = None
        self._stopping = False
        self._open = True
        self._evicted: str | None = None  # why the model dropped the session, until reset

    # ------------------------------------------------------------------ sending
    async def send(self, msg: dict[str, Any]) -> None:
        if not self._open:
            return
        try:
            async with self._send_lock:
                await self.ws.send_text(wire.dumps(msg))
        except _SOCKET_GONE as exc:
            # The client closed first (e.g. right after session.close): nobody is left to
            # tell; the reader sees the disconnect and cleans up.
            self._open = False
            log.debug("send on a closed socket: %r", exc)

    async def send_error(self, code: str, message: str, event_id: int | None = None, **extra: Any) -> None:
        sid = self.session.session_id if self.session else "-"
        log.info("session %s: error %s: %s", sid, code, message)
        await self.send(wire.error(code, message, event_id=event_id, **extra))

    # ------------------------------------------------------------------ reader
    async def run(self) -> None:
        await self.ws.accept()
        try:
            while True:
                msg = await self.ws.receive()
                if msg["type"] == "websocket.disconnect":
                    break
                if msg.get("bytes") is not None:
                    await self.send_error(wire.BAD_REQUEST, "binary frames are not accepted from clients")
                    await _close(self.ws, wire.CLOSE_UNSUPPORTED_DATA)
                    break
                text = msg.get("text") or ""
                # UTF-8 never has fewer bytes than characters: encode only when it might fit.
                if len(text) > wire.MAX_TEXT_BYTES or len(text.encode("utf-8")) > wire.MAX_TEXT_BYTES:
                    await self.send_error(wire.MESSAGE_TOO_LARGE, f"text frame over {wire.MAX_TEXT_BYTES} bytes")
                    await _close(self.ws, wire.CLOSE_TOO_BIG)
                    break
                await self.handle_text(text)
        except WebSocketDisconnect:
            pass
        finally:
            self._open = False
            await self.close_session(notify=False)

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
                self.credits = min(self.credits + wire.parse_credit(msg), wire.MAX_CREDITS)
                self._wake.set()
            elif kind == "session.reset":
                await self.reset()
            elif kind == "session.close":
                session = self._need_session()
                sid = session.session_id
                dropped = await self.close_session(notify=True)
                if dropped is not None:
                    await self.send(wire.closed(sid, dropped))
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
        if req.model not in self.world_models:
            raise SessionError(ErrorCode.BAD_REQUEST, f"unknown world model {req.model!r}; have {self.world_models}")
        if not self.engine.healthy:
            raise SessionError(ErrorCode.INTERNAL, f"engine unavailable: {self.engine.dead_reason}")
        geometry = self.engine.adapter(req.model).geometry
        model, sid = req.model, req.session_id
        self.session = self.manager.create(
            sid,
            reducers=default_reducers(geometry.frames_per_chunk),
            prompt=req.prompt,
            max_pending=self.max_pending,
            release=lambda: self.engine.post_control(self.engine.release_session(model, sid)),
        )
        self.model, self.format, self.seed, self.credits = model, req.format, req.seed, req.credits
        self.registry[sid] = self
        log.info("session %s: created on %s (format %s, credits %d)", sid, model, self.format, self.credits)
        await self.send(
            wire.created(sid, model, height=geometry.height, width=geometry.width,
                         frames_per_chunk=geometry.frames_per_chunk, fps=geometry.fps,
                         format=self.format, credits=self.credits)
        )
        self._start_driver()

    async def event(self, msg: dict[str, Any]) -> None:
        session = self._need_session()
        event = SessionEvent.from_wire({k: v for k, v in msg.items() if k != "type"})
        status = session.accept_event(event)
        await self.send(wire.event_accepted(event.event_id, status.value))
        self._wake.set()

    async def reset(self) -> None:
        session = self._need_session()
        await self._stop_driver()
        if session.in_flight is not None:
            session.fail_tick("tick abandoned by reset")
        dropped = session.reset()
        self._evicted = None
        await self.engine.control(self.engine.release_session(self.model, session.session_id))
        log.info("session %s: reset (dropped events %s)", session.session_id, list(dropped))
        await self.send(wire.reset_done(session.session_id, list(dropped)))
        self._start_driver()

    async def close_session(self, *, notify: bool) -> list[int] | None:
        """Close this connection's session (client close or disconnect)."""
        session = self.session
        if session is None:
            return None
        sid = session.session_id
        await self._stop_driver()
        dropped = list(session.pending_event_ids)
        self.manager.begin_close(sid)
        ok = True
        try:
            await self.engine.control(self.engine.release_session(self.model, sid))
        except (EngineStopped, EngineDeadError):
            pass  # nothing left to release: the engine owns no state any more
        except Exception:  # noqa: BLE001 - reported as CLEANUP_FAILED
            log.exception("session %s: cleanup failed", sid)
            ok = False
        state = self.manager.finish_close(sid, ok)
        self.registry.pop(sid, None)
        self.session = None
        log.info("session %s: %s", sid, state.name.lower())
        if state is not SessionState.CLOSED:
            if notify:
                await self.send_error(wire.INTERNAL, f"cleanup of {sid} failed; retry session.close")
            return None
        return dropped

    def evicted(self, reason: str) -> None:
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
            asyncio.ensure_future(self._report_failure(pending))
        # else: the queued tick fails in the model and the driver reports it.

    async def _report_failure(self, pending: list[int], detail: str = "") -> None:
        if self._evicted is not None:
            await self.send_error(wire.SESSION_EVICTED, f"session state was dropped ({self._evicted}); "
                                  "reset or close the session", pending_event_ids=pending)
        else:
            await self.send_error(wire.SESSION_FAILED, f"tick failed: {detail}; reset or close the session",
                                  pending_event_ids=pending)

    # ------------------------------------------------------------------ driver
    def _start_driver(self) -> None:
        self._stopping = False
        self._driver = asyncio.create_task(self._drive())

    async def _stop_driver(self) -> None:
        task, self._driver = self._driver, None
        if task is None:
            return
        self._stopping = True
        self._wake.set()
        if self.session is not None:
            # Drop the session's queued tick (the control lane runs ahead of it); a
            # tick already running finishes and is committed and sent as usual.
            self.engine.post_control(lambda sid=self.session.session_id: self.engine.purge(self.model, sid))
        try:
            await task
        except asyncio.CancelledError:
            pass

    async def _drive(self) -> None:
        """Tick while credits last. Chunk N is sent while chunk N+1 is generated: the
        driver commits, queues its next tick, and then sends, so a batch's sessions are
        back in the engine's queue moments after it ends. Sends stay in chunk order."""
        session = self.session
        assert session is not None
        sid = session.session_id
        geometry = self.engine.adapter(self.model).geometry
        sending: asyncio.Task | None = None
        try:
            while not self._stopping:
                if self.credits <= 0 or session.state is not SessionState.ACTIVE:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                request = session.begin_tick()
                tick = WorldTick(
                    session_id=sid,
                    request_id=request.request_id,
                    chunk_index=request.chunk_index,
                    applied_event_ids=request.applied_event_ids,
                    prompt=request.prompt,
                    actions=tuple(frozenset(keys) for keys in request.controls["keys"]),
                    seed=self.seed,
                )
                started = time.perf_counter()
                try:
                    chunk: WorldChunk = await self.engine.submit(
                        self.model, tick, session_id=sid, validate=lambda c, r=request: _validate(c, r, geometry)
                    )
                except TickCancelled:
                    return  # reset/close purged it; they take it from here
                except (ModelError, EngineDeadError, EngineStopped) as exc:
                    pending = list(session.pending_event_ids)
                    session.fail_tick(str(exc))
                    await _finish(sending)
                    await self._report_failure(pending, str(exc))
                    return
                tick_ms = (time.perf_counter() - started) * 1000.0
                try:
                    committed = session.complete_tick(_metadata(chunk))
                except SessionError as exc:
                    await _finish(sending)
                    await self.send_error(exc.code.value, exc.message)
                    return
                self.credits -= 1
                await _finish(sending)  # chunk N-1 is out before chunk N starts
                sending = asyncio.create_task(self._send_chunk(committed, chunk.frames, tick_ms))
        finally:
            await _finish(sending)

    async def _send_chunk(self, request: TickRequest, frames: np.ndarray, tick_ms: float) -> None:
        payloads = [encode_frame(f, self.format) for f in frames]
        header = wire.chunk(
            request.session_id, request.request_id, request.chunk_index, list(request.applied_event_ids),
            frames=len(payloads), format=self.format, height=frames.shape[1], width=frames.shape[2], tick_ms=tick_ms,
        )
        if not self._open:
            return
        async with self._send_lock:
            await self.ws.send_text(wire.dumps(header))
            for payload in payloads:
                await self.ws.send_bytes(payload)


# What a send raises once the peer has gone (starlette's WebSocketDisconnected is a RuntimeError).
_SOCKET_GONE = (WebSocketDisconnect, RuntimeError, OSError)


async def _close(ws: WebSocket, code: int) -> None:
    """Close after a protocol violation; a client that already left (it sent a binary or
    oversized frame and hung up at once) has nothing left to close."""
    try:
        await ws.close(code)
    except _SOCKET_GONE as exc:
        log.debug("close on a closed socket: %r", exc)


async def _finish(task: asyncio.Task | None) -> None:
    """Wait for a chunk send; a closed socket only ends the connection, handled by its reader."""
    if task is None:
        return
    try:
        await asyncio.shield(task)
    except _SOCKET_GONE as exc:
        log.debug("chunk send failed: %r", exc)


def _metadata(chunk: WorldChunk) -> ChunkMetadata:
    """The identities a model echoed, as the session compares them with its snapshot."""
    return ChunkMetadata(chunk.session_id, chunk.request_id, chunk.chunk_index, chunk.applied_event_ids)


def _validate(chunk: Any, request: TickRequest, geometry: Any) -> None:
    """Engine-thread check of a tick's output against its snapshot."""
    if not isinstance(chunk, WorldChunk):
        raise ModelError(f"model returned {type(chunk).__name__}, not a WorldChunk")
    metadata = _metadata(chunk)
    if not metadata.matches(request):
        raise ModelError(f"metadata {metadata} does not match the submitted snapshot {request.request_id}")
    expected = (geometry.frames_per_chunk, geometry.height, geometry.width, 3)
    frames = chunk.frames
    if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8 or frames.shape != expected:
        raise ModelError(f"frames must be uint8 {expected}, got {getattr(frames, 'dtype', None)} "
                         f"{getattr(frames, 'shape', None)}")


async def world_endpoint(ws: WebSocket) -> None:
    await WorldConnection(ws).run()
