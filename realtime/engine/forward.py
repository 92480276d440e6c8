"""One forward of a batch and what it ends in, for whoever holds the engine's owner lock.

``adapter.run_batch(works)`` ──> each result validated ──> ``adapter.end_tick(session,
committed)`` ──> counted ──> futures resolved, or held until the next launch (overlap.py).

A batch that raises is re-run one work at a time, so one bad session fails alone. A
failed tick of a model with ``chained_ticks`` (a world) also drops the session's ticks
queued behind it: they would run on state that was never committed. A fatal error
(``models.base.is_fatal``: an ``EngineDeadError`` or a CUDA error, recognised by type)
goes to the loop's ``die``.

Each forward's time goes to the scheduler: its cost (``forward_took``) and, for a model
with ``inline_forward_s``, its measure (``measured``), unless the OS preempted the thread
during a slow one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Mapping, Sequence

from models.base import EngineDeadError, ModelAdapter, ModelError, failure_code, is_fatal
from realtime.engine.futures import Job, reject, resolve_all
from realtime.engine.overlap import HeldResults
from realtime.engine.scheduler import Scheduler
from realtime.engine.stats import EngineStats, ModelStats

log = logging.getLogger(__name__)

try:
    import resource

    _RUSAGE_THREAD: int | None = resource.RUSAGE_THREAD  # type: ignore[attr-defined]
except (ImportError, AttributeError):  # not Linux
    _RUSAGE_THREAD = None


class Forwarder:
    """Runs batches and single inline works on their models."""

    def __init__(self, adapters: Mapping[str, ModelAdapter], sched: Scheduler, held: HeldResults,
                 stats: EngineStats, *, die: Callable[[str, Sequence[Job]], None],
                 purge: Callable[[str, str], None]) -> None:
        self._adapters = adapters
        self._sched = sched
        self._held = held
        self._stats = stats
        self._die = die      # the engine is dead: (reason, the jobs that were running)
        self._purge = purge  # drop (model, session)'s queued ticks

    def run(self, batch: list[Job]) -> None:
        """Run a batch the scheduler took (the engine thread)."""
        self._sched.started(batch, time.perf_counter())
        try:
            self._forward(batch)
        finally:
            self._sched.ended(batch[0].model, [(j.session_id, j.quick) for j in batch], time.perf_counter())

    def run_now(self, model: str, work: Any, session_id: str | None) -> Any:
        """``run([job])`` for one work on the event loop, with no job, future or batch list made
        unless it fails (then the same handlers, and their error raised)."""
        adapter = self._adapters[model]
        enqueued = time.perf_counter()
        quick = self._sched.quick(model, session_id, enqueued)
        try:
            try:
                result = self._run_model(model, adapter, [work])[0]
            except Exception as exc:  # noqa: BLE001 - classified by _batch_failed
                job = _job_now(model, work, session_id, enqueued)
                self._batch_failed(adapter, [job], exc)
                return job.future.result()  # raises the error the handlers set
            model_stats = self._count_batch(model, 1)
            if session_id is not None:
                try:
                    adapter.end_tick(session_id, True)
                except Exception as exc:  # noqa: BLE001 - as in _end
                    job = _job_now(model, work, session_id, enqueued)
                    if is_fatal(exc):
                        self._die(f"{adapter.name}: {exc!r}", [job])
                    else:
                        self._fail(job, exc)
                    return job.future.result()
            self._stats.works += 1
            model_stats.ticks += 1
            model_stats.tick_seconds.observe(time.perf_counter() - enqueued)
            return result
        finally:
            self._sched.ended(model, ((session_id, quick),), time.perf_counter())

    def _forward(self, batch: list[Job]) -> None:
        model = batch[0].model
        adapter = self._adapters[model]
        try:
            results = self._run_model(model, adapter, [j.work for j in batch])
        except Exception as exc:  # noqa: BLE001 - classified by _batch_failed
            self._batch_failed(adapter, batch, exc)
            return
        model_stats = self._count_batch(model, len(batch))
        done: list[tuple[Job, Any]] = []
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
            self._stats.works += 1
            done.append((job, result))
        ended = time.perf_counter()
        model_stats.ticks += len(done)
        for job, _ in done:
            model_stats.tick_seconds.observe(ended - job.enqueued)
        if self._held.holds(model):
            self._held.hold(done)  # until the next batch's launch
        else:
            resolve_all(done)

    def _run_model(self, model: str, adapter: ModelAdapter, works: list[Any]) -> Sequence[Any]:
        """``adapter.run_batch(works)``, its time counted (busy time, the scheduler's measure);
        raises what it raised, or a ``ModelError`` for a wrong number of results."""
        timed = adapter.inline_forward_s > 0
        preempted = _preemptions() if timed else 0
        started = time.perf_counter()
        self._held.batch_started(model, started)
        try:
            results = adapter.run_batch(works)
            if len(results) != len(works):
                raise ModelError(f"{adapter.name} returned {len(results)} results for {len(works)} works")
            return results
        finally:
            self._held.batch_ended()
            elapsed = time.perf_counter() - started
            self._sched.forward_took(model, elapsed)
            self._stats.busy_seconds += elapsed
            self._stats.models[model].busy_seconds += elapsed
            # A slow forward during which the OS preempted this thread says nothing about
            # the model (a fast one needs no second look).
            if timed and (elapsed <= adapter.inline_forward_s or _preemptions() == preempted):
                self._sched.measured(model, elapsed, adapter.inline_forward_s)

    def _batch_failed(self, adapter: ModelAdapter, batch: list[Job], exc: Exception) -> None:
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
        self._stats.batches += 1
        self._stats.batch_sizes[size] += 1
        model_stats = self._stats.models[model]
        model_stats.batch_size.observe(size)
        return model_stats

    def _end(self, adapter: ModelAdapter, job: Job, *, committed: bool) -> bool:
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

    def _fail(self, job: Job, exc: BaseException) -> None:
        self._held.flush()  # a session's results reach it in order: an earlier success first
        if job.session_id is not None and self._adapters[job.model].chained_ticks:
            self._purge(job.model, job.session_id)
        self._stats.failed_works += 1
        self._stats.models[job.model].failures[failure_code(exc)] += 1
        log.warning("session %s: tick on %s failed: %r", job.session_id, job.model, exc)
        error = exc if isinstance(exc, (ModelError, EngineDeadError)) else ModelError(f"{type(exc).__name__}: {exc}")
        reject(job.loop, job.future, error)


def _job_now(model: str, work: Any, session_id: str | None, enqueued: float) -> Job:
    """The job ``run_now`` did not need until its work failed (the failure handlers take one)."""
    loop = asyncio.get_running_loop()
    return Job(model=model, session_id=session_id, enqueued=enqueued, work=work, validate=None,
               future=loop.create_future(), loop=loop)


def _preemptions() -> int:
    """Involuntary context switches of the calling thread so far (Linux; 0 elsewhere)."""
    return resource.getrusage(_RUSAGE_THREAD).ru_nivcsw if _RUSAGE_THREAD is not None else 0
