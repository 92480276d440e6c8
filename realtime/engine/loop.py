"""The engine loop: one thread that owns every model, tensor and KV pool (fast
policies may run inline on the event loop while it idles: "Inline forwards").

asyncio code never touches a tensor. It hands work to the engine with
``await engine.submit(...)`` (the tick lane) or ``await engine.control(...)``
(the control lane), ``await engine.release(model, sid)`` / ``reset(model, sid)``
for any adapter, and gets the answer through a future
that the engine resolves with ``loop.call_soon_threadsafe``.

One step of the loop::

    controls first ──> pick the model whose oldest tick waited longest
                       (unless a deadline says otherwise, below)
                   ──> take up to adapter.max_batch ticks of that model
                       (waiting, at most batch_wait_ms after that model's last
                       batch ended, for the sessions of that batch that are in
                       a loop to return)
                   ──> adapter.run_batch(works) ──> validate each result
                   ──> adapter.end_tick(session, committed) ──> resolve futures

Deadlines: a tick may say by when its result is needed (``submit(..., deadline=)``, a
``time.perf_counter`` time; the speech endpoint's: when the listener's audio runs out, or
now for a first window). Before a batch of the model picked oldest-first, the engine
looks at the other models' oldest ticks: one whose deadline would pass if it waited for
that batch (its slack, deadline - now - its model's last forward time, is below the
picked model's last forward time) goes first, the least slack first. A tick that can
wait, waits: a voice far ahead of its listener leaves a world its turn, and a world
tick of a CPU server (100-200 ms) no longer sits between every window of a sentence.
No tick is passed over once it has waited ``DEADLINE_DEFER_MAX_S``: deadlines reorder
the queue, they cannot starve a model (voices that cannot keep up with their listeners
would otherwise always be due).
A deadline is seen only once its tick is queued, and a speaker queues its next window
a moment after the last one's result: so after a batch with a tick that was due within
a forward of the slowest model, the engine waits for that batch's sessions (the returner
wait below, at most that model's batch wait after it ended) before it starts another
model's batch. (Waiting after every batch with deadlines cost a voice beside a world
~20 ms of first audio on 2 CPU cores, bench/results/tts_mixed_cpu.json.)

Inline forwards: a model whose last ``INLINE_WINDOW`` forwards each took at most
its ``inline_forward_s`` (a policy answering in microseconds) is run by ``run_now``
on the event loop, when nothing is queued for it, no control is pending and the
engine thread is not running anything: the hand-off to the engine thread and back
would cost more than the forward (two thread wake-ups and ~0.1 ms of CPU).
``run_now`` is the one inline path: it makes no job, future or batch list unless the
work fails (a queued tick run inline, the path before it, added 24 us a call around
an instant policy's forward in memory, bench/results/openpi_app_profile_devbox.json;
the fleet with it: bench/results/openpi_fleet_lean_devbox.json). ``submit`` always
queues. Whoever runs a model holds ``_owner``, so one thread at a time still owns
every model; a forward over the limit sends the model back to the engine thread at
once. Such a model is never waited for returners either: merging forwards that
cost microseconds saves nothing.

Held results: a model that announces its launches (``ModelAdapter.launched``)
gets its batch's results resolved once the *next* batch's device work is queued,
not as soon as the batch ends. Sessions whose next tick is already queued (a world
session with ticks in flight, ``Session.max_in_flight``) then wake the event loop
while the device computes, and the loop's Python does not take the GIL from the
engine while it prepares the next batch::

    engine:  [prep N+1][launch]--- device N+1 ---[sync][post]   [prep N+2][launch] ...
    loop:                  results N: commit, queue N+2, send chunk N

Nothing waits on a held result: they are resolved before the engine waits (idle, or for
returners), before controls and other models' batches, and when a batch ends at the latest.
Only a model whose last batch queued its device work within ``LAUNCH_HOLD_MAX_S`` of its start
is held (a model that computes inside ``run_batch`` and says so at the end would hold its
results for a whole forward).

GIL hand-off: the one session of the engine's last batch coming back (a world
session alone, one robot) hands it the GIL at once (``time.sleep(0)``). Otherwise the
woken engine would wait for the loop's next Python (the send, the next message) or
for the switch interval before it could prepare the batch. Nothing else hands over:
a batch that more sessions could still join would be taken smaller, and after a
returner wait of several sessions the engine's preparation would contend with the
loop's work for them (bench/results/world_handoff_ab2_h200.json: 8 sessions at one
tick in flight, 0.80-0.86x of bare with that hand-off, 0.84-0.87x without).

A batch that raises is re-run one work at a time, so one bad session fails
alone. A failed tick of a model with ``chained_ticks`` (a world) also drops the
session's ticks queued behind it: they would run on state that was never committed.
A fatal error (``models.base.is_fatal``: an ``EngineDeadError`` or a CUDA
error, recognised by type) marks the engine dead:
``healthy`` turns False, every queued and future call fails fast.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, TypeVar

from models.base import EngineDeadError, ModelAdapter, ModelError, failure_code, is_fatal
from realtime.engine.overlap import LAUNCH_HOLD_MAX_S, LaunchGate
from realtime.engine.stats import ModelStats

log = logging.getLogger(__name__)

T = TypeVar("T")

# The longest a tick waits while ticks with deadlines go first ("Deadlines"): an older
# one that has waited this long runs next whatever is due.
DEADLINE_DEFER_MAX_S = 0.5

# How many of a model's last forwards must each be within its ``inline_forward_s``
# before ``run_now`` runs it inline (one slow forward and it is back on the engine thread).
INLINE_WINDOW = 8

# Sessions per model whose last forward's end the engine keeps (the returner wait): a
# session released without ``release`` reaching the engine is forgotten, oldest first.
MAX_TRACKED_SESSIONS = 65_536

try:
    import resource

    _RUSAGE_THREAD: int | None = resource.RUSAGE_THREAD  # type: ignore[attr-defined]
except (ImportError, AttributeError):  # not Linux
    _RUSAGE_THREAD = None


class _NotRun:
    def __repr__(self) -> str:
        return "NOT_RUN"


# What ``Engine.run_now`` returns when the work was not run (it must be queued instead).
NOT_RUN: Any = _NotRun()


class EngineStopped(Exception):
    """The engine is stopped or dead; nothing more runs."""


class TickCancelled(Exception):
    """A queued tick was dropped by a control-lane purge (reset, close)."""


@dataclass
class _Job:
    model: str
    work: Any
    session_id: str | None
    validate: Callable[[Any], None] | None
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float = field(default_factory=time.perf_counter)
    deadline: float | None = None  # perf_counter time the result is needed by (see "Deadlines")
    quick: bool = True  # its session came back quickly after its last forward (see _take_batch)


@dataclass
class _Control:
    fn: Callable[[], Any]
    future: asyncio.Future | None
    loop: asyncio.AbstractEventLoop | None


@dataclass
class EngineStats:
    """Counters read by /metrics (written only by the engine thread)."""

    batches: int = 0
    works: int = 0
    inline_works: int = 0  # of works, those run by ``run_now`` on the event loop (see "Inline forwards")
    failed_works: int = 0
    controls: int = 0
    busy_seconds: float = 0.0
    batch_sizes: collections.Counter = field(default_factory=collections.Counter)
    models: dict[str, ModelStats] = field(default_factory=dict)  # per model, made at engine start


class Engine:
    """Runs every model on one thread and batches work across sessions."""

    def __init__(
        self,
        adapters: Mapping[str, ModelAdapter],
        *,
        batch_wait_ms: float = 20.0,
        model_wait_ms: Mapping[str, float] | None = None,
        gil_hand_off: bool = True,
        switch_interval_s: float = 0.0005,
    ) -> None:
        self._adapters = dict(adapters)
        # Whether a lone returner's submit hands the engine the GIL (see "GIL hand-off").
        self._gil_hand_off = gil_hand_off
        # The interpreter's GIL switch interval set at start (0: Python's own; see
        # EngineConfig.switch_interval_s). The engine thread and the event loop share one
        # GIL: a thread woken by the other (a submit waking the engine, a batch's results
        # waking the loop) waits until the holder drops it, up to one interval.
        self._switch_interval_s = switch_interval_s
        # Per model: how long after a batch ends the engine waits for that batch's
        # sessions to queue their next tick (see _take_batch).
        self._wait = {n: (model_wait_ms or {}).get(n, batch_wait_ms) / 1000.0 for n in self._adapters}
        self._returners: dict[str, frozenset[str]] = {n: frozenset() for n in self._adapters}
        # Per model and session: when its last forward ended (inf while one runs), oldest
        # first, at most MAX_TRACKED_SESSIONS; a release forgets the session.
        self._ended_at: dict[str, dict[str, float]] = {n: {} for n in self._adapters}
        self._free_since: dict[str, float] = {n: 0.0 for n in self._adapters}
        # While _take_batch waits for returners: the ones not queued yet. A submit
        # wakes the engine only when it completes them (one wake-up per round, not
        # one per session: each costs the event loop the GIL on a busy host).
        self._awaited: set[str] | None = None
        self._ticks: dict[str, collections.deque[_Job]] = {n: collections.deque() for n in self._adapters}
        self._controls: collections.deque[_Control] = collections.deque()
        self._cv = threading.Condition()
        # Held by whoever runs a model or a control: the engine thread, or run_now
        # running a fast model inline (never both; see "Inline forwards").
        self._owner = threading.Lock()
        self._recent: dict[str, collections.deque[float]] = {
            n: collections.deque(maxlen=INLINE_WINDOW) for n in self._adapters}
        self._fast: dict[str, bool] = {n: False for n in self._adapters}  # runs inline
        self._unbatched: dict[str, bool] = {n: False for n in self._adapters}  # no returner wait
        self._stopping = False
        self._dead: str | None = None
        self._thread: threading.Thread | None = None
        self.stats = EngineStats(models={n: ModelStats() for n in self._adapters})
        self.started_at = time.perf_counter()
        # Called once, on the engine thread, when the engine dies (the app tells every
        # live session at once: an idle one has nothing queued that would fail).
        self.on_dead: Callable[[str], None] | None = None
        # Closed while a batch is prepared, open once its device work is queued: the
        # loop's chunk sends wait for it (realtime/engine/overlap.py).
        # Only for a model that has said it launches device work (ModelAdapter.launched):
        # the others compute inside run_batch, and holding sends would only delay them.
        self.launch_gate = LaunchGate()
        # Per model: seconds from its last launching batch's start to its launch; inf until
        # it first launches (then it launches, and the gate closes for its batches).
        self._launch_s: dict[str, float] = {n: math.inf for n in self._adapters}
        # Per model: seconds its last forward took (0 until one ran), for "Deadlines".
        self._forward_s: dict[str, float] = {n: 0.0 for n in self._adapters}
        # The model of the last batch if a tick of it was due soon (its returners are
        # waited for before another model's batch: "Deadlines").
        self._deadline_model: str | None = None
        self._batch_started = 0.0
        # A launching model's last batch's results, until the next launch (see "Held results").
        self._held: list[tuple[_Job, Any]] = []
        for name, adapter in self._adapters.items():
            adapter.set_launch_listener(lambda name=name: self._launched(name))

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self._switch_interval_s > 0:
            sys.setswitchinterval(self._switch_interval_s)
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()
        log.info("engine started with models %s", sorted(self._adapters))

    def stop(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        self._fail_all(EngineStopped("engine stopped"))
        log.info("engine stopped")

    @property
    def running(self) -> bool:
        """The engine thread is still alive (after ``stop``: still inside a forward)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def healthy(self) -> bool:
        return self._dead is None and not self._stopping

    @property
    def dead_reason(self) -> str | None:
        return self._dead

    def adapter(self, name: str) -> ModelAdapter:
        return self._adapters[name]

    @property
    def adapters(self) -> Mapping[str, ModelAdapter]:
        return self._adapters

    # ------------------------------------------------------------------ asyncio side
    async def submit(
        self,
        model: str,
        work: Any,
        *,
        session_id: str | None = None,
        validate: Callable[[Any], None] | None = None,
        deadline: float | None = None,
    ) -> Any:
        """Queue ``work`` on the tick lane of ``model`` and wait for its result.

        ``validate(result)`` runs on the engine thread before the tick counts as
        done; if it raises, the adapter is told the tick was not committed and the
        caller gets a ``ModelError``. With ``session_id`` the adapter's
        ``end_tick(session_id, committed)`` is called either way. ``deadline``: the
        ``time.perf_counter`` time the result is needed by (see "Deadlines").
        """
        return await self.submit_future(model, work, session_id=session_id, validate=validate, deadline=deadline)

    def submit_future(
        self,
        model: str,
        work: Any,
        *,
        session_id: str | None = None,
        validate: Callable[[Any], None] | None = None,
        deadline: float | None = None,
    ) -> asyncio.Future:
        """``submit`` as a future (call on the event loop); the engine thread resolves it.
        Cancelling the future drops the work if it has not started."""
        if model not in self._adapters:
            raise KeyError(model)
        self._raise_if_down()
        loop = asyncio.get_running_loop()
        job = _Job(model, work, session_id, validate, loop.create_future(), loop, deadline=deadline)
        job.quick = self._quick(model, session_id, job.enqueued)
        with self._cv:
            self._ticks[model].append(job)
            awaited = self._awaited
            if awaited is None:
                self._cv.notify()
                returners = self._returners[model]
                hand_off = len(returners) == 1 and session_id in returners
            else:
                awaited.discard(session_id)  # type: ignore[arg-type]
                hand_off = False
                if not awaited or len(self._ticks[model]) >= max(1, self._adapters[model].max_batch):
                    self._cv.notify()
        if hand_off and self._gil_hand_off:
            hand_off_gil()
        return job.future

    def run_now(self, model: str, work: Any, *, session_id: str | None = None) -> Any:
        """``work``'s result, computed here and now if ``model`` runs inline and the engine is
        idle for it (see "Inline forwards"), or ``NOT_RUN`` (nothing was done: call
        ``submit_future``). The outcome is the one awaiting ``submit_future`` gives (the
        result, or the ``ModelError`` / ``EngineDeadError`` it raises), the stats the same.
        No ``validate``: a caller with a postcondition uses ``submit_future``. Event loop only."""
        if not self._fast[model]:
            return NOT_RUN
        self._raise_if_down()
        queue = self._ticks[model]
        if self._controls or queue or not self._owner.acquire(blocking=False):
            return NOT_RUN
        try:
            # Checked again now that no one else can start: a tick queued or a control
            # posted meanwhile goes first, on the engine thread.
            if self._controls or queue or not self.healthy:
                return NOT_RUN
            self.stats.inline_works += 1
            return self._run_now(model, work, session_id)
        finally:
            self._owner.release()

    async def control(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the engine thread ahead of every queued tick."""
        self._raise_if_down()
        loop = asyncio.get_running_loop()
        item = _Control(fn, loop.create_future(), loop)
        with self._cv:
            self._controls.append(item)
            self._cv.notify()
        return await item.future

    def post_control(self, fn: Callable[[], Any]) -> None:
        """Like ``control`` but fire-and-forget; safe to call from any thread."""
        if self._stopping:
            return
        with self._cv:
            self._controls.append(_Control(fn, None, None))
            self._cv.notify()

    async def release(self, model: str, session_id: str) -> None:
        """Drop the session's queued ticks and every piece of its state in ``model``
        (control lane). Raises what the adapter's ``release`` raised."""
        await self.control(self._session_job(model, session_id, "release"))

    async def reset(self, model: str, session_id: str) -> None:
        """Drop the session's queued ticks and start it over in ``model`` (control lane)."""
        await self.control(self._session_job(model, session_id, "reset"))

    def post_release(self, model: str, session_id: str) -> None:
        """``release`` without waiting for it (a session's release hook, a disconnect)."""
        self.post_control(self._session_job(model, session_id, "release"))

    def post_cancel(self, model: str, session_id: str) -> None:
        """Drop the session's queued ticks, ahead of them (a tick already running finishes)."""
        self.post_control(lambda: self._purge(model, session_id))

    def _session_job(self, model: str, session_id: str, what: str) -> Callable[[], None]:
        adapter = self._adapters[model]

        def job() -> None:
            self._purge(model, session_id)
            if what == "release":  # gone: nobody waits for it
                self._forget(model, session_id)
            getattr(adapter, what)(session_id)

        return job

    def queued(self, model: str) -> int:
        return len(self._ticks[model])

    # ------------------------------------------------------------------ engine thread
    def _raise_if_down(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(self._dead)
        if self._stopping:
            raise EngineStopped("engine stopped")

    def _purge(self, model: str, session_id: str) -> None:
        queue = self._ticks[model]
        with self._cv:
            keep = [j for j in queue if j.session_id != session_id]
            dropped = [j for j in queue if j.session_id == session_id]
            queue.clear()
            queue.extend(keep)
        for job in dropped:
            _reject(job.loop, job.future, TickCancelled(f"tick of {session_id} cancelled"))

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and not self._controls and not any(self._ticks.values()):
                    self._flush()  # no batch will launch to release them
                    self._cv.wait()
                if self._stopping:
                    self._flush()
                    return
                controls = list(self._controls)
                self._controls.clear()
            with self._owner:
                if controls:
                    self._flush()  # results first, as they came
                for item in controls:
                    self._run_control(item)
                if self._dead is not None:
                    continue
                batch = self._take_batch()
                if batch:
                    if not self._holds(batch[0].model):
                        self._flush()  # a model that does not launch at once: no result waits for it
                    self._run_batch(batch)

    def _holds(self, model: str) -> bool:
        """Whether ``model``'s results wait for the next launch: its last batch queued its
        device work within ``LAUNCH_HOLD_MAX_S`` of its start (see "Held results")."""
        return self._launch_s[model] <= LAUNCH_HOLD_MAX_S

    def _flush(self) -> None:
        """Resolve the held results (see "Held results")."""
        if self._held:
            held, self._held = self._held, []
            _resolve_all(held)

    def _run_control(self, item: _Control) -> None:
        self.stats.controls += 1
        try:
            value = item.fn()
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            if is_fatal(exc):
                self._die(f"control job: {exc!r}")
                return
            log.warning("control job failed: %r", exc)
            if item.future is not None:
                _reject(item.loop, item.future, exc)
            return
        if item.future is not None:
            _resolve(item.loop, item.future, value)

    def _take_batch(self) -> list[_Job]:
        """Oldest-first across models, then wait for the model's returning sessions.

        Sessions in a loop (a world client holding credits, a robot calling again)
        queue their next tick a moment after their last batch ends. Waiting for
        those *returners*, and only for them, keeps a fleet in full batches::

            no wait:     [== 8 ==][== 8 ==][== 8 ==]      the fleet stays split
            returners:   [== 8 ==]w[=== 16 ===]w[=== 16 ===]

        Only sessions in a loop are waited for: a session is a returner when it was
        in the last batch and had queued that batch's tick within ``_quick_s`` of its
        previous forward's end (or while that forward ran, or it was its first). A
        robot that acts for a while between calls, or one of two robots driven in
        turn by one client, never makes the other wait; a released session is
        forgotten at once. A session that was not in the last batch never makes
        anyone wait, so a lone caller is served at once; the wait ends batch_wait_ms
        after the last batch at the latest (a returner may have stopped: out of
        credits, closed).
        """
        with self._cv:
            self._await_deadline_returners()
            ready = [(q[0].enqueued, name) for name, q in self._ticks.items() if q]
            if not ready:
                return []
            _, name = min(ready)
            name = self._due_first(name)
            queue = self._ticks[name]
            limit = max(1, self._adapters[name].max_batch)
            returners = self._returners[name]
            deadline = self._free_since[name] + self._wait[name]
            if len(queue) < limit and returners and not self._unbatched[name]:
                self._await_returners(set(returners).difference(j.session_id for j in queue), deadline,
                                      lambda: len(queue) < limit)
            if self._controls or self._stopping or not queue:
                return []  # serve controls first; the ticks stay queued
            batch: list[_Job] = []
            seen: set[str] = set()
            skipped: list[_Job] = []
            while queue and len(batch) < limit:
                job = queue.popleft()
                # One work per session per forward: a session's next tick needs this one's KV.
                if job.session_id is not None and job.session_id in seen:
                    skipped.append(job)
                    continue
                if job.future.cancelled():
                    continue
                if job.session_id is not None:
                    seen.add(job.session_id)
                batch.append(job)
            queue.extendleft(reversed(skipped))
            return batch

    def _await_deadline_returners(self) -> None:
        """After a batch with a tick due soon, wait (until that model's batch wait after it
        ended) for its sessions' next ticks while another model's ticks are queued: the next
        window's deadline can only win once it is queued. Under ``_cv``."""
        prev, self._deadline_model = self._deadline_model, None
        if prev is None or not any(q for name, q in self._ticks.items() if name != prev):
            return
        awaited = set(self._returners[prev]).difference(j.session_id for j in self._ticks[prev])
        self._await_returners(awaited, self._free_since[prev] + self._wait[prev], lambda: True)

    def _await_returners(self, awaited: set[str], deadline: float, room: Callable[[], bool]) -> None:
        """Wait until every session in ``awaited`` has queued a tick (``submit`` takes each out),
        ``room()`` turns False, a control arrives, the engine stops, or ``deadline``. Under ``_cv``."""
        if awaited:
            self._flush()  # the returners may wait for these: never hold them here
        self._awaited = awaited
        try:
            while awaited and room() and not self._controls and not self._stopping:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                self._cv.wait(remaining)
        finally:
            self._awaited = None

    def _due_first(self, picked: str) -> str:
        """``picked``, or the model whose oldest tick would miss its deadline waiting for a
        forward of ``picked`` (the least slack first; see "Deadlines"). Under ``_cv``."""
        now = time.perf_counter()
        if now - self._ticks[picked][0].enqueued >= DEADLINE_DEFER_MAX_S:
            return picked
        cost = self._forward_s[picked]
        best: tuple[float, str] | None = None
        for name, queue in self._ticks.items():
            if name == picked or not queue or queue[0].deadline is None:
                continue
            slack = queue[0].deadline - now - self._forward_s[name]
            if slack < cost and (best is None or slack < best[0]):
                best = (slack, name)
        return picked if best is None else best[1]

    def _run_batch(self, batch: list[_Job]) -> None:
        due = min((j.deadline for j in batch if j.deadline is not None), default=None)
        # Due within a forward of the slowest model: its next tick will likely be due too.
        if due is not None and due < time.perf_counter() + max(self._forward_s.values()):
            self._deadline_model = batch[0].model
        model = batch[0].model
        ended_at = self._ended_at[model]
        for job in batch:
            if job.session_id is not None:
                ended_at[job.session_id] = math.inf  # running: its next tick is quick
        try:
            self._forward(batch)
        finally:
            self._ended(model, [(j.session_id, j.quick) for j in batch])

    def _quick_s(self, model: str) -> float:
        """How soon after its forward a session must queue its next tick to be waited for:
        within the batch wait and half a forward. Two robots driven in turn by one client
        each come back a whole forward (the other's) after their own."""
        return min(self._wait[model], self._forward_s[model] / 2)

    def _quick(self, model: str, session_id: str | None, now: float) -> bool:
        """Whether ``session_id``'s tick queued at ``now`` came back quickly (see _take_batch);
        a first tick counts as quick, so a fleet's second round is batched too."""
        if session_id is None:
            return False
        ended = self._ended_at[model].get(session_id)
        return ended is None or now - ended < self._quick_s(model)

    def _ended(self, model: str, sessions: Sequence[tuple[str | None, bool]]) -> None:
        """``model``'s forward of ``sessions`` (id, quick) ended: the quick ones are the
        returners ``_take_batch`` waits for."""
        now = self._free_since[model] = time.perf_counter()
        ended_at = self._ended_at[model]
        returners = []
        for session_id, quick in sessions:
            if session_id is None:
                continue
            ended_at.pop(session_id, None)  # to the end: the dict stays oldest first
            ended_at[session_id] = now
            if quick:
                returners.append(session_id)
        while len(ended_at) > MAX_TRACKED_SESSIONS:
            del ended_at[next(iter(ended_at))]
        self._returners[model] = frozenset(returners)

    def _forget(self, model: str, session_id: str) -> None:
        """A released session: no longer a returner, its forward times dropped."""
        self._ended_at[model].pop(session_id, None)
        with self._cv:
            if session_id in self._returners[model]:
                self._returners[model] = self._returners[model] - {session_id}

    def _forward(self, batch: list[_Job]) -> None:
        model = batch[0].model
        adapter = self._adapters[model]
        try:
            results = self._run_model(model, adapter, [j.work for j in batch])
        except Exception as exc:  # noqa: BLE001 - classified by _batch_failed
            self._batch_failed(adapter, batch, exc)
            return
        model_stats = self._count_batch(model, len(batch))
        done: list[tuple[_Job, Any]] = []
        for job, result in zip(batch, results):
            try:
                if job.validate is not None:
                    job.validate(result)
            except Exception as exc:  # noqa: BLE001 - the tick is not committed
                self._end(adapter, job, committed=False)
                self._fail(job, exc)
                continue
            if not self._end(adapter, job, committed=True):
                continue
            self.stats.works += 1
            done.append((job, result))
        ended = time.perf_counter()
        model_stats.ticks += len(done)
        for job, _ in done:
            model_stats.tick_seconds.observe(ended - job.enqueued)
        if self._holds(model):
            self._held.extend(done)  # until the next batch's launch
        else:
            _resolve_all(done)

    def _run_model(self, model: str, adapter: ModelAdapter, works: list[Any]) -> Sequence[Any]:
        """``adapter.run_batch(works)``, its time counted (busy time, the inline window);
        raises what it raised, or a ``ModelError`` for a wrong number of results."""
        timed = adapter.inline_forward_s > 0
        preempted = _preemptions() if timed else 0
        started = self._batch_started = time.perf_counter()
        if self._launch_s[model] < math.inf:
            self.launch_gate.close()
        try:
            results = adapter.run_batch(works)
            if len(results) != len(works):
                raise ModelError(f"{adapter.name} returned {len(results)} results for {len(works)} works")
            return results
        finally:
            self.launch_gate.open()
            self._flush()  # a batch that launched nothing: the last one's results wait no longer
            elapsed = time.perf_counter() - started
            self._forward_s[model] = elapsed
            self.stats.busy_seconds += elapsed
            self.stats.models[model].busy_seconds += elapsed
            # A slow forward during which the OS preempted this thread says nothing about
            # the model (a fast one needs no second look).
            if timed and (elapsed <= adapter.inline_forward_s or _preemptions() == preempted):
                self._note_forward(model, elapsed, adapter.inline_forward_s)

    def _batch_failed(self, adapter: ModelAdapter, batch: list[_Job], exc: Exception) -> None:
        """``run_batch`` raised ``exc``: a fatal error kills the engine; otherwise nothing is
        committed, and a batch of several is re-run one work at a time so that the bad one
        fails alone."""
        if is_fatal(exc):
            self._die(f"{adapter.name}: {exc!r}", batch)
            return
        for job in batch:
            self._end(adapter, job, committed=False)
        if len(batch) > 1:
            log.warning("batch of %d on %s failed (%r); re-running one by one", len(batch), adapter.name, exc)
            for job in batch:
                self._forward([job])
            return
        self._fail(batch[0], exc)

    def _count_batch(self, model: str, size: int) -> ModelStats:
        self.stats.batches += 1
        self.stats.batch_sizes[size] += 1
        model_stats = self.stats.models[model]
        model_stats.batch_size.observe(size)
        return model_stats

    def _run_now(self, model: str, work: Any, session_id: str | None) -> Any:
        """``_forward`` of one work run inline, with no job, future or batch list made unless
        it fails (then the same handlers as ``_forward``, and their error raised). The owner
        lock is held."""
        adapter = self._adapters[model]
        enqueued = time.perf_counter()
        quick = self._quick(model, session_id, enqueued)
        try:
            try:
                result = self._run_model(model, adapter, [work])[0]
            except Exception as exc:  # noqa: BLE001 - classified by _batch_failed
                job = self._job_now(model, work, session_id, enqueued)
                self._batch_failed(adapter, [job], exc)
                return job.future.result()  # raises the error the handlers set
            model_stats = self._count_batch(model, 1)
            if session_id is not None:
                try:
                    adapter.end_tick(session_id, True)
                except Exception as exc:  # noqa: BLE001 - as in _end
                    job = self._job_now(model, work, session_id, enqueued)
                    if is_fatal(exc):
                        self._die(f"{adapter.name}: {exc!r}", [job])
                    else:
                        self._fail(job, exc)
                    return job.future.result()
            self.stats.works += 1
            model_stats.ticks += 1
            model_stats.tick_seconds.observe(time.perf_counter() - enqueued)
            return result
        finally:
            self._ended(model, ((session_id, quick),))

    @staticmethod
    def _job_now(model: str, work: Any, session_id: str | None, enqueued: float) -> _Job:
        """The job ``_run_now`` did not need until its work failed (the failure handlers take one)."""
        loop = asyncio.get_running_loop()
        return _Job(model, work, session_id, None, loop.create_future(), loop, enqueued)

    def _launched(self, model: str) -> None:
        """``model``'s device work for this batch is queued (its launch listener): the
        loop may send, and take the last batch's results, while the device computes."""
        self._launch_s[model] = time.perf_counter() - self._batch_started
        self.launch_gate.open()
        self._flush()

    def _note_forward(self, model: str, elapsed: float, limit: float) -> None:
        """Keep the model's last forward times; decide whether it runs inline and is batched.

        Inline needs every one of the last INLINE_WINDOW forwards within ``limit``: one
        slow forward and the next ones go to the engine thread. Skipping the returner
        wait needs only their median within it, so that one forward stretched (by a
        wait for the GIL, say) does not bring back 20 ms waits for a batch that saves
        nothing.
        """
        recent = self._recent[model]
        recent.append(elapsed)
        if elapsed <= limit and self._fast[model]:
            return  # the window was all within the limit and still is: both flags stand
        full = len(recent) == INLINE_WINDOW
        self._fast[model] = full and max(recent) <= limit
        self._unbatched[model] = full and sorted(recent)[INLINE_WINDOW // 2] <= limit

    def _end(self, adapter: ModelAdapter, job: _Job, *, committed: bool) -> bool:
        if job.session_id is None:
            return True
        try:
            adapter.end_tick(job.session_id, committed)
        except Exception as exc:  # noqa: BLE001
            if is_fatal(exc):
                self._die(f"{adapter.name}: {exc!r}", [job])
            else:
                self._fail(job, exc)
            return False
        return True

    def _fail(self, job: _Job, exc: BaseException) -> None:
        self._flush()  # a session's results reach it in order: an earlier success first
        if job.session_id is not None and self._adapters[job.model].chained_ticks:
            self._purge(job.model, job.session_id)
        self.stats.failed_works += 1
        self.stats.models[job.model].failures[failure_code(exc)] += 1
        log.warning("session %s: tick on %s failed: %r", job.session_id, job.model, exc)
        error = exc if isinstance(exc, (ModelError, EngineDeadError)) else ModelError(f"{type(exc).__name__}: {exc}")
        _reject(job.loop, job.future, error)

    def _die(self, reason: str, running: Sequence[_Job] = ()) -> None:
        log.error("engine is dead: %s", reason)
        self._flush()  # those ticks were committed before the engine died
        self._dead = reason
        error = EngineDeadError(reason)
        for job in running:
            self.stats.models[job.model].failures["engine_dead"] += 1
            _reject(job.loop, job.future, error)
        self._fail_all(error)
        if self.on_dead is not None:
            try:
                self.on_dead(reason)
            except Exception:  # noqa: BLE001 - the engine is dead either way
                log.exception("engine death listener failed")

    def _fail_all(self, exc: BaseException) -> None:
        with self._cv:
            jobs = [j for q in self._ticks.values() for j in q]
            for q in self._ticks.values():
                q.clear()
            controls = list(self._controls)
            self._controls.clear()
        for job in jobs:
            _reject(job.loop, job.future, exc)
        for item in controls:
            if item.future is not None:
                _reject(item.loop, item.future, exc)


def _preemptions() -> int:
    """Involuntary context switches of the calling thread so far (Linux; 0 elsewhere)."""
    return resource.getrusage(_RUSAGE_THREAD).ru_nivcsw if _RUSAGE_THREAD is not None else 0


def hand_off_gil() -> None:
    """Let a thread waiting for the GIL (the engine, just woken) take it now (see
    "GIL hand-off"): sleeping releases it, and CPython's switching makes this thread
    wait until the waiter has had it."""
    time.sleep(0)


def _resolve(loop: asyncio.AbstractEventLoop | None, fut: asyncio.Future, value: Any) -> None:
    def set_result() -> None:
        if not fut.done():
            fut.set_result(value)

    _call(loop, set_result)


def _resolve_all(done: Sequence[tuple[_Job, Any]]) -> None:
    """Resolve a batch's futures with one hand-off per event loop instead of one per job.

    Each ``call_soon_threadsafe`` wakes the loop; a batch of 128 would wake it 128
    times while this thread still works through the batch, and the two threads
    would trade the GIL all the while.
    """
    if len(done) == 1:  # a batch of one
        job, value = done[0]
        _resolve(job.loop, job.future, value)
        return
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, Any]]] = {}
    for job, value in done:
        if job.loop is not None:
            by_loop.setdefault(job.loop, []).append((job.future, value))
    for loop, items in by_loop.items():
        def set_results(items: list[tuple[asyncio.Future, Any]] = items) -> None:
            for fut, value in items:
                if not fut.done():
                    fut.set_result(value)

        _call(loop, set_results)


def _reject(loop: asyncio.AbstractEventLoop | None, fut: asyncio.Future, exc: BaseException) -> None:
    def set_exception() -> None:
        if not fut.done():
            fut.set_exception(exc)

    _call(loop, set_exception)


def _call(loop: asyncio.AbstractEventLoop | None, fn: Callable[[], None]) -> None:
    if loop is None or loop.is_closed():
        return
    if asyncio._get_running_loop() is loop:  # run_now's failure: already on that loop's thread
        fn()
        return
    try:
        loop.call_soon_threadsafe(fn)
    except RuntimeError:  # the loop closed between the check and the call
        pass
