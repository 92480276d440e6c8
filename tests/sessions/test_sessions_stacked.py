"""Ticks begun on top of ticks still in flight (``Session(max_in_flight=2)``)."""

import pytest

from sessions import ErrorCode, KeysReducer, Session, SessionError, SessionState, SessionStateError
from tests.sessions.test_sessions_session import BrokenCommit, Releases, ev, fs


def make(depth=2, frames=2, extra=None, drop_state=None):
    reducers = {"keys": KeysReducer(frames)}
    if extra is not None:
        reducers[extra.track] = extra
    return Session("s", reducers=reducers, prompt="start", drop_state=drop_state, max_in_flight=depth)


def done(session, req):
    return session.complete_tick(req.request_id)


def test_a_stacked_tick_takes_the_later_events_and_builds_on_the_earlier_controls():
    s = make(frames=3)
    s.accept_event(ev(1, held="w", prompt="one"))
    s.accept_event(ev(2, frames=[["a"], ["s"], ["d"], ["i"]]))
    t0 = s.begin_tick()
    s.accept_event(ev(3, prompt="three"))
    t1 = s.begin_tick()
    assert (t0.chunk_index, t0.applied_event_ids, t0.prompt) == (0, (1, 2), "one")
    assert (t1.chunk_index, t1.applied_event_ids, t1.prompt) == (1, (3,), "three")
    # t1 goes on from the script t0 left over and the key t0 holds.
    assert t0.controls["keys"] == (fs("a"), fs("s"), fs("d"))
    assert t1.controls["keys"] == (fs("i"), fs("w"), fs("w"))
    assert (s.in_flight, s.ticks_in_flight, s.event_floor, s.waiting_event_ids) == (t0, 2, 3, ())
    # The committed state did not move while t1 was prepared.
    assert (s.chunk_index, s.prompt) == (0, "start")
    assert done(s, t0) is t0 and (s.chunk_index, s.prompt, s.in_flight) == (1, "one", t1)
    assert done(s, t1) is t1 and (s.chunk_index, s.prompt, s.in_flight) == (2, "three", None)
    assert s.pending_event_ids == ()
    # The next tick starts from what both committed: the script is used up, w is held.
    t2 = s.begin_tick()
    assert (t2.chunk_index, t2.controls["keys"]) == (2, (fs("w"), fs("w"), fs("w")))


def test_the_same_ticks_one_at_a_time_give_the_same_snapshots():
    def run(depth):
        s = make(depth=depth, frames=3)
        s.accept_event(ev(1, held="w"))
        s.accept_event(ev(2, frames=[["a"], ["s"], ["d"], ["i"]]))
        t0 = s.begin_tick()
        if depth == 1:
            done(s, t0)
        s.accept_event(ev(3, held="j"))
        t1 = s.begin_tick()
        if depth == 2:
            done(s, t0)
        done(s, t1)
        return [(t.chunk_index, t.applied_event_ids, t.controls) for t in (t0, t1)]

    assert run(1) == run(2)


def test_more_than_max_in_flight_is_a_programming_error():
    s = make(depth=2)
    s.begin_tick()
    s.begin_tick()
    with pytest.raises(SessionStateError, match="2 of at most 2"):
        s.begin_tick()
    one = make(depth=1)
    one.begin_tick()
    with pytest.raises(SessionStateError, match="1 of at most 1"):
        one.begin_tick()


def test_completion_must_be_for_the_oldest_tick():
    s = make()
    t0 = s.begin_tick()
    t1 = s.begin_tick()
    assert t0.request_id != t1.request_id
    with pytest.raises(SessionStateError, match="a result for 's:1' while the oldest tick in flight is s:0"):
        done(s, t1)  # results come back in order: anything else is a server bug, and changes nothing
    assert (s.state, s.in_flight, s.ticks_in_flight, s.chunk_index) == (SessionState.ACTIVE, t0, 2, 0)
    assert done(s, t0) is t0 and done(s, t1) is t1 and s.chunk_index == 2


def test_a_failure_abandons_every_tick_in_flight_and_releases_once():
    hook = Releases()
    s = make(drop_state=hook)
    s.accept_event(ev(1, held="w"))
    t0 = s.begin_tick()
    s.accept_event(ev(2))
    s.begin_tick()
    s.fail_tick("model exploded")
    assert (s.state, s.in_flight, s.ticks_in_flight, s.chunk_index) == (SessionState.FAILED, None, 0, 0)
    assert s.pending_event_ids == (1, 2) and hook.count == 1
    with pytest.raises(SessionError) as err:
        done(s, t0)  # a late result of an abandoned tick
    assert err.value.code is ErrorCode.SESSION_FAILED
    s.reset()
    assert s.begin_tick().applied_event_ids == ()  # reset dropped both, never applied


def test_reset_is_busy_and_close_abandons_while_any_tick_is_in_flight():
    s = make()
    t0 = s.begin_tick()
    s.begin_tick()
    done(s, t0)
    with pytest.raises(SessionError) as err:
        s.reset()
    assert err.value.code is ErrorCode.BUSY
    s.begin_close()
    assert s.state is SessionState.CLOSING and s.in_flight is None


def test_a_commit_failure_of_the_oldest_rolls_back_and_fails_the_stack():
    broken = BrokenCommit()
    s = make(extra=broken)
    t0 = s.begin_tick()
    t1 = s.begin_tick()
    # t1 was prepared on top of t0's prepared state, and nothing was committed by it.
    assert (t0.controls["broken"], t1.controls["broken"], broken.value) == (1, 2, 0)
    broken.fail_commit = True
    with pytest.raises(SessionError):
        done(s, t0)
    assert (broken.value, s.state, s.ticks_in_flight) == (0, SessionState.FAILED, 0)


def test_max_in_flight_is_checked():
    with pytest.raises(ValueError, match="max_in_flight"):
        Session("s", reducers={}, max_in_flight=0)
