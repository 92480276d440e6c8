"""The scheduler's decisions, without threads: the time is a number each call is given."""

from __future__ import annotations

import math

import pytest

from realtime.engine.scheduler import (DEADLINE_DEFER_MAX_S, INLINE_WINDOW, MAX_TRACKED_SESSIONS, ModelLimits,
                                       Scheduler, Tick, Wait)


class Dropped(Tick):
    """A tick whose caller gave up on it."""

    def cancelled(self) -> bool:
        return True


def make(**models: tuple[int, float]) -> Scheduler:
    """A scheduler of ``name=(max_batch, wait_s)``."""
    return Scheduler({name: ModelLimits(batch, wait) for name, (batch, wait) in models.items()})


def add(sched: Scheduler, model: str, sid: str | None, at: float, deadline: float | None = None,
        quick: bool = True) -> Tick:
    tick = Tick(model=model, session_id=sid, enqueued=at, deadline=deadline, quick=quick)
    sched.add(tick)
    return tick


def ids(batch: list[Tick]) -> list[str | None]:
    return [t.session_id for t in batch]


def run(sched: Scheduler, model: str, start: float, end: float) -> list[str | None]:
    """Take a batch of ``model`` and run it from ``start`` to ``end``; its session ids."""
    batch = sched.take(model)
    sched.started(batch, start)
    sched.forward_took(model, end - start)
    sched.ended(model, [(t.session_id, t.quick) for t in batch], end)
    return ids(batch)


# ----------------------------------------------------------------------------- batches
def test_one_batch_takes_every_session_up_to_max_batch_oldest_first():
    sched = make(world=(4, 0.02))
    for i, sid in enumerate("abcdef"):
        add(sched, "world", sid, at=float(i))
    assert sched.full("world") and sched.queued("world") == 6
    assert ids(sched.take("world")) == ["a", "b", "c", "d"]
    assert ids(sched.take("world")) == ["e", "f"]
    assert sched.take("world") == [] and not sched.full("world")


def test_a_sessions_second_tick_waits_for_the_next_batch_in_its_place():
    sched = make(world=(4, 0.02))
    for sid, at in (("a", 1.0), ("a", 2.0), ("b", 3.0), ("a", 4.0), ("c", 5.0)):
        add(sched, "world", sid, at)
    first = sched.take("world")
    assert [(t.session_id, t.enqueued) for t in first] == [("a", 1.0), ("b", 3.0), ("c", 5.0)]
    assert [(t.session_id, t.enqueued) for t in sched.queues["world"]] == [("a", 2.0), ("a", 4.0)]
    assert [t.enqueued for t in sched.take("world")] == [2.0]
    assert [t.enqueued for t in sched.take("world")] == [4.0]


def test_ticks_without_a_session_share_a_batch_and_cancelled_ones_are_dropped():
    sched = make(policy=(3, 0.02))
    add(sched, "policy", None, 1.0)
    sched.add(Dropped(model="policy", session_id="gone", enqueued=2.0))
    add(sched, "policy", None, 3.0)
    add(sched, "policy", "r", 4.0)
    add(sched, "policy", "s", 5.0)
    assert ids(sched.take("policy")) == [None, None, "r"]  # the dropped one took no place
    assert ids(sched.take("policy")) == ["s"]


def test_a_max_batch_below_one_is_one():
    sched = make(policy=(0, 0.02))
    add(sched, "policy", "a", 1.0)
    add(sched, "policy", "b", 2.0)
    assert sched.full("policy")
    assert ids(sched.take("policy")) == ["a"]


# ----------------------------------------------------------------------------- lanes
def test_the_model_whose_oldest_tick_waited_longest_goes_next():
    sched = make(world=(1, 0.02), voice=(1, 0.02))
    assert sched.pick(0.0) is None
    add(sched, "world", "w1", 0.0)
    add(sched, "voice", "v", 1.0)
    add(sched, "world", "w2", 2.0)
    assert sched.pick(3.0) == "world" and run(sched, "world", 3.0, 3.1) == ["w1"]
    assert sched.pick(3.1) == "voice" and run(sched, "voice", 3.1, 3.2) == ["v"]  # older than w2
    assert sched.pick(3.2) == "world" and run(sched, "world", 3.2, 3.3) == ["w2"]
    assert sched.pick(3.3) is None


def test_purge_takes_one_sessions_ticks_out_and_drain_takes_all():
    sched = make(world=(4, 0.02), voice=(1, 0.02))
    a1, b, a2 = add(sched, "world", "a", 1.0), add(sched, "world", "b", 2.0), add(sched, "world", "a", 3.0)
    v = add(sched, "voice", "a", 4.0)
    assert sched.purge("world", "a") == [a1, a2]
    assert list(sched.queues["world"]) == [b] and list(sched.queues["voice"]) == [v]
    assert sched.purge("world", "nobody") == []
    assert sched.drain() == [b, v]
    assert sched.queued("world") == sched.queued("voice") == 0


# ----------------------------------------------------------------------------- deadlines
def deadline_lanes() -> Scheduler:
    """A world whose forward takes 0.125 and a voice whose forward takes 0.0625, both measured."""
    sched = make(world=(1, 0.02), voice=(1, 0.02))
    sched.forward_took("world", 0.125)
    sched.forward_took("voice", 0.0625)
    return sched


@pytest.mark.parametrize("deadline, picked", [
    (None, "world"),      # no deadline: oldest first
    (10.25, "world"),     # slack 0.25 - 0.0625 = 0.1875, more than the world's 0.125: it can wait
    (10.1875, "world"),   # slack 0.125, the world's forward exactly: it can still wait
    (10.125, "voice"),    # slack 0.0625: it would miss its deadline behind the world
    (10.0, "voice"),      # already due
])
def test_a_tick_that_would_miss_its_deadline_goes_before_an_older_batch(deadline, picked):
    sched = deadline_lanes()
    add(sched, "world", "w", 9.9)
    add(sched, "voice", "v", 9.95, deadline=deadline)
    assert sched.pick(10.0) == picked


def test_of_several_due_ticks_the_least_slack_goes_first():
    sched = make(world=(1, 0.02), voice=(1, 0.02), robot=(1, 0.02))
    sched.forward_took("world", 0.1)
    sched.forward_took("voice", 0.01)
    sched.forward_took("robot", 0.05)
    add(sched, "world", "w", 9.9)
    add(sched, "voice", "v", 9.92, deadline=10.05)   # slack 0.05 - 0.01 = 0.04
    add(sched, "robot", "r", 9.95, deadline=10.08)   # slack 0.08 - 0.05 = 0.03
    assert sched.pick(10.0) == "robot"


def test_a_tick_that_waited_the_defer_limit_is_not_passed_over():
    sched = deadline_lanes()
    add(sched, "world", "w", 10.0)
    add(sched, "voice", "v", 10.1, deadline=10.1)
    assert sched.pick(10.0 + DEADLINE_DEFER_MAX_S - 0.001) == "voice"
    assert sched.pick(10.0 + DEADLINE_DEFER_MAX_S) == "world"


def test_after_a_batch_due_soon_its_returners_are_awaited_while_another_model_waits():
    sched = deadline_lanes()
    add(sched, "voice", "v", 10.0, deadline=10.1)
    assert run(sched, "voice", 10.0, 10.01) == ["v"]  # due within the slowest forward (0.125), not its own
    add(sched, "world", "w", 10.005)
    assert sched.deadline_wait() == Wait({"v"}, 10.01 + 0.02)  # the voice's next window, until its batch wait
    assert sched.deadline_wait() is None  # asked once per batch
    # Nothing else queued: nothing to wait for.
    add(sched, "voice", "v2", 10.02, deadline=10.02)
    run(sched, "world", 10.02, 10.12)
    assert run(sched, "voice", 10.12, 10.13) == ["v2"]
    assert sched.deadline_wait() is None


def test_a_batch_with_room_in_its_deadline_is_not_followed_by_a_wait():
    sched = deadline_lanes()
    add(sched, "voice", "v", 10.0, deadline=10.5)  # 0.5 ahead: more than the slowest forward
    run(sched, "voice", 10.0, 10.01)
    add(sched, "world", "w", 10.005)
    assert sched.deadline_wait() is None


# ----------------------------------------------------------------------------- returners
def test_the_sessions_of_the_last_batch_that_came_back_quickly_are_waited_for():
    sched = make(world=(4, 0.02))
    for sid in "abc":  # first ticks count as quick
        assert sched.quick("world", sid, 0.0)
        add(sched, "world", sid, 0.0)
    assert sched.returner_wait("world") is None  # no batch yet: no one to wait for
    assert run(sched, "world", 0.0, 0.1) == ["a", "b", "c"]
    assert sched.returners("world") == {"a", "b", "c"}
    assert sched.quick_s("world") == 0.02  # min(batch wait, half a forward)
    add(sched, "world", "a", 0.105)
    assert sched.returner_wait("world") == Wait({"b", "c"}, 0.1 + 0.02, until_full="world")
    add(sched, "world", "b", 0.11)
    add(sched, "world", "c", 0.11)
    assert sched.returner_wait("world") is None  # all back


def test_a_session_that_came_back_late_is_not_waited_for_next_time():
    sched = make(world=(4, 0.02))
    add(sched, "world", "a", 0.0)
    add(sched, "world", "b", 0.0)
    run(sched, "world", 0.0, 0.1)
    for sid, at in (("a", 0.11), ("b", 0.2)):  # b acted 100 ms before coming back
        add(sched, "world", sid, at, quick=sched.quick("world", sid, at))
    assert [t.quick for t in sched.queues["world"]] == [True, False]
    run(sched, "world", 0.2, 0.3)
    assert sched.returners("world") == {"a"}


def test_a_session_that_queued_while_its_forward_ran_is_quick():
    sched = make(world=(4, 0.02))
    add(sched, "world", "a", 0.0)
    batch = sched.take("world")
    sched.started(batch, 0.0)
    assert sched.ended_at("world", "a") == math.inf
    assert sched.quick("world", "a", 5.0)  # whenever, while it runs
    assert not sched.quick("world", None, 0.0)  # no session: never a returner


def test_two_robots_driven_in_turn_are_not_quick():
    """Each comes back a whole forward (the other's) after its own: more than half a forward."""
    sched = make(policy=(4, 0.02))
    sched.forward_took("policy", 0.01)
    assert sched.quick_s("policy") == 0.005
    add(sched, "policy", "r1", 0.0)
    run(sched, "policy", 0.0, 0.01)
    add(sched, "policy", "r2", 0.01, quick=sched.quick("policy", "r2", 0.01))  # its first: quick
    run(sched, "policy", 0.01, 0.02)
    assert not sched.quick("policy", "r1", 0.02)


def test_no_wait_with_a_full_batch_queued_or_for_an_unbatched_model():
    sched = make(world=(2, 0.02))
    for sid in "abc":
        add(sched, "world", sid, 0.0)
    run(sched, "world", 0.0, 0.1)  # a, b ran; c still queued
    assert sched.returners("world") == {"a", "b"}
    assert sched.returner_wait("world") == Wait({"a", "b"}, 0.1 + 0.02, until_full="world")
    add(sched, "world", "d", 0.1)
    assert sched.full("world") and sched.returner_wait("world") is None
    fast = make(policy=(4, 0.02))
    add(fast, "policy", "r", 0.0)
    run(fast, "policy", 0.0, 0.0001)
    for _ in range(INLINE_WINDOW):
        fast.measured("policy", 0.0001, 0.0005)
    assert fast.returners("policy") == {"r"} and fast.returner_wait("policy") is None


def test_a_released_session_is_forgotten_and_the_oldest_are_dropped_past_the_limit():
    sched = make(world=(4, 0.02))
    add(sched, "world", "a", 0.0)
    add(sched, "world", "b", 0.0)
    run(sched, "world", 0.0, 0.1)
    sched.forget("world", "a")
    assert sched.returners("world") == {"b"} and sched.ended_at("world", "a") is None
    assert sched.ended_at("world", "b") == 0.1 and sched.tracked("world") == 1
    sched.ended("world", [(f"s{i}", False) for i in range(MAX_TRACKED_SESSIONS)], 0.2)
    assert sched.tracked("world") == MAX_TRACKED_SESSIONS
    assert sched.ended_at("world", "b") is None  # the oldest went
    assert sched.ended_at("world", "s0") == 0.2 and sched.returners("world") == frozenset()


# ----------------------------------------------------------------------------- measured forwards
def test_a_model_is_fast_once_its_whole_window_is_within_the_limit():
    sched = make(policy=(4, 0.02))
    for _ in range(INLINE_WINDOW - 1):
        sched.measured("policy", 0.0001, 0.0005)
        assert not sched.fast("policy")
    sched.measured("policy", 0.0001, 0.0005)
    assert sched.fast("policy") and sched.measured_forwards("policy") == INLINE_WINDOW
    sched.measured("policy", 0.001, 0.0005)  # one slow forward: back to the engine thread
    assert not sched.fast("policy")
    for _ in range(INLINE_WINDOW - 1):
        sched.measured("policy", 0.0001, 0.0005)
        assert not sched.fast("policy")  # while the slow one is in the window
    sched.measured("policy", 0.0001, 0.0005)
    assert sched.fast("policy")  # the slow one left it
    assert sched.measured_forwards("policy") == INLINE_WINDOW


def test_one_slow_forward_does_not_bring_back_the_returner_wait():
    sched = make(policy=(4, 0.02))
    add(sched, "policy", "r", 0.0)
    add(sched, "policy", "s", 0.0)
    run(sched, "policy", 0.0, 0.0001)
    add(sched, "policy", "r", 0.0002)
    for _ in range(INLINE_WINDOW):
        sched.measured("policy", 0.0001, 0.0005)
    sched.measured("policy", 0.01, 0.0005)  # stretched by a wait for the GIL, say
    assert not sched.fast("policy")
    assert sched.returner_wait("policy") is None  # the median is still within the limit
    for _ in range(INLINE_WINDOW // 2):
        sched.measured("policy", 0.01, 0.0005)
    assert sched.returner_wait("policy") == Wait({"s"}, 0.0001 + 0.02, until_full="policy")


def test_the_scheduler_is_pure():
    """No threads, no asyncio, no clock, no torch: the loop gives it the time and does the waiting."""
    import ast
    from pathlib import Path

    import realtime.engine.scheduler as module

    imported = set()
    for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    assert imported == {"__future__", "collections", "math", "dataclasses", "typing"}
