"""The Session: one client's event queue, tick transaction and lifecycle.

A tick is a transaction (see DESIGN.md, "Tick lifecycle")::

    accept_event ... accept_event      events wait in the pending queue
    begin_tick   -> TickRequest        snapshot: pending events, prompt, prepared controls
        (engine runs the model; its kind's base checks that the result echoes the
        snapshot's identities; more events may arrive and wait for the next tick)
    complete_tick(request_id)          that checked result: commit everything
      or fail_tick(reason)             commit nothing, FAILED until reset or close

With ``max_in_flight`` > 1 a tick may begin on top of ticks still in flight (the
server keeps the engine's queue full; see ``realtime/endpoints/world.py``): its snapshot
takes the events no earlier tick took, and its controls are prepared from the
state the earlier ticks will commit. Ticks complete in the order they began; a
failure abandons every tick in flight::

    begin_tick -> t0    begin_tick -> t1 (on top of t0)
    complete_tick(t0.request_id)   complete_tick(t1.request_id)   chunk indexes 0, 1

States and the transitions allowed between them::

    ACTIVE --fail--> FAILED --reset--> ACTIVE        (reset also ACTIVE -> ACTIVE)
    ACTIVE | FAILED | CLEANUP_FAILED --begin_close--> CLOSING
    CLOSING --finish_close(ok)--> CLOSED | CLEANUP_FAILED

A Session is not thread-safe: one owner (the asyncio loop) calls it; the engine
thread only ever sees the immutable TickRequest.
"""

from __future__ import annotations

import collections
import enum
import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType

from sessions.applied import AppliedIds
from protocols.echo import shown
from sessions.errors import ErrorCode, SessionError
from sessions.events import SessionEvent, check_prompt
from sessions.frozen import FrozenDict
from sessions.reducers import ControlReducer, Prepared
from sessions.ticks import TickRequest

log = logging.getLogger(__name__)


class SessionStateError(RuntimeError):
    """Server code used a session wrongly (an illegal transition, completing a tick
    that was never begun). A bug, not something to tell the client."""


class SessionState(enum.Enum):
    ACTIVE = "active"
    FAILED = "failed"
    CLOSING = "closing"
    CLOSED = "closed"
    CLEANUP_FAILED = "cleanup_failed"

    def can_become(self, other: SessionState) -> bool:
        return other in _TRANSITIONS[self]


_TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    SessionState.ACTIVE: frozenset(
        {SessionState.ACTIVE, SessionState.FAILED, SessionState.CLOSING}
    ),
    SessionState.FAILED: frozenset({SessionState.ACTIVE, SessionState.CLOSING}),
    SessionState.CLOSING: frozenset({SessionState.CLOSED, SessionState.CLEANUP_FAILED}),
    SessionState.CLOSED: frozenset(),
    SessionState.CLEANUP_FAILED: frozenset({SessionState.CLOSING}),
}

_CLOSED_STATES = frozenset(
    {SessionState.CLOSING, SessionState.CLOSED, SessionState.CLEANUP_FAILED}
)


class AcceptResult(str, enum.Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"


class Session:
    """One session's events, ticks and lifecycle.

    ``reducers`` maps each track to a reducer instance owned by this session alone.
    ``drop_state`` is called (at most once per begun worker state) when the worker
    state a tick created must be dropped: on tick failure, reset, and close.
    """

    def __init__(
        self,
        session_id: str,
        *,
        reducers: Mapping[str, ControlReducer],
        prompt: str | None = None,
        max_pending: int = 64,
        drop_state: Callable[[], None] | None = None,
        max_in_flight: int = 1,
    ) -> None:
        if type(session_id) is not str or not session_id:
            raise ValueError(f"session_id must be a non-empty str, got {session_id!r}")
        for track, reducer in reducers.items():
            if reducer.track != track:
                raise ValueError(f"reducer for track {track!r} declares track {reducer.track!r}")
        if type(max_pending) is not int or max_pending < 1:
            raise ValueError(f"max_pending must be a positive int, got {max_pending!r}")
        if type(max_in_flight) is not int or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be a positive int, got {max_in_flight!r}")
        check_prompt(prompt)
        self._session_id = session_id
        self._reducers: dict[str, ControlReducer] = dict(reducers)
        self._initial_prompt = prompt
        self._prompt = prompt
        self._max_pending = max_pending
        self._max_in_flight = max_in_flight
        self._drop_state = drop_state
        self._state = SessionState.ACTIVE
        self._chunk_index = 0
        # Every accepted, uncommitted event, in-flight ones included, by id.
        self._pending: dict[int, SessionEvent] = {}
        self._applied = AppliedIds()
        self._floor = -1  # highest committed (applied) event id
        # Ticks begun and not yet completed, oldest first, each with its prepared controls.
        self._flights: collections.deque[tuple[TickRequest, dict[str, Prepared]]] = collections.deque()
        self._ticks_begun = 0  # never reset: request ids stay unique for the object
        self._worker_live = False
        self._failure: str | None = None

    # -- read-only views -------------------------------------------------------

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def chunk_index(self) -> int:
        """Index of the next chunk to commit (= number committed since the last reset)."""
        return self._chunk_index

    @property
    def event_floor(self) -> int:
        """Highest event id applied or in flight; -1 before any. Ids at or below it
        are refused as stale (or answered duplicate if they were applied)."""
        floor = self._floor
        for request, _ in self._flights:
            if request.applied_event_ids:
                floor = max(floor, request.applied_event_ids[-1])
        return floor

    @property
    def in_flight(self) -> TickRequest | None:
        """The oldest tick in flight (the next to complete), or None."""
        return self._flights[0][0] if self._flights else None

    @property
    def ticks_in_flight(self) -> int:
        return len(self._flights)

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    @property
    def pending_event_ids(self) -> tuple[int, ...]:
        """Accepted, uncommitted event ids, ascending; includes those in flight."""
        return tuple(sorted(self._pending))

    @property
    def waiting_event_ids(self) -> tuple[int, ...]:
        """Pending ids in no in-flight snapshot: they go into the next tick."""
        taken = self._taken()
        return tuple(i for i in sorted(self._pending) if i not in taken)

    def _taken(self) -> set[int]:
        return {eid for request, _ in self._flights for eid in request.applied_event_ids}

    @property
    def prompt(self) -> str | None:
        """The committed prompt."""
        return self._prompt

    @property
    def initial_prompt(self) -> str | None:
        return self._initial_prompt

    @property
    def max_pending(self) -> int:
        return self._max_pending

    @property
    def reducers(self) -> Mapping[str, ControlReducer]:
        return MappingProxyType(self._reducers)

    @property
    def failure(self) -> str | None:
        """Why the session failed, while it is FAILED (or closing after a failure)."""
        return self._failure

    @property
    def worker_live(self) -> bool:
        """True from a begun tick until the drop hook has run."""
        return self._worker_live

    def __repr__(self) -> str:
        return (
            f"Session({self._session_id!r}, state={self._state.name}, "
            f"chunk_index={self._chunk_index}, floor={self.event_floor}, "
            f"pending={len(self._pending)}, in_flight={len(self._flights)})"
        )

    # -- events ----------------------------------------------------------------

    def accept_event(self, event: SessionEvent) -> AcceptResult:
        """Queue ``event`` for the next tick that begins.

        Answers DUPLICATE for an id already pending, in flight or applied. Raises
        SessionError (with ``event_id``) for a failed or closed session, a stale id,
        an invalid control, or a full queue; a refused event changes nothing.
        """
        if not isinstance(event, SessionEvent):
            raise TypeError(f"accept_event takes a SessionEvent, got {type(event).__name__}")
        eid = event.event_id
        self._check_open(eid)
        if eid in self._pending or eid in self._applied:
            log.debug("session %s: event %d is a duplicate", self._session_id, eid)
            return AcceptResult.DUPLICATE
        floor = self.event_floor
        if eid <= floor:
            raise SessionError(
                ErrorCode.STALE_EVENT,
                f"event {eid} is at or below the event floor {floor}; "
                f"event ids must be above {floor}",
                event_id=eid,
            )
        for i, control in enumerate(event.controls):
            reducer = self._reducers.get(control.track)
            if reducer is None:
                raise SessionError(
                    ErrorCode.BAD_REQUEST,
                    f"controls[{i}]: unknown track {shown(control.track)}; "
                    f"tracks are {', '.join(sorted(self._reducers)) or '(none)'}",
                    event_id=eid,
                )
            if control.schema != reducer.schema:
                raise SessionError(
                    ErrorCode.BAD_REQUEST,
                    f"controls[{i}]: track {control.track!r} takes schema "
                    f"{reducer.schema!r}, got {shown(control.schema)}",
                    event_id=eid,
                )
            try:
                reducer.validate(control.data)
            except SessionError as exc:
                raise SessionError(
                    exc.code, f"controls[{i}].data: {exc.message}", event_id=eid
                ) from None
        if len(self._pending) >= self._max_pending:
            raise SessionError(
                ErrorCode.QUEUE_FULL,
                f"{len(self._pending)} events pending, at most {self._max_pending}",
                event_id=eid,
            )
        for i, control in enumerate(event.controls):
            queued = [c.data for c in self._pending_controls(control.track)]
            try:
                self._reducers[control.track].admit([*queued, control.data])
            except SessionError as exc:
                raise SessionError(
                    exc.code, f"controls[{i}]: {exc.message}", event_id=eid
                ) from None
        self._pending[eid] = event
        log.debug(
            "session %s: accepted event %d (%d pending)", self._session_id, eid, len(self._pending)
        )
        return AcceptResult.ACCEPTED

    def _check_open(self, eid: int | None) -> None:
        if self._state is SessionState.FAILED:
            raise SessionError(
                ErrorCode.SESSION_FAILED,
                f"session {self._session_id} failed ({self._failure}); reset or close it",
                event_id=eid,
            )
        if self._state in _CLOSED_STATES:
            raise SessionError(
                ErrorCode.SESSION_CLOSED,
                f"session {self._session_id} is {self._state.value}",
                event_id=eid,
            )

    def _pending_controls(self, track: str) -> list:
        return [
            control
            for eid in sorted(self._pending)
            for control in self._pending[eid].controls
            if control.track == track
        ]

    # -- ticks -----------------------------------------------------------------

    def begin_tick(self) -> TickRequest:
        """Snapshot every pending event no tick in flight took into the next tick. Needs
        ACTIVE and fewer than ``max_in_flight`` ticks in flight (a SessionStateError
        otherwise: the caller's bug)."""
        if self._state is not SessionState.ACTIVE:
            raise SessionStateError(
                f"session {self._session_id}: begin_tick in state {self._state.name}"
            )
        if len(self._flights) >= self._max_in_flight:
            raise SessionStateError(
                f"session {self._session_id}: begin_tick while {self._flights[-1][0].request_id} "
                f"is in flight ({len(self._flights)} of at most {self._max_in_flight})"
            )
        taken = self._taken()
        events = [self._pending[eid] for eid in sorted(self._pending) if eid not in taken]
        prompt = self._flights[-1][0].prompt if self._flights else self._prompt
        for event in events:
            if event.prompt is not None:
                prompt = event.prompt
        prepared: dict[str, Prepared] = {}
        for track, reducer in self._reducers.items():
            updates = [c.data for e in events for c in e.controls if c.track == track]
            try:
                # Every track, even without updates: held keys carry on.
                prepared[track] = self._prepare_on_flights(track, reducer, updates)
            except Exception as exc:
                reason = f"reducer {track!r} prepare failed: {exc!r}"
                self.fail_tick(reason)
                raise SessionError(ErrorCode.SESSION_FAILED, reason) from exc
        request = TickRequest(
            session_id=self._session_id,
            request_id=f"{self._session_id}:{self._ticks_begun}",
            chunk_index=self._chunk_index + len(self._flights),
            applied_event_ids=tuple(e.event_id for e in events),
            prompt=prompt,
            controls=FrozenDict({track: p.value for track, p in prepared.items()}),
        )
        self._ticks_begun += 1
        self._flights.append((request, prepared))
        self._worker_live = True
        log.debug(
            "session %s: begin tick %s chunk %d events %s",
            self._session_id,
            request.request_id,
            request.chunk_index,
            request.applied_event_ids,
        )
        return request

    def _prepare_on_flights(self, track: str, reducer: ControlReducer, updates: list) -> Prepared:
        """``reducer.prepare(updates)`` from the state the ticks in flight will leave: their
        prepared states committed for the call, the committed state put back after it."""
        if not self._flights:
            return reducer.prepare(updates)
        saved = reducer.save()
        try:
            for _, prepared in self._flights:
                reducer.commit(prepared[track])
            return reducer.prepare(updates)
        finally:
            reducer.restore(saved)

    def complete_tick(self, request_id: str) -> TickRequest:
        """Commit the oldest in-flight tick, whose checked result came back for
        ``request_id``; returns its snapshot.

        The result's four identities were checked once, where it was made: the kind's
        base, on the engine thread, before the engine kept the model's state for the tick
        (``models/world/base.py``, ``check_chunk``). The session commits from that result
        and does not compare them again; ``request_id`` only names the tick it answers.
        Results come back in the order their ticks began, so any other id is a server bug
        (``SessionStateError``, nothing changes). A reducer commit failure commits
        nothing, fails the session (as :meth:`fail_tick`) and raises
        ``SessionError(SESSION_FAILED)``.
        """
        if not self._flights:
            # A result for a tick already abandoned by a failure or a close.
            self._check_open(None)
            raise SessionStateError(f"session {self._session_id}: no tick in flight")
        request, prepared = self._flights[0]
        if request_id != request.request_id:
            raise SessionStateError(f"session {self._session_id}: a result for {request_id!r} while the oldest "
                                    f"tick in flight is {request.request_id}")
        # All or nothing across reducers: save each before its commit, and put back
        # every saved one (the failing one too, it may be half-written) on failure.
        saved: dict[str, object] = {}
        for track, reducer in self._reducers.items():
            try:
                saved[track] = reducer.save()
                reducer.commit(prepared[track])
            except Exception as exc:
                for done, state in saved.items():
                    try:
                        self._reducers[done].restore(state)
                    except Exception:
                        log.exception(
                            "session %s: restoring reducer %r failed", self._session_id, done
                        )
                reason = f"reducer {track!r} commit failed: {exc!r}"
                self.fail_tick(reason)
                raise SessionError(ErrorCode.SESSION_FAILED, reason) from exc
        for eid in request.applied_event_ids:
            del self._pending[eid]
            self._applied.add(eid)
        if request.applied_event_ids:
            self._floor = request.applied_event_ids[-1]
        self._prompt = request.prompt
        self._chunk_index += 1
        self._flights.popleft()
        log.debug(
            "session %s: committed %s chunk %d floor %d",
            self._session_id,
            request.request_id,
            request.chunk_index,
            self._floor,
        )
        return request

    def fail_tick(self, reason: str, *, asked: bool = False) -> None:
        """ACTIVE -> FAILED: drop every in-flight tick uncommitted and drop worker
        state; chunk index and pending queue stay as they were. Failing a session
        that is already failed or closing changes nothing (a late engine report).
        ``asked``: the client's own reset abandons the tick, no fault (logged at INFO)."""
        if self._state is not SessionState.ACTIVE:
            log.info(
                "session %s: tick failure ignored in state %s: %s",
                self._session_id,
                self._state.name,
                reason,
            )
            return
        self._transition(SessionState.FAILED)
        abandoned = ", ".join(r.request_id for r, _ in self._flights) or None
        self._flights.clear()
        self._failure = reason
        log.log(
            logging.INFO if asked else logging.WARNING,
            "session %s: failed at chunk %d (request %s): %s",
            self._session_id,
            self._chunk_index,
            abandoned,
            reason,
        )
        self._drop_worker_state()

    # -- reset and close -------------------------------------------------------

    def reset(self) -> tuple[int, ...]:
        """Back to chunk 0 with the initial prompt and fresh reducers; returns the
        dropped pending event ids (never applied). Event floor and duplicate memory
        are kept, so old ids stay refused. Needs ACTIVE without a tick in flight
        (else BUSY) or FAILED; a closing or closed session answers SESSION_CLOSED."""
        if self._state in _CLOSED_STATES:
            raise SessionError(
                ErrorCode.SESSION_CLOSED, f"session {self._session_id} is {self._state.value}"
            )
        if self._flights:
            raise SessionError(
                ErrorCode.BUSY,
                f"session {self._session_id}: tick {self._flights[0][0].request_id} is in flight",
            )
        self._transition(SessionState.ACTIVE)
        dropped = tuple(sorted(self._pending))
        self._pending.clear()
        self._chunk_index = 0
        self._prompt = self._initial_prompt
        self._failure = None
        for reducer in self._reducers.values():
            reducer.reset()
        self._drop_worker_state()
        log.info(
            "session %s: reset; dropped events %s; floor %d",
            self._session_id,
            dropped,
            self._floor,
        )
        return dropped

    def begin_close(self) -> None:
        """ACTIVE/FAILED/CLEANUP_FAILED -> CLOSING; the ticks in flight are abandoned."""
        self._transition(SessionState.CLOSING)
        if self._flights:
            log.info(
                "session %s: close abandons ticks %s",
                self._session_id,
                ", ".join(r.request_id for r, _ in self._flights),
            )
            self._flights.clear()

    def finish_close(self, ok: bool) -> None:
        """CLOSING -> CLOSED (releasing live worker state) or, if cleanup failed,
        CLEANUP_FAILED: a tombstone until a close retry succeeds."""
        if self._state is not SessionState.CLOSING:
            raise SessionStateError(
                f"session {self._session_id}: finish_close in state {self._state.name}"
            )
        if ok:
            self._transition(SessionState.CLOSED)
            self._drop_worker_state()
            log.info("session %s: closed", self._session_id)
        else:
            self._transition(SessionState.CLEANUP_FAILED)
            log.warning("session %s: cleanup failed; kept as a tombstone", self._session_id)

    # -- internals -------------------------------------------------------------

    def _transition(self, new: SessionState) -> None:
        if not self._state.can_become(new):
            raise SessionStateError(
                f"session {self._session_id}: illegal transition "
                f"{self._state.name} -> {new.name}"
            )
        self._state = new

    def _drop_worker_state(self) -> None:
        # Cleared before the call: exactly once even if the hook raises.
        if not self._worker_live:
            return
        self._worker_live = False
        if self._drop_state is None:
            return
        try:
            self._drop_state()
        except Exception:
            log.exception("session %s: drop hook failed", self._session_id)
