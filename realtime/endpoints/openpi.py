"""``WS /v1/realtime/robot/openpi``: robot policies for the unchanged ``openpi-client``.

One connection is one robot (or, with the batch form, a gateway for several)::

    accept ──> binary frame: msgpack(metadata)
           ──> loop: receive one message ─> decode + validate (protocols/openpi.py)
                                          ─> engine.submit (the engine thread batches
                                             this robot with every other robot on the
                                             same policy) ─> binary frame: msgpack(reply)
    bad input, failed policy, dead engine ──> one text frame (the client raises it as
                                              RuntimeError) ──> close 1011; other robots
                                              are not touched

Nothing here computes on the event loop: while a policy runs, ``/healthz``, pings
and every other robot are served. While a request is in flight the next message
is already being awaited, so a robot that disconnects mid-inference is noticed at
once and its queued work dropped (the engine skips cancelled work); a robot that
sends its next request early (pipelining; the real client never does) has it
answered after the current one, in order, as with the reference server.

Keepalive: the client pings every 20 s and gives up after 20 s without a pong.
The server answers pings in uvicorn's protocol code on the event loop, which this
module never blocks, so a 60 s inference keeps its connection (the reference
server computes on its event loop and drops the robot after 20 s). uvicorn must
run (as realtime/server/server.py sets it up) with ``ws_ping_timeout=None`` (a robot stuck in a long control loop is not a
dead peer) and ``ws_max_size`` above ``MAX_MESSAGE_BYTES`` so that an over-limit
body is answered with a readable error rather than a bare 1009 close.

Drain (SIGTERM, ``drain``): a request in flight is answered, then the socket closes with
1001; an idle robot's socket closes with 1001 at once; a request that arrives during the
drain is not started (the real client's ``recv`` raises ``ConnectionClosedOK``).

Sessions: a request's ``session_id`` names the robot's state in the policy;
without one the connection's own id is used (``<conn>/<i>`` for the i-th entry of
a batch). An explicit id is held by one connection at a time, and every session a
connection used is released when it closes.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from typing import Any

from starlette.websockets import WebSocket

from models.policy.base import PolicyAdapter, PolicyResult, PolicyWork
from protocols import openpi as wire
from protocols.echo import clipped
from protocols.close_codes import CLOSE_IDLE_TIMEOUT, CLOSE_TRY_AGAIN_LATER, IDLE_TIMEOUT_REASON, TOO_MANY_SESSIONS_REASON
from realtime.endpoints.connection import (
    CLOSE_ADMIN,
    ENGINE_ERRORS,
    Connection,
    Failure,
    LiveSession,
    LiveSessions,
    Received,
    engine_failure,
    new_session_id,
    run_handler,
)
from realtime.engine import NOT_RUN, Engine
from realtime.server.limits import GOODBYE_TIMEOUT_S, IDLE, Idle, IdleClock, Slot, client_address, receive_or_idle

log = logging.getLogger(__name__)

# Close reason after the error text frame (the reference says "Traceback included ...").
_CLOSE_REASON = "error: see the previous text frame"
# Characters of an error text frame at most.
MAX_ERROR_CHARS = 1000
# Session ids one connection may hold (its own, a batch's <conn>/<i>, explicit ones); the
# next new one ends the connection with too_many_sessions. Each is live until it closes.
MAX_SESSIONS_PER_CONNECTION = 256
# A closed connection's sessions while the policy releases them (GET /v1/sessions shows it).
RELEASING = "releasing"
# How long a request naming such a session waits for its release before it is refused.
RELEASE_WAIT_S = 10.0
# How long it waits for a connection holding the id to end (its robot may have just gone
# without the server having read the close yet) before the id counts as in use.
HOLDER_WAIT_S = 1.0


class _Refused(Exception):
    """An error that ends this robot's connection with its message and ``code`` (1011)."""

    def __init__(self, message: str, code: int = wire.CLOSE_ERROR, reason: str = "") -> None:
        super().__init__(message)
        self.code, self.reason = code, reason or _CLOSE_REASON


async def openpi_endpoint(websocket: WebSocket) -> None:
    """The Starlette WebSocket endpoint. Needs ``app.state.engine`` (a started
    ``Engine``) and ``app.state.inventory`` (an ``Inventory`` with one adapter of
    kind "policy"; the first one is served)."""
    await run_handler(OpenPIConnection(websocket).run(), websocket.app.state.live_sessions)


KIND = "policy"


class OpenPIConnection:
    def __init__(self, ws: WebSocket) -> None:
        state = ws.app.state
        self.conn = Connection(ws)
        self.engine: Engine = state.engine
        policies = state.inventory.names(KIND)
        self.model: str | None = policies[0] if policies else None
        self.adapter: PolicyAdapter | None = self.engine.adapter(self.model) if self.model else None  # type: ignore[assignment]
        # Every live session of every connection, app-wide: an explicit id is held by one
        # connection at a time (event loop only).
        self.live: LiveSessions = state.live_sessions
        self.conn_id = new_session_id("openpi")
        self.used: dict[str, LiveSession] = {}  # every session this connection touched
        self.packer = wire.make_packer()
        self.requests = itertools.count()
        self.prev_total_ms: float | None = None
        self.left = False  # the robot disconnected while a request was in flight
        self.busy = False  # a request is being handled (a disconnect then cancels it)
        # Set while no request is being handled and answered (a drain waits for it).
        self.quiet = asyncio.Event()
        self.quiet.set()
        self.draining = False
        self.idle_closing = False  # the idle goodbye is being sent (a drain then does not close)
        # The next receive, started while a request waits on the engine (see _watch).
        self.pending: asyncio.Future | None = None
        self.task: asyncio.Task | None = None
        self.policy_call = state.metrics.policy_call
        self.client = client_address(ws)
        self.slots = state.client_slots
        self.slot: Slot | None = None  # the connection's hold on its client's count
        self.idle = IdleClock(state.config.limits.idle_timeout_s)

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        if not await self.conn.accept():
            return
        self.live.attach(self)
        self.task = asyncio.current_task()
        try:
            if self.adapter is None:
                raise _Refused("no robot policy is loaded on this server")
            if not self.engine.healthy:
                raise _Refused(f"engine unavailable: {self.engine.dead_reason or 'stopped'}")
            self.slot = self.slots.take(self.client)
            if self.slot is None:
                raise _Refused(f"{wire.TOO_MANY_SESSIONS}: {self.slots.refusal(self.client)}",
                               CLOSE_TRY_AGAIN_LATER, TOO_MANY_SESSIONS_REASON)
            self.metadata = self.adapter.metadata
            await self.conn.send(self.packer.pack(self.metadata.to_wire()))
            log.info("session %s: robot connected to %s", self.conn_id, self.model)
            while True:
                message = await self._next()
                if message is IDLE:
                    await self._idle_close()
                    return
                if message is None or self.draining:
                    return  # a request that arrives during the drain is not started
                received = time.perf_counter()
                # The request runs in this task (no task per request: tens of microseconds
                # a call).
                self.busy = True
                self.quiet.clear()
                try:
                    try:
                        reply = await self.handle(message)
                    except asyncio.CancelledError:
                        if self.left:  # cancelled by _on_next_message, not by a server shutdown
                            self.task.uncancel()
                            log.info("session %s: robot left during inference", self.conn_id)
                            return
                        raise
                    finally:
                        self.busy = False
                    # A robot that does not take its reply within the idle timeout is dropped.
                    # A reply taken is activity, whether the policy ran inline or in the engine.
                    if await self.conn.send(reply, timeout=self.idle.reply_timeout_s):
                        self.idle.touch()
                finally:
                    self.quiet.set()
                self.prev_total_ms = (time.perf_counter() - received) * 1000.0
        except _Refused as exc:
            await self._refuse(str(exc), exc.code, exc.reason)
        except wire.WireError as exc:
            await self._refuse(f"invalid request: {exc}")
        except ConnectionError:
            pass
        except Exception as exc:  # noqa: BLE001 - a bug must still end only this robot
            log.exception("session %s: unexpected error", self.conn_id)
            await self._refuse(f"internal error: {type(exc).__name__}: {exc}")
        finally:
            if self.pending is not None and not self.pending.done():
                self.pending.cancel()
            if self.draining:  # before the handler returns (uvicorn then drops the socket)
                await self.conn.close(wire.CLOSE_GOING_AWAY, "server shutting down")
            self.quiet.set()
            self.idle.close()
            self._release()
            if self.slot is not None:
                self.slot.release()
            self.live.detach(self)

    async def _next(self) -> Received | None | Idle:
        """The robot's next message (None: it left), or ``IDLE`` if none came within the
        idle timeout (no inference runs meanwhile: this is the only wait between requests).
        A watch started during the previous request (``_watch``) may hold it already."""
        if self.pending is None:
            return await receive_or_idle(self.idle, self._receive, _never_busy)
        pending = self.pending
        if self.idle.enabled:
            while not pending.done() and not self.idle.stopped:
                left = self.idle.left()
                if left <= 0:
                    return IDLE  # the watch is cancelled as the connection ends
                await asyncio.wait({pending}, timeout=left)
        message, self.pending = await pending, None
        self.idle.touch()
        return message

    async def _idle_close(self) -> None:
        """No request for the idle timeout: the text ``idle_timeout: ...`` (the real client
        raises it should it read again) and close CLOSE_IDLE_TIMEOUT, reason "idle timeout"."""
        self.idle_closing = True  # a drain from now on leaves the close to this one
        timeout = self.idle.timeout_s
        log.info("session %s: idle for %g s (no request): closing", self.conn_id, timeout)
        await self.conn.send(f"{wire.IDLE_TIMEOUT}: no request for {timeout:g} s (the server's idle timeout, "
                             "--idle-timeout-s)", timeout=GOODBYE_TIMEOUT_S)
        await self.conn.close(CLOSE_IDLE_TIMEOUT, IDLE_TIMEOUT_REASON, timeout=GOODBYE_TIMEOUT_S)

    def _receive(self) -> Any:
        # No bound here beyond uvicorn's ws_max_size: decode_request answers an
        # over-limit body (MAX_MESSAGE_BYTES) with a readable error.
        return self.conn.receive(None, None)

    def _watch(self) -> None:
        """The request is about to wait (on the engine): receive the robot's next message
        meanwhile, so that a disconnect is noticed at once. A request answered without
        waiting (a fast policy run inline) needs no watch: nothing is left to cancel."""
        if self.pending is None:
            self.pending = asyncio.ensure_future(self._receive())
            self.pending.add_done_callback(functools.partial(self._on_next_message, self.task))

    def _on_next_message(self, task: asyncio.Task, pending: asyncio.Future) -> None:
        """The robot's next message arrived while a request may still run in ``task``.
        A disconnect during the request cancels it (its queued tick is skipped by the
        engine); a pipelined request stays in ``pending`` and is answered after this one."""
        if pending.cancelled() or pending.exception() is not None:
            return
        if pending.result() is None and self.busy:
            self.left = True
            task.cancel()

    async def _refuse(self, text: str, code: int = wire.CLOSE_ERROR, reason: str = _CLOSE_REASON) -> None:
        """The error text, then the close; a robot that does not read is dropped after
        GOODBYE_TIMEOUT_S (it may have stopped reading on purpose, to keep its slot)."""
        text = clipped(text, MAX_ERROR_CHARS)  # the protocol's echoes are clipped; an exception's may not be
        log.info("session %s: closing with error: %s", self.conn_id, text)
        await self.conn.send(text, timeout=GOODBYE_TIMEOUT_S)
        await self.conn.close(code, reason)

    async def drain(self) -> None:
        """Server shutdown: the request in flight, if any, is answered; then close 1001."""
        self.draining = True
        self.idle.stop()  # the drain closes this socket, never the idle timeout
        if self.idle_closing:
            return  # the idle close under way closes the socket (4408); one close, not two
        await self.quiet.wait()
        log.info("session %s: drained", self.conn_id)
        await self.conn.close(wire.CLOSE_GOING_AWAY, "server shutting down")

    async def admin_close(self, session_id: str) -> None:
        """An operator closed one of this connection's sessions: the robot's connection
        ends with a text frame (the real client raises it) and close CLOSE_ADMIN."""
        text = f"closed_by_admin: session {session_id} was closed by the server's operator"
        log.info("session %s: closing: %s", self.conn_id, text)
        await self.conn.send(text, timeout=GOODBYE_TIMEOUT_S)
        await self.conn.close(CLOSE_ADMIN, "closed by admin")

    async def engine_dead(self, reason: str) -> None:
        """The engine died: an idle robot is told now (a request in flight fails on its own)."""
        if not self.busy:
            await self._refuse(f"engine unavailable: {reason}")

    def dropped(self, reason: str) -> None:
        log.info("session %s: policy dropped a robot's state: %s", self.conn_id, reason)

    async def _free(self, sid: str) -> LiveSession | None:
        """The live entry holding ``sid`` once waiting is over, None if it is free. A holder
        whose robot has just gone (its connection not yet ended here) is given HOLDER_WAIT_S
        to end; a released one (``releasing``) is waited for, RELEASE_WAIT_S at most."""
        deadline = time.monotonic() + RELEASE_WAIT_S
        held = self.live.find(KIND, sid)
        while held is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return held
            try:
                wait = left if held.state == RELEASING else min(left, HOLDER_WAIT_S)
                await asyncio.wait_for(held.ended.wait(), wait)
            except TimeoutError:
                if held.state != RELEASING:
                    return held  # another robot holds it: in use
            held = self.live.find(KIND, sid)
        return None

    def _release(self) -> None:
        """Release every session this connection used. Each stays listed (state
        ``releasing``, no owner) until the policy has released it: see ``_session``."""
        for sid, entry in self.used.items():
            if self.model is None:
                self.live.remove(entry)
                continue
            entry.owner, entry.state = None, RELEASING
            asyncio.ensure_future(self._released(sid, entry))
        log.info("session %s: robot disconnected (%d sessions released)", self.conn_id, len(self.used))

    async def _released(self, sid: str, entry: LiveSession) -> None:
        assert self.model is not None
        try:
            await self.engine.release(self.model, sid)
        except ENGINE_ERRORS:
            pass  # a dead or stopped engine holds no policy state
        except Exception as exc:  # noqa: BLE001 - the policy's own release failed; the id is free anyway
            log.warning("session %s: policy release of %s failed: %r", self.conn_id, sid, exc)
        finally:
            self.live.remove(entry)

    # ------------------------------------------------------------------ requests
    async def handle(self, message: Received) -> bytes:
        """One received message -> the packed reply. Raises ``WireError`` / ``_Refused``."""
        frame: Any = message.data if message.data is not None else message.text
        req = wire.decode_request(frame, self.metadata)
        if isinstance(req, wire.ResetRequest):
            await self.reset(await self._session(req.session_id, None))
            return self.packer.pack(wire.reset_reply())
        if isinstance(req, wire.BatchRequest):
            sids = [await self._session(item.session_id, i) for i, item in enumerate(req.items)]
            replies = await asyncio.gather(*(self.infer(item, sid) for item, sid in zip(req.items, sids)))
            return self.packer.pack(wire.batch_reply(replies))
        return self.packer.pack(await self.infer(req, await self._session(req.session_id, None)))

    async def _session(self, explicit: str | None, index: int | None) -> str:
        """The session id a request uses, claimed for this connection. An id whose last
        connection has just closed is still being released in the policy (its entry stays
        live until then): a robot that reconnects at once waits for that, instead of
        having its first request cancelled and its new state wiped by the release."""
        if explicit is None:
            sid = self.conn_id if index is None else f"{self.conn_id}/{index}"
        else:
            sid = explicit
        if sid not in self.used:
            assert self.model is not None
            if len(self.used) >= MAX_SESSIONS_PER_CONNECTION:
                raise _Refused(f"{wire.TOO_MANY_SESSIONS}: this connection holds {len(self.used)} session ids, "
                               f"the most one connection may (reconnect to start over)",
                               CLOSE_TRY_AGAIN_LATER, TOO_MANY_SESSIONS_REASON)
            held = await self._free(sid)
            if held is not None:
                raise _Refused(f"session_id {sid!r} is in use by another connection")
            self.used[sid] = self.live.add(KIND, sid, self.model, owner=self)
        return sid

    async def infer(self, req: wire.InferRequest, sid: str) -> dict[str, Any]:
        rid = f"{sid}:{next(self.requests)}"
        work = PolicyWork(session_id=sid, request_id=rid, observation=req.observation, sampling=req.sampling)
        started = time.perf_counter()
        try:
            # An instant policy is answered here and now; anything else through the engine.
            result: PolicyResult = self.engine.run_now(self.model, work, session_id=sid)
            if result is NOT_RUN:
                answer = self.engine.submit_future(self.model, work, session_id=sid)
                if not answer.done():
                    self._watch()
                result = await answer
        except ENGINE_ERRORS as exc:
            raise _Refused(f"{_REFUSALS[engine_failure(exc)]}: {exc}") from None
        entry = self.used[sid]
        entry.ticked(entry.chunk_index + 1)
        infer_ms = (time.perf_counter() - started) * 1000.0
        self.policy_call.observe(infer_ms / 1000.0)
        return wire.infer_reply(
            result.actions,
            infer_ms=infer_ms,
            policy_infer_ms=result.policy_ms,
            prev_total_ms=self.prev_total_ms,
            outputs=result.outputs,
        )

    async def reset(self, sid: str) -> None:
        assert self.model is not None
        # Connection-scoped batch sessions (<conn>/<i>) reset with the connection.
        sids = [sid] if sid != self.conn_id else [s for s in self.used if s.split("/")[0] == self.conn_id]
        self._watch()
        for s in sids:
            try:
                await self.engine.reset(self.model, s)
            except ENGINE_ERRORS as exc:
                raise _Refused(f"{_REFUSALS[engine_failure(exc)]}: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - the policy's own reset failed
                raise _Refused(f"policy reset failed: {type(exc).__name__}: {exc}") from None
            self.used[s].chunk_index = 0
        log.info("session %s: reset %s", self.conn_id, sids)


def _never_busy() -> bool:
    """Between requests nothing runs for the robot (receive_or_idle's ``busy``)."""
    return False


# The text frame's prefix per engine outcome (the real client raises the text as is).
_REFUSALS = {Failure.MODEL: "policy failed", Failure.ENGINE: "engine unavailable", Failure.CANCELLED: "request cancelled"}
