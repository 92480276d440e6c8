"""realtime/endpoints/event_clock.py: each event observed once, at its chunk's first frames
out, with exact times; bounded; forgotten at a restart."""

from __future__ import annotations

import pytest

from realtime.endpoints import event_clock
from realtime.endpoints.event_clock import EventClock


@pytest.fixture
def clock(monkeypatch) -> tuple[EventClock, list[float], list[float]]:
    now = [100.0]
    monkeypatch.setattr(event_clock.time, "perf_counter", lambda: now[0])
    seen: list[float] = []
    return EventClock(seen.append, limit=3), seen, now


def test_each_event_is_observed_once_from_its_acceptance(clock):
    c, seen, now = clock
    c.accepted(1)
    now[0] = 100.25
    c.accepted(2)
    now[0] = 101.0
    c.shown((1, 2))  # chunk 0 applied both
    assert seen == [1.0, 0.75] and len(c) == 0
    c.shown((1, 2))  # a streamed chunk's later frames: nothing more
    assert seen == [1.0, 0.75]


def test_only_the_applied_events_are_observed(clock):
    c, seen, now = clock
    c.accepted(1)
    c.accepted(2)
    now[0] = 100.5
    c.shown((1,))
    assert seen == [0.5] and len(c) == 1
    now[0] = 100.75
    c.shown((2, 9))  # 9 was never timed (a duplicate, or past the bound)
    assert seen == [0.5, 0.75] and len(c) == 0


def test_a_second_acceptance_keeps_the_first_time(clock):
    c, seen, now = clock
    c.accepted(4)
    now[0] = 100.5
    c.accepted(4)
    now[0] = 101.0
    c.shown((4,))
    assert seen == [1.0]


def test_bounded_at_the_limit(clock):
    c, seen, now = clock
    for event_id in range(5):
        c.accepted(event_id)
    assert len(c) == 3
    now[0] = 102.0
    c.shown(range(5))
    assert seen == [2.0, 2.0, 2.0]


def test_restart_forgets_events_no_chunk_will_apply(clock):
    c, seen, now = clock
    c.accepted(1)
    c.restart()
    assert len(c) == 0
    c.shown((1,))
    assert seen == []
