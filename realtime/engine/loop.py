"""The engine loop: one thread that owns every model, tensor and KV pool.

asyncio code never touches a tensor. It hands work to the engine with
``await engine.submit(...)`` (the tick lane) or ``await engine.control(...)`` (the control
lane, ahead of every queued tick), ``await engine.drop_session(model, sid)`` / ``reset(model, sid)``
for any adapter, and gets the answer through a future that the engine resolves with
``loop.call_soon_threadsafe`` (one hand-off per event loop and batch). Which ticks run
next, and whom to wait for first, is the scheduler's (``realtime/engine/scheduler.py``);
running the loop's sends beside the device is the overlap's (``realtime/engine/overlap.py``).
Each step: controls, then the scheduler's batch, ``adapter.run_batch(works)``, each
result validated, ``adapter.end_tick(session, committed)``, futures resolved.

Inline forwards: a model the scheduler has measured fast (its last ``INLINE_WINDOW``
forwards each within its ``inline_forward_s``, a policy answering in microseconds) is run by
``run_now`` on the event loop, when nothing is queued for it, no control is pending and the
engine thread is not running anything: the hand-off to the engine thread and back would
cost more than the forward (two thread wake-ups and ~0.1 ms of CPU). ``run_now`` is the one
inline path: it makes no job, future or batch list unless the work fails (a queued tick run
inline instead adds 24 us a call around an instant policy's forward in memory,
bench/results/openpi_app_profile_devbox.json); ``submit`` always queues. Whoever runs a model
holds ``_owner``, so one thread at a time still owns every model; a forward over the limit
sends the model back to the engine thread at once.

Failures (forward.py): a failed tick fails its session only; a fatal error
(``models.base.is_fatal``) marks the engine dead (``_die``): ``healthy`` turns False, every
queued and future call fails fast, and ``on_dead`` tells the app.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypeVar

from models.base import EngineDeadError, ModelAdapter, is_fatal
from realtime.engine.forward import Forwarder
from realtime.engine.futures import Job, reject, resolve, resolve_all
from realtime.engine.overlap import HeldResults, LaunchGate, hand_off_gil
from realtime.engine.scheduler import ModelLimits, Scheduler, Wait
from realtime.engine.stats import EngineStats, ModelStats

log = logging.getLogger(__name__)

T = TypeVar("T")


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
class _Control:
    fn: Callable[[], Any]
    future: asyncio.Future | None
    loop: asyncio.AbstractEventLoop | None


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
        # Whether a lone returner's submit hands the engine the GIL (overlap.py, "GIL hand-off").
        self._gil_hand_off = gil_hand_off
        # The interpreter's GIL switch interval set at start (0: Python's own; see
        # EngineConfig.switch_interval_s).
        self._switch_interval_s = switch_interval_s
        # model_wait_ms: per model, how long after a batch ends the engine waits for that
        # batch's sessions to queue their next tick (scheduler.py, "Returners").
        waits = model_wait_ms or {}
        self._sched = Scheduler({n: ModelLimits(a.max_batch, waits.get(n, batch_wait_ms) / 1000.0)
                                 for n, a in self._adapters.items()})
        # While _take_batch waits for returners: the ones not queued yet. A submit
        # wakes the engine only when it completes them (one wake-up per round, not
        # one per session: each costs the event loop the GIL on a busy host).
        self._awaited: set[str] | None = None
        self._controls: collections.deque[_Control] = collections.deque()
        self._cv = threading.Condition()
        # Held by whoever runs a model or a control: the engine thread, or run_now running a
        # fast model inline (never both; see "Inline forwards").
        self._owner = threading.Lock()
        self._stopping = False
        self._dead: str | None = None
        self._thread: threading.Thread | None = None
        self.stats = EngineStats(models={n: ModelStats() for n in self._adapters})
        self.started_at = time.perf_counter()
        # Called once, on the engine thread, when the engine dies (the app tells every
        # live session at once: an idle one has nothing queued that would fail).
        self.on_dead: Callable[[str], None] | None = None
        # Closed while a launching model's batch is prepared: the loop's chunk sends wait for it.
        self.launch_gate = LaunchGate()
        self._held = HeldResults(self._adapters, self.launch_gate, resolve_all)
        self._forwarder = Forwarder(self._adapters, self._sched, self._held, self.stats, die=self._die,
                                    purge=self._purge)
        for name, adapter in self._adapters.items():
            adapter.set_launch_listener(lambda name=name: self._held.launched(name, time.perf_counter()))

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
    async def submit(self, model: str, work: Any, *, session_id: str | None = None,
                     validate: Callable[[Any], None] | None = None, deadline: float | None = None) -> Any:
        """Queue ``work`` on the tick lane of ``model`` and wait for its result.

        ``validate(result)`` runs on the engine thread before the tick counts as
        done; if it raises, the adapter is told the tick was not committed and the
        caller gets a ``ModelError``. With ``session_id`` the adapter's
        ``end_tick(session_id, committed)`` is called either way. ``deadline``: the
        ``time.perf_counter`` time the result is needed by (scheduler.py, "Deadlines").
        """
        return await self.submit_future(model, work, session_id=session_id, validate=validate, deadline=deadline)

    def submit_future(self, model: str, work: Any, *, session_id: str | None = None,
                      validate: Callable[[Any], None] | None = None, deadline: float | None = None) -> asyncio.Future:
        """``submit`` as a future (call on the event loop); the engine thread resolves it.
        Cancelling the future drops the work if it has not started."""
        if model not in self._adapters:
            raise KeyError(model)
        self._raise_if_down()
        loop = asyncio.get_running_loop()
        now = time.perf_counter()
        job = Job(model=model, session_id=session_id, enqueued=now, deadline=deadline, work=work,
                  validate=validate, future=loop.create_future(), loop=loop)
        job.quick = self._sched.quick(model, session_id, now)
        with self._cv:
            self._sched.add(job)
            awaited = self._awaited
            if awaited is None:
                self._cv.notify()
                # The one session of the last batch coming back (overlap.py, "GIL hand-off").
                returners = self._sched.returners(model)
                hand_off = len(returners) == 1 and session_id in returners
            else:
                awaited.discard(session_id)  # type: ignore[arg-type]
                hand_off = False
                if not awaited or self._sched.full(model):
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
        if not self._sched.fast(model):
            return NOT_RUN
        self._raise_if_down()
        if self._controls or self._sched.queued(model) or not self._owner.acquire(blocking=False):
            return NOT_RUN
        try:
            # Checked again now that no one else can start: a tick queued or a control
            # posted meanwhile goes first, on the engine thread.
            if self._controls or self._sched.queued(model) or not self.healthy:
                return NOT_RUN
            self.stats.inline_works += 1
            return self._forwarder.run_now(model, work, session_id)
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

    async def drop_session(self, model: str, session_id: str) -> None:
        """Drop the session's queued ticks and every piece of its state in ``model``
        (control lane). Raises what the adapter's ``drop_session`` raised."""
        await self.control(self._session_job(model, session_id, "drop_session"))

    async def reset(self, model: str, session_id: str) -> None:
        """Drop the session's queued ticks and start it over in ``model`` (control lane)."""
        await self.control(self._session_job(model, session_id, "reset"))

    def post_drop_session(self, model: str, session_id: str) -> None:
        """``drop_session`` without waiting for it (a session's drop hook, a disconnect)."""
        self.post_control(self._session_job(model, session_id, "drop_session"))

    def post_cancel(self, model: str, session_id: str) -> None:
        """Drop the session's queued ticks, ahead of them (a tick already running finishes)."""
        self.post_control(lambda: self._purge(model, session_id))

    def _session_job(self, model: str, session_id: str, what: str) -> Callable[[], None]:
        adapter = self._adapters[model]

        def job() -> None:
            self._purge(model, session_id)
            if what == "drop_session":  # gone: nobody waits for it
                with self._cv:
                    self._sched.forget(model, session_id)
            getattr(adapter, what)(session_id)

        return job

    def queued(self, model: str) -> int:
        return self._sched.queued(model)

    # ------------------------------------------------------------------ engine thread
    def _raise_if_down(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(self._dead)
        if self._stopping:
            raise EngineStopped("engine stopped")

    def _purge(self, model: str, session_id: str) -> None:
        with self._cv:
            dropped: list[Job] = self._sched.purge(model, session_id)  # type: ignore[assignment]
        for job in dropped:
            reject(job.loop, job.future, TickCancelled(f"tick of {session_id} cancelled"))

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and not self._controls and not any(self._sched.queues.values()):
                    self._held.flush()  # no batch will launch to release them
                    self._cv.wait()
                if self._stopping:
                    self._held.flush()
                    return
                controls = list(self._controls)
                self._controls.clear()
            with self._owner:
                if controls:
                    self._held.flush()  # results first, as they came
                for item in controls:
                    self._run_control(item)
                if self._dead is not None:
                    continue
                batch = self._take_batch()
                if batch:
                    if not self._held.holds(batch[0].model):
                        self._held.flush()  # a model that does not launch at once: no result waits for it
                    self._forwarder.run(batch)

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
                reject(item.loop, item.future, exc)
            return
        if item.future is not None:
            resolve(item.loop, item.future, value)

    def _take_batch(self) -> list[Job]:
        """The scheduler's next batch, after the waits it asks for; [] when a control came."""
        sched = self._sched
        with self._cv:
            wait = sched.deadline_wait()
            if wait is not None:
                self._await(wait)
            model = sched.pick(time.perf_counter())
            if model is None:
                return []
            wait = sched.returner_wait(model)
            if wait is not None:
                self._await(wait)
            if self._controls or self._stopping:
                return []  # serve controls first; the ticks stay queued
            return sched.take(model)  # type: ignore[return-value]

    def _await(self, wait: Wait) -> None:
        """Wait until every session in ``wait.awaited`` has queued a tick (``submit_future`` takes
        each out), its model's batch is full, a control arrives, the engine stops, or
        ``wait.until``. Under ``_cv``."""
        self._held.flush()  # the returners may wait for these: never hold them here
        awaited = self._awaited = wait.awaited
        try:
            while (awaited and not (wait.until_full is not None and self._sched.full(wait.until_full))
                   and not self._controls and not self._stopping):
                remaining = wait.until - time.perf_counter()
                if remaining <= 0:
                    break
                self._cv.wait(remaining)
        finally:
            self._awaited = None

    def _die(self, reason: str, running: Sequence[Job] = ()) -> None:
        if self._dead is not None:  # a control run after the death failed again: told once already
            for job in running:
                reject(job.loop, job.future, EngineDeadError(self._dead))
            return
        log.error("engine is dead: %s", reason)
        self._held.flush()  # those ticks were committed before the engine died
        self._dead = reason
        error = EngineDeadError(reason)
        for job in running:
            self.stats.models[job.model].failures["engine_dead"] += 1
            reject(job.loop, job.future, error)
        self._fail_all(error)
        if self.on_dead is not None:
            try:
                self.on_dead(reason)
            except Exception:  # noqa: BLE001 - the engine is dead either way
                log.exception("engine death listener failed")

    def _fail_all(self, exc: BaseException) -> None:
        with self._cv:
            jobs: list[Job] = self._sched.drain()  # type: ignore[assignment]
            controls = list(self._controls)
            self._controls.clear()
        for job in jobs:
            reject(job.loop, job.future, exc)
        for item in controls:
            if item.future is not None:
                reject(item.loop, item.future, exc)
