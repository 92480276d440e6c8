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
connection used is released when it closes. A stateful policy (its metadata's
``needs_session_id``, RoboArena's flag) keeps an explicit id's state past the close,
so that a robot reconnecting under the id continues its episode; the policy bounds
what it keeps, and a reset or an operator's close drops it.
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
from protocols.close_codes import CLOSE_TRY_AGAIN_LATER, TOO_MANY_SESSIONS_REASON
from protocols.echo import clipped
from realtime.endpoints.connection import Received
from realtime.endpoints.idle import IDLE, Idle, receive_or_idle
from realtime.endpoints.lifecycle import ENGINE_ERRORS, Failure, Goodbye, SessionEndpoint, Why, engine_failure
from sessions import SessionState
from sessions.registry import SessionRecord, new_session_id
from realtime.engine import NOT_RUN

log = logging.getLogger(__name__)

# Close reason after the error text frame (the reference says "Traceback included ...").
_CLOSE_REASON = "error: see the previous text frame"
# Characters of an error text frame at most.
MAX_ERROR_CHARS = 1000
# Session ids one connection may hold (its own, a batch's <conn>/<i>, explicit ones); the
# next new one ends the connection with too_many_sessions. Each is live until it closes.
MAX_SESSIONS_PER_CONNECTION = 256
# How long a request naming such a session waits for its release before it is refused.
RELEASE_WAIT_S = 10.0
# How long it waits for a connection holding the id to end (its robot may have just gone
# without the server having read the close yet) before the id counts as in use.
HOLDER_WAIT_S = 1.0


class _Refused(Goodbye):
    """An error that ends this robot's connection with its text and ``close_code`` (1011)."""

    def __init__(self, message: str, close_code: int = wire.CLOSE_ERROR, reason: str = _CLOSE_REASON) -> None:
        super().__init__(None, message, close_code, reason)


async def openpi_endpoint(websocket: WebSocket) -> None:
    """The Starlette WebSocket endpoint. Needs ``app.state.engine`` (a started
    ``Engine``) and ``app.state.inventory`` (an ``Inventory`` with one adapter of
    kind "policy"; the first one is served)."""
    await OpenPIEndpoint(websocket).serve()


KIND = "policy"


class OpenPIEndpoint(SessionEndpoint):
    kind = KIND
    idle_what = "no request"

    def __init__(self, ws: WebSocket) -> None:
        super().__init__(ws)
        policies = ws.app.state.inventory.names(KIND)
        self.model: str | None = policies[0] if policies else None
        self.adapter: PolicyAdapter | None = self.engine.adapter(self.model) if self.model else None  # type: ignore[assignment]
        self.conn_id = new_session_id("openpi")
        self.used: dict[str, SessionRecord] = {}  # every session this connection touched
        self.packer = wire.make_packer()
        self.requests = itertools.count()
        self.prev_total_ms: float | None = None
        self.left = False  # the robot disconnected while a request was in flight
        self.closed_by_admin = False  # an operator ended it: no session's state outlives it
        self.in_request = False  # a request is being handled (a disconnect then cancels it)
        # Set while no request is being handled and answered (a drain waits for it).
        self.quiet = asyncio.Event()
        self.quiet.set()
        # The next receive, started while a request waits on the engine (see _watch).
        self.pending: asyncio.Future | None = None
        self.task: asyncio.Task | None = None
        self.policy_call = self.metrics.policy_call

    # ------------------------------------------------------------------ lifecycle
    @property
    def log_id(self) -> str:
        return self.conn_id

    def unavailable(self) -> Goodbye | None:
        if self.adapter is None:
            return _Refused("no robot policy is loaded on this server")
        if not self.engine.healthy:
            return _Refused(f"engine unavailable: {self.engine.dead_reason or 'stopped'}")
        return None

    async def opened(self) -> None:
        assert self.adapter is not None
        self.task = asyncio.current_task()
        self.metadata = self.adapter.metadata
        await self.conn.send(self.packer.pack(self.metadata.to_wire()))
        log.info("session %s: robot connected to %s", self.conn_id, self.model)

    async def handle(self, message: Received) -> bool:
        if self.draining:
            return False  # a request that arrives during the drain is not started
        assert self.task is not None
        received = time.perf_counter()
        # The request runs in this task (no task per request: tens of microseconds a call).
        self.in_request = True
        self.quiet.clear()
        try:
            try:
                reply = await self.request(message)
            except asyncio.CancelledError:
                if self.left:  # cancelled by _on_next_message, not by a server shutdown
                    self.task.uncancel()
                    log.info("session %s: robot left during inference", self.conn_id)
                    return False
                raise
            except wire.ProtocolError as exc:
                raise _Refused(f"invalid request: {exc}") from None
            except Goodbye:
                raise
            except ConnectionError:
                return False
            except Exception as exc:  # noqa: BLE001 - a bug must still end only this robot
                log.exception("session %s: unexpected error", self.conn_id)
                raise _Refused(f"internal error: {type(exc).__name__}: {exc}") from None
            finally:
                self.in_request = False
            # A robot that does not take its reply within the idle timeout is dropped.
            # A reply taken is activity, whether the policy ran inline or in the engine.
            if await self.conn.send(reply, timeout=self.idle.reply_timeout_s):
                self.idle.touch()
        finally:
            self.quiet.set()
        self.prev_total_ms = (time.perf_counter() - received) * 1000.0
        return True

    async def tell(self, code: str | None, message: str, timeout: float | None = None) -> None:
        # The real client raises the text as it is; the protocol's echoes are clipped, an
        # exception's may not be.
        text = clipped(f"{code}: {message}" if code else message, MAX_ERROR_CHARS)
        self.metrics.refused(code)  # counted when it is a refusal (too_many_sessions, idle_timeout, ...)
        await self.conn.send(text, timeout=timeout or self.idle.reply_timeout_s)

    async def wind_down(self, why: Why) -> None:
        """At a drain, the request in flight, if any, is answered first."""
        if why is Why.ADMIN:
            self.closed_by_admin = True
        if why is Why.DRAIN:
            await self.quiet.wait()
            log.info("session %s: drained", self.conn_id)

    async def ended(self) -> None:
        if self.pending is not None and not self.pending.done():
            self.pending.cancel()
        if self.draining:  # before the handler returns (uvicorn then drops the socket)
            await self.conn.close(wire.CLOSE_GOING_AWAY, "server shutting down")
        self.quiet.set()
        self._end_sessions()

    async def engine_dead(self, reason: str) -> None:
        """The engine died: an idle robot is told now (a request in flight fails on its own)."""
        if not self.in_request:
            await self.goodbye(_Refused(f"engine unavailable: {reason}"))

    def dropped(self, reason: str) -> None:
        log.info("session %s: policy dropped a robot's state: %s", self.conn_id, reason)

    async def next_message(self) -> Received | None | Idle:
        """The robot's next message (None: it left), or ``IDLE`` if none came within the
        idle timeout (no inference runs meanwhile: this is the only wait between requests).
        A watch started during the previous request (``_watch``) may hold it already."""
        if self.pending is None:
            return await receive_or_idle(self.idle, self.receive, self.busy)
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

    def receive(self) -> Any:
        # No bound here beyond uvicorn's ws_max_size: parse_client answers an
        # over-limit body (MAX_MESSAGE_BYTES) with a readable error.
        return self.conn.receive(None, None)

    def _watch(self) -> None:
        """The request is about to wait (on the engine): receive the robot's next message
        meanwhile, so that a disconnect is noticed at once. A request answered without
        waiting (a fast policy run inline) needs no watch: nothing is left to cancel."""
        if self.pending is None:
            self.pending = asyncio.ensure_future(self.receive())
            self.pending.add_done_callback(functools.partial(self._on_next_message, self.task))

    def _on_next_message(self, task: asyncio.Task, pending: asyncio.Future) -> None:
        """The robot's next message arrived while a request may still run in ``task``.
        A disconnect during the request cancels it (its queued tick is skipped by the
        engine); a pipelined request stays in ``pending`` and is answered after this one."""
        if pending.cancelled() or pending.exception() is not None:
            return
        if pending.result() is None and self.in_request:
            self.left = True
            task.cancel()

    async def _free(self, sid: str) -> SessionRecord | None:
        """The live entry holding ``sid`` once waiting is over, None if it is free. A holder
        whose robot has just gone (its connection not yet ended here) is given HOLDER_WAIT_S
        to end; a closing one (its state dropped in the policy) is waited for, RELEASE_WAIT_S at most."""
        deadline = time.monotonic() + RELEASE_WAIT_S
        held = self.live.find(KIND, sid)
        while held is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return held
            try:
                wait = left if held.state is SessionState.CLOSING else min(left, HOLDER_WAIT_S)
                async with asyncio.timeout(wait):
                    await held.ended.wait()
            except TimeoutError:
                if held.state is not SessionState.CLOSING:
                    return held  # another robot holds it: in use
            held = self.live.find(KIND, sid)
        return None

    def _end_sessions(self) -> None:
        """End every session this connection used. Each stays listed (state
        ``closing``, no owner) until the policy has released it: see ``_session``.
        A stateful policy's explicit ids are only unlisted: their state stays in the policy."""
        kept = 0
        for sid, entry in self.used.items():
            if self.model is None:
                self.live.remove(entry)
                continue
            if self._outlives_connection(sid):
                self.live.remove(entry)  # free for the robot's next connection
                assert self.adapter is not None
                self.engine.post_control(functools.partial(self.adapter.detach, sid))  # reclaimable
                kept += 1
                continue
            entry.owner, entry.state = None, SessionState.CLOSING
            asyncio.ensure_future(self._drop_state(sid, entry))
        log.info("session %s: robot disconnected (%d sessions released, %d kept by the policy)",
                 self.conn_id, len(self.used) - kept, kept)

    def _outlives_connection(self, sid: str) -> bool:
        """Whether ``sid``'s state stays in the policy when this connection ends: a client's own
        id on a stateful policy, unless an operator closed the connection."""
        if self.adapter is None or not self.adapter.metadata.needs_session_id or self.closed_by_admin:
            return False
        return sid != self.conn_id and not sid.startswith(self.conn_id + "/")

    async def _drop_state(self, sid: str, entry: SessionRecord) -> None:
        assert self.model is not None
        try:
            await self.engine.drop_session(self.model, sid)
        except ENGINE_ERRORS:
            pass  # a dead or stopped engine holds no policy state
        except Exception as exc:  # noqa: BLE001 - the policy's own release failed; the id is free anyway
            log.warning("session %s: policy release of %s failed: %r", self.conn_id, sid, exc)
        finally:
            self.live.remove(entry)

    # ------------------------------------------------------------------ requests
    async def request(self, message: Received) -> bytes:
        """One received message -> the packed reply. Raises ``ProtocolError`` / ``_Refused``."""
        frame: Any = message.data if message.data is not None else message.text
        req = wire.parse_client(frame, self.metadata)
        if isinstance(req, wire.ResetRequest):
            # A reset naming an id claims it first (one in use elsewhere is refused, its robot
            # untouched); a bare one resets every session this connection has used.
            if req.session_id is not None or not self.used:
                await self.reset([await self._session(req.session_id, None)])
            else:
                await self.reset(list(self.used))
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
                raise Goodbye(wire.TOO_MANY_SESSIONS, f"this connection holds {len(self.used)} session ids, "
                              "the most one connection may (reconnect to start over)",
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

    async def reset(self, sids: list[str]) -> None:
        assert self.model is not None
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


# The text frame's prefix per engine outcome (the real client raises the text as is).
_REFUSALS = {Failure.MODEL: "policy failed", Failure.ENGINE: "engine unavailable", Failure.CANCELLED: "request cancelled"}
