"""The world tick driver: one session's ticks in flight, its credits, its chunks' sends.

``TickDriver`` runs the session's ticks while the client holds credits: snapshot
(``Session.begin_tick``) -> ``engine.submit`` -> commit -> send ``chunk`` and its frames.
It spends one credit per chunk, so a slow client stops the driver instead of growing a
buffer. A session created with ``stream_frames`` gets its frames as the model makes them
(``chunk.frames``, ``FrameStream``) and the ``chunk`` after them as the commit, or an
``error`` if the tick fails.

Next tick first: once a tick commits, the driver queues the session's next tick before
anything else it does for that chunk (the live-session entry, the idle clock, waiting
for the chunk before to be out, starting this chunk's send). A session alone on the
server has one tick in flight, so the engine idles from the end of its forward until
that submit; the rest then runs while the next forward computes (the send itself
waits for its launch, the engine's ``launch_gate``). A streamed tick's next one is queued
after the send task it must follow.

The endpoint (``world.py``) owns the session and answers the client's messages; the
driver reads the session's settings from it (``ep``) and reports a failed tick through
``fail``; an eviction or the engine's death fails it the same way.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import time
from typing import TYPE_CHECKING


from models.world.base import WorldAdapter, WorldChunk
from protocols import world_v1 as wire
from realtime.endpoints.connection import Connection
from realtime.endpoints.event_clock import EventClock
from realtime.endpoints.frame_stream import FrameStream, finish_send
from realtime.endpoints.idle import GOODBYE_TIMEOUT_S
from realtime.endpoints.lifecycle import ENGINE_ERRORS, Failure, engine_failure
from sessions import AcceptResult, Session, SessionError, SessionState, TickRequest

if TYPE_CHECKING:
    from realtime.endpoints.world import WorldEndpoint

log = logging.getLogger(__name__)


class TickDriver:
    """One world session's tick driver (module docstring); event loop only."""

    def __init__(self, ep: WorldEndpoint) -> None:
        self.ep = ep
        self.credits = 0
        self.wake = asyncio.Event()  # credits or events came: look for a tick to queue
        self._task: asyncio.Task | None = None
        self.sending: asyncio.Task | None = None  # the chunk send in progress
        self._ahead: collections.deque[_Queued] = collections.deque()  # ticks in the engine, oldest first
        self._stopping = False
        self.eviction: str | None = None  # why the model dropped the session, until reset
        # Each event's acceptance to its chunk's first frame out (realtime_world_event_to_frame_seconds).
        self.events = EventClock(ep.metrics.world_event_to_frame.observe, ep.max_pending)

    # ------------------------------------------------------------------ failures
    def evicted(self, reason: str) -> None:
        """The model dropped this session's state (LRU with a full host budget).

        Runs on the event loop before any later result of this session's ticks (both
        travel through ``call_soon_threadsafe`` in order); the model refuses further
        ticks of the session until it is reset, so nothing restarts silently.
        """
        session = self.ep.session
        if session is None or session.state is not SessionState.ACTIVE:
            return
        self.eviction = reason
        self.ep.frames.restart()  # the stream's state goes with the session's; reset starts a new one
        if session.in_flight is None:
            pending = list(session.pending_event_ids)
            session.fail_tick(f"evicted: {reason}")
            self.ep.mark(SessionState.FAILED)
            asyncio.ensure_future(self._report_failure(pending))
        # else: the queued tick fails in the model and the driver reports it.

    async def engine_dead(self, reason: str) -> None:
        """The engine died: an idle session fails now (a running tick fails on its own)."""
        session = self.ep.session
        if session is None or session.state is not SessionState.ACTIVE or session.in_flight is not None:
            return
        await self.fail(session, f"engine dead: {reason}", f"engine unavailable: {reason}")

    async def fail(self, session: Session, reason: str, detail: str, sending: asyncio.Task | None = None) -> None:
        """Fail the session's ticks (``reason`` for the log), let the chunk being sent go
        out, then tell the client, with the accepted events no chunk applied."""
        pending = list(session.pending_event_ids)
        if session.state is SessionState.ACTIVE:  # a reducer's prepare failed it already (begin_tick)
            session.fail_tick(reason)
        self.ep.mark(SessionState.FAILED)
        await finish_send(sending)
        self.ep.frames.restart()  # after the last chunk's frames: the stream's state is freed
        await self._report_failure(pending, detail)

    async def _report_failure(self, pending: list[int], detail: str = "") -> None:
        if self.eviction is not None:
            await self.ep.send_error(wire.SESSION_EVICTED, f"session state was dropped ({self.eviction}); "
                                     "reset or close the session", pending_event_ids=pending)
        else:
            await self.ep.send_error(wire.SESSION_FAILED, f"tick failed: {detail}; reset or close the session",
                                     pending_event_ids=pending)

    # ------------------------------------------------------------------ ticks
    def busy(self) -> bool:
        """A tick of this session is in the engine: not idle, however long it takes. Ticks
        done there whose chunks wait for the client to read do not count: a client that
        stopped reading is idle, whatever the driver queued before it stalled."""
        return any(not queued.future.done() for queued in self._ahead)

    def accepted(self, event_id: int, status: AcceptResult) -> None:
        """The reader accepted an event: time it (a duplicate is not new) and look for a tick."""
        if status is AcceptResult.ACCEPTED:
            self.events.accepted(event_id)
        self.wake.set()

    def _sent(self, request: TickRequest) -> None:
        """Frames of ``request``'s chunk went out: the client is not idle, and the events the
        chunk applied have been seen."""
        self.ep.idle.touch()
        self.events.shown(request.applied_event_ids)

    def start(self) -> None:
        """Drive a session that starts (create) or starts over (reset): events accepted
        before are not coming (a reset dropped them)."""
        self.events.restart()
        self._stopping = False
        self._task = asyncio.create_task(self._drive())

    async def stop(self, stall_timeout: float | None = GOODBYE_TIMEOUT_S) -> None:
        """Stop queueing ticks and wait for the driver: its running tick is committed and
        sent, however long the tick takes. But a chunk send that the client leaves untaken
        (it stopped reading) for ``stall_timeout`` drops the client: it would hold the
        close, and with it the session, for as long as the client liked."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        self.wake.set()
        if self.ep.session is not None:
            # Drop the session's queued tick (the control lane runs ahead of it); a
            # tick already running finishes and is committed and sent as usual.
            self.ep.engine.post_cancel(self.ep.model, self.ep.session.session_id)
        watch = None if stall_timeout is None else StallWatch(self.ep.conn, stall_timeout, self.ep.session)
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this task is being cancelled (shutdown), not only the driver
        except Exception:  # noqa: BLE001 - a bug (the driver fails its session itself): the stop goes on
            log.exception("session %s: the tick driver ended with an error",
                          self.ep.session.session_id if self.ep.session is not None else "-")
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
        session, adapter = self.ep.session, self.ep.adapter
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
                    self.wake.clear()
                    await self.wake.wait()
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
                    await self.fail(session, str(exc), str(exc), sending)
                    return
                ahead.popleft()
                tick_ms = (time.perf_counter() - queued.started) * 1000.0
                try:
                    # The base checked the chunk's identities (its one check): commit from it.
                    committed = session.complete_tick(chunk.request_id)
                except SessionError as exc:
                    if queued.stream is not None:
                        await queued.stream.finish()
                    await finish_send(sending)
                    await self.ep.send_error(exc.code.value, exc.message)
                    return
                self.credits -= 1
                # The next tick goes to the engine before this chunk's bookkeeping and send,
                # which then run while it computes (see "Next tick first"). A streamed tick's
                # next one needs this chunk's send task: it waits for the top of the loop.
                unstarted = self._fill(session, adapter, sending) if queued.stream is None else None
                if self.ep.entry is not None:
                    self.ep.entry.ticked(committed.chunk_index)
                self.ep.idle.touch()  # idleness counts from the tick's end (its chunk is sent next)
                await finish_send(sending)  # chunk N-1 is out before chunk N starts
                # The commit goes out after the streamed frames (_send_chunk finishes the stream).
                sending = self.sending = asyncio.create_task(
                    self._send_chunk(committed, chunk, tick_ms, queued.stream))
                if unstarted is not None:  # told after the chunk committed before it
                    await self._fail_unstarted(session, unstarted, sending)
                    return
        except Exception as exc:  # noqa: BLE001 - a bug here must not leave the session behind its client
            log.error("session %s: the tick driver failed: %r", session.session_id, exc, exc_info=True)
            if sending is not None:
                await asyncio.wait({sending})  # the chunk being sent goes first, whatever became of it
            await self.fail(session, f"tick driver failed: {exc!r}", f"{type(exc).__name__}: {exc}")
        finally:
            await finish_send(sending)
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
        await self.fail(session, f"tick could not start: {detail}", detail, sending)

    def _depth(self, session: Session) -> int:
        """Ticks to keep queued now: the session's most, or ``ticks_in_flight_alone`` while it is
        the server's only world session (``--ticks-in-flight auto``; read at every tick)."""
        if self.ep.ticks_in_flight_alone is not None and len(self.ep.manager) <= 1:
            return max(1, min(self.ep.ticks_in_flight_alone, session.max_in_flight))
        return session.max_in_flight

    def _queue_tick(self, session: Session, adapter: WorldAdapter, sending: asyncio.Task | None) -> "_Queued":
        """Begin the session's next tick and hand it to the engine; ``_NotStarted`` if anything
        failed on the way (a reducer's ``prepare``, which fails the session in ``begin_tick``;
        the model's ``tick``; the hand-over itself): the caller fails the session."""
        stream: FrameStream | None = None
        try:
            request = session.begin_tick()
            started = time.perf_counter()
            # The format travels on the tick: the server may encode its CUDA jpeg frames there.
            work = adapter.tick(request, self.ep.seed, self.ep.options, format=self.ep.format)
            if self.ep.image is not None and request.chunk_index == 0:
                work = dataclasses.replace(work, image=self.ep.image)
            # Streaming sessions have one tick in flight (create): ``sending`` is the chunk before.
            if self.ep.stream_frames:
                stream = FrameStream(self.ep.conn, request, self.ep.format, adapter.geometry, self.ep.frames,
                                     after=sending, taken=functools.partial(self._sent, request))
                work = dataclasses.replace(work, frame_sink=stream.sink)
            try:
                future = self.ep.engine.submit_future(self.ep.model, work, session_id=session.session_id)
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
        # Encoded in the tick on the device (WorldChunk.encoded) or here off the loop, both by
        # the app's encoder (realtime/media.py); chunk N+1's send starts only after this
        # one's, so chunks stay in order. A streamed chunk's frames go first.
        frames = chunk.frames
        try:
            streamed = await stream.finish() if stream is not None else None
        except asyncio.CancelledError:
            if stream is not None:  # an idle close cancels the send; the pump must not outlive it
                stream.cancel()
            raise
        # While the engine prepares the next batch this send would take the GIL from it.
        await self.ep.engine.launch_gate.wait()
        if stream is not None:
            payloads = []
        elif chunk.encoded is not None:
            payloads = list(chunk.encoded)
        else:
            payloads = await self.ep.frames.encode(frames, request.chunk_index)
        header = wire.chunk(
            request.session_id, request.request_id, request.chunk_index, list(request.applied_event_ids),
            frames=len(payloads), format=self.ep.format, height=frames.shape[1], width=frames.shape[2], tick_ms=tick_ms,
            streamed=streamed, info=chunk.info,
        )
        # One locked send: no other message comes between a chunk and its frames.
        if await self.ep.conn.send(wire.encode(header), *payloads):
            self._sent(request)  # the client took a chunk: it is not idle


class StallWatch:
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
