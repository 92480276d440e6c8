"""The scheduler: which model's ticks run next, which of them, and whom to wait for first.

Pure bookkeeping: no threads, no asyncio, no torch. The engine thread
(``realtime/engine/loop.py``) calls it under its lock with the time (``time.perf_counter``)
and does the waiting it asks for; ``tests/realtime/test_scheduler.py`` drives it with a fake
clock. One step of the loop::

    controls first (the loop) ──> deadline_wait: the sessions of a batch that was due soon
                              ──> pick: the model whose oldest tick waited longest,
                                  unless another's would miss its deadline
                              ──> returner_wait: that model's returners, at most its
                                  batch wait after its last batch ended
                              ──> take: up to max_batch of its ticks, one per session
                              ──> started / ended: who ran, when it ended, what was due

Returners: sessions in a loop (a world client holding credits, a robot calling again)
queue their next tick a moment after their last batch ends. Waiting for those, and only
for them, keeps a fleet in full batches::

    no wait:     [== 8 ==][== 8 ==][== 8 ==]      the fleet stays split
    returners:   [== 8 ==]w[=== 16 ===]w[=== 16 ===]

A session is a returner when it was in the model's last batch and had queued that
batch's tick within ``quick_s`` of its previous forward's end (or while that forward
ran, or it was its first). A robot that acts for a while between calls, or one of two
robots driven in turn by one client, never makes the other wait; a released session is
forgotten at once. A session that was not in the last batch never makes anyone wait, so
a lone caller is served at once; the wait ends ``wait_s`` after the last batch at the
latest (a returner may have stopped: out of credits, closed), or once a full batch is
queued.

Deadlines: a tick may say by when its result is needed (``Tick.deadline``; the speech
endpoint's: when the listener's audio runs out, or now for a first window). Before a
batch of the model picked oldest-first, the scheduler looks at the other models' oldest
ticks: one whose deadline would pass if it waited for that batch (its slack, deadline -
now - its model's last forward time, is below the picked model's last forward time) goes
first, the least slack first. A tick that can wait, waits: a voice far ahead of its
listener leaves a world its turn, and a world tick of a CPU server (100-200 ms) no longer
sits between every window of a sentence. No tick is passed over once it has waited
``DEADLINE_DEFER_MAX_S``: deadlines reorder the queue, they cannot starve a model (voices
that cannot keep up with their listeners would otherwise always be due).
A deadline is seen only once its tick is queued, and a speaker queues its next window a
moment after the last one's result: so after a batch with a tick that was due within a
forward of the slowest model, the next step first waits for that batch's returners (at
most that model's batch wait after it ended) while another model's ticks are queued.
(Waiting after every batch with deadlines cost a voice beside a world ~20 ms of first
audio on 2 CPU cores, bench/results/tts_mixed_cpu.json.)

Measured forwards: a model whose last ``INLINE_WINDOW`` forwards each took at most its
``inline_forward_s`` is ``fast`` (the loop's ``run_now`` may run it on the event loop);
once their median is within it, the model is never waited for returners: merging forwards
that cost microseconds saves nothing.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

# The longest a tick waits while ticks with deadlines go first ("Deadlines"): an older
# one that has waited this long runs next whatever is due.
DEADLINE_DEFER_MAX_S = 0.5

# How many of a model's last forwards must each be within its ``inline_forward_s``
# before it counts as fast (one slow forward and it is back on the engine thread).
INLINE_WINDOW = 8

# Sessions per model whose last forward's end the scheduler keeps (for "Returners"): a
# session released without ``forget`` is forgotten, oldest first.
MAX_TRACKED_SESSIONS = 65_536


@dataclass(kw_only=True)
class Tick:
    """What the scheduler knows of one queued tick (the loop's job adds the work and its future)."""

    model: str
    session_id: str | None
    enqueued: float  # when it was queued
    deadline: float | None = None  # when its result is needed by (see "Deadlines")
    quick: bool = True  # its session came back quickly after its last forward (see "Returners")

    def cancelled(self) -> bool:
        """Whether its caller gave up on it: ``take`` drops it."""
        return False


@dataclass(frozen=True)
class ModelLimits:
    """What the scheduler is told of one model."""

    max_batch: int
    wait_s: float  # the returner wait: at most this long after the model's last batch ended


@dataclass
class Wait:
    """Wait until every session in ``awaited`` has queued a tick (the loop takes each out as it
    queues), until ``until``, or, with ``until_full``, until that model has a full batch queued."""

    awaited: set[str]
    until: float
    until_full: str | None = None


class Scheduler:
    """The engine's queues per model and every decision about them (see the module docstring)."""

    def __init__(self, models: Mapping[str, ModelLimits]) -> None:
        self.queues: dict[str, collections.deque[Tick]] = {n: collections.deque() for n in models}
        self._limit = {n: max(1, m.max_batch) for n, m in models.items()}
        self._wait = {n: m.wait_s for n, m in models.items()}
        self._returners: dict[str, frozenset[str]] = {n: frozenset() for n in models}
        # Per model and session: when its last forward ended (inf while one runs), oldest
        # first, at most MAX_TRACKED_SESSIONS; ``forget`` drops the session.
        self._ended_at: dict[str, dict[str, float]] = {n: {} for n in models}
        self._free_since = {n: 0.0 for n in models}  # when the model's last forward ended
        self._forward_s = {n: 0.0 for n in models}  # its last forward's time (0 until one ran)
        self._recent: dict[str, collections.deque[float]] = {
            n: collections.deque(maxlen=INLINE_WINDOW) for n in models}
        self._fast = {n: False for n in models}
        self._unbatched = {n: False for n in models}  # never waited for returners
        # The model of the last batch if a tick of it was due soon (see "Deadlines").
        self._deadline_model: str | None = None

    # ------------------------------------------------------------------ the queues
    def add(self, tick: Tick) -> None:
        self.queues[tick.model].append(tick)

    def queued(self, model: str) -> int:
        return len(self.queues[model])

    def full(self, model: str) -> bool:
        """A full batch of ``model`` is queued."""
        return len(self.queues[model]) >= self._limit[model]

    def purge(self, model: str, session_id: str) -> list[Tick]:
        """Take the session's queued ticks out; returns them, oldest first."""
        queue = self.queues[model]
        dropped = [t for t in queue if t.session_id == session_id]
        if dropped:
            keep = [t for t in queue if t.session_id != session_id]
            queue.clear()
            queue.extend(keep)
        return dropped

    def drain(self) -> list[Tick]:
        """Take every queued tick out (the engine stopped or died)."""
        ticks = [t for q in self.queues.values() for t in q]
        for q in self.queues.values():
            q.clear()
        return ticks

    # ------------------------------------------------------------------ the next batch
    def deadline_wait(self) -> Wait | None:
        """After a batch with a tick due soon: its returners not queued yet, while another model's
        ticks are queued (the next window's deadline can only win once it is queued)."""
        prev, self._deadline_model = self._deadline_model, None
        if prev is None or not any(q for name, q in self.queues.items() if name != prev):
            return None
        awaited = set(self._returners[prev]).difference(t.session_id for t in self.queues[prev])
        return Wait(awaited, self._free_since[prev] + self._wait[prev]) if awaited else None

    def pick(self, now: float) -> str | None:
        """The model to run next: the one whose oldest tick waited longest, or the one whose
        oldest tick would miss its deadline waiting for that (see "Deadlines"); None if idle."""
        ready = [(q[0].enqueued, name) for name, q in self.queues.items() if q]
        if not ready:
            return None
        _, picked = min(ready)
        if now - self.queues[picked][0].enqueued >= DEADLINE_DEFER_MAX_S:
            return picked
        cost = self._forward_s[picked]
        best: tuple[float, str] | None = None
        for name, queue in self.queues.items():
            if name == picked or not queue or queue[0].deadline is None:
                continue
            slack = queue[0].deadline - now - self._forward_s[name]
            if slack < cost and (best is None or slack < best[0]):
                best = (slack, name)
        return picked if best is None else best[1]

    def returner_wait(self, model: str) -> Wait | None:
        """Before a batch of ``model``: its returners not queued yet (see "Returners")."""
        queue = self.queues[model]
        if self.full(model) or not self._returners[model] or self._unbatched[model]:
            return None
        awaited = set(self._returners[model]).difference(t.session_id for t in queue)
        if not awaited:
            return None
        return Wait(awaited, self._free_since[model] + self._wait[model], until_full=model)

    def take(self, model: str) -> list[Tick]:
        """Up to a full batch of ``model``'s ticks, oldest first, one per session (a session's next
        tick needs this one's state): a second one of a session stays queued, in its place."""
        queue = self.queues[model]
        batch: list[Tick] = []
        seen: set[str] = set()
        skipped: list[Tick] = []
        while queue and len(batch) < self._limit[model]:
            tick = queue.popleft()
            if tick.session_id is not None and tick.session_id in seen:
                skipped.append(tick)
                continue
            if tick.cancelled():
                continue
            if tick.session_id is not None:
                seen.add(tick.session_id)
            batch.append(tick)
        queue.extendleft(reversed(skipped))
        return batch

    # ------------------------------------------------------------------ what ran
    def started(self, batch: Sequence[Tick], now: float) -> None:
        """``batch`` (one model's) starts at ``now``."""
        due = min((t.deadline for t in batch if t.deadline is not None), default=None)
        # Due within a forward of the slowest model: its next tick will likely be due too.
        if due is not None and due < now + max(self._forward_s.values()):
            self._deadline_model = batch[0].model
        ended_at = self._ended_at[batch[0].model]
        for tick in batch:
            if tick.session_id is not None:
                ended_at[tick.session_id] = math.inf  # running: its next tick is quick

    def ended(self, model: str, sessions: Sequence[tuple[str | None, bool]], now: float) -> None:
        """``model``'s forward of ``sessions`` (id, quick) ended at ``now``: the quick ones are
        the returners the next batch of it waits for."""
        self._free_since[model] = now
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

    def forget(self, model: str, session_id: str) -> None:
        """A released session: no longer a returner, its forward's end dropped."""
        self._ended_at[model].pop(session_id, None)
        if session_id in self._returners[model]:
            self._returners[model] = self._returners[model] - {session_id}

    def quick(self, model: str, session_id: str | None, now: float) -> bool:
        """Whether ``session_id``'s tick queued at ``now`` came back quickly (see "Returners"); a
        first tick counts as quick, so a fleet's second round is batched too."""
        if session_id is None:
            return False
        ended = self._ended_at[model].get(session_id)
        return ended is None or now - ended < self.quick_s(model)

    def quick_s(self, model: str) -> float:
        """How soon after its forward a session must queue its next tick to be waited for:
        within the batch wait and half a forward. Two robots driven in turn by one client
        each come back a whole forward (the other's) after their own."""
        return min(self._wait[model], self._forward_s[model] / 2)

    def returners(self, model: str) -> frozenset[str]:
        return self._returners[model]

    def ended_at(self, model: str, session_id: str) -> float | None:
        """When the session's last forward of ``model`` ended (inf while one runs), if known."""
        return self._ended_at[model].get(session_id)

    def tracked(self, model: str) -> int:
        """Sessions whose last forward's end is kept for ``model``."""
        return len(self._ended_at[model])

    # ------------------------------------------------------------------ measured forwards
    def forward_took(self, model: str, elapsed: float) -> None:
        """``model``'s last forward took ``elapsed`` seconds (its cost in "Deadlines")."""
        self._forward_s[model] = elapsed

    def measured(self, model: str, elapsed: float, limit: float) -> None:
        """A forward of ``model`` that says something about it took ``elapsed`` (see "Measured
        forwards"; the loop leaves out a slow one during which the OS preempted its thread).

        Fast needs every one of the last INLINE_WINDOW forwards within ``limit``: one slow
        forward and the next ones go to the engine thread. Skipping the returner wait needs
        only their median within it, so that one forward stretched (by a wait for the GIL,
        say) does not bring back 20 ms waits for a batch that saves nothing.
        """
        recent = self._recent[model]
        recent.append(elapsed)
        if elapsed <= limit and self._fast[model]:
            return  # the window was all within the limit and still is: both flags stand
        full = len(recent) == INLINE_WINDOW
        self._fast[model] = full and max(recent) <= limit
        self._unbatched[model] = full and sorted(recent)[INLINE_WINDOW // 2] <= limit

    def fast(self, model: str) -> bool:
        """Whether ``model`` may run inline (see "Measured forwards")."""
        return self._fast[model]

    def measured_forwards(self, model: str) -> int:
        """How many forward times of ``model`` the window holds (at most INLINE_WINDOW)."""
        return len(self._recent[model])
