import dataclasses
import json

import pytest

from protocols import world_v1
from sessions import (
    AcceptResult,
    ControlReducer,
    ErrorCode,
    FrozenDict,
    KeysReducer,
    Prepared,
    Session,
    SessionError,
    SessionEvent,
    SessionState,
    SessionStateError,
    TickRequest,
)

ACCEPTED, DUPLICATE = AcceptResult.ACCEPTED, AcceptResult.DUPLICATE


def fs(*keys):
    return frozenset(keys)


def ev(event_id, prompt=None, held=None, frames=None):
    controls = []
    if held is not None:
        controls.append(
            {"track": "keys", "schema": "keys.v1", "data": {"mode": "state", "held": list(held)}}
        )
    if frames is not None:
        controls.append(
            {"track": "keys", "schema": "keys.v1", "data": {"mode": "script", "frames": frames}}
        )
    wire = {"event_id": event_id, "controls": controls}
    if prompt is not None:
        wire["prompt"] = prompt
    return parsed(wire)


def parsed(msg):
    """The session's event for a decoded wire ``event``, as the endpoint builds it."""
    return SessionEvent.from_wire(world_v1.parse_client(json.dumps({"type": "event", **msg})))


class Releases:
    """A real drop hook that counts its calls."""

    def __init__(self):
        self.count = 0

    def __call__(self):
        self.count += 1


class BrokenCommit(ControlReducer):
    """A reducer whose commit fails when told to, to exercise the rollback."""

    track = "broken"
    schema = "broken.v1"

    def __init__(self):
        self.fail_commit = False
        self.fail_prepare = False
        self.value = 0

    def validate(self, data):
        pass

    def prepare(self, updates):
        if self.fail_prepare:
            raise RuntimeError("prepare exploded")
        return Prepared(value=self.value + 1, next_state=self.value + 1)

    def commit(self, prepared):
        self.value = -999  # half-written before failing: must be rolled back
        if self.fail_commit:
            raise RuntimeError("commit exploded")
        self.value = prepared.next_state

    def reset(self):
        self.value = 0


def make(session_id="s", *, frames=2, prompt="start", max_pending=64, extra=None, drop_state=None):
    reducers = {"keys": KeysReducer(frames)}
    if extra is not None:
        reducers[extra.track] = extra
    return Session(
        session_id, reducers=reducers, prompt=prompt, max_pending=max_pending, drop_state=drop_state
    )


def commit(session):
    req = session.begin_tick()
    assert session.complete_tick(req.request_id) is req
    return req


# -- ordering and persistence ---------------------------------------------------


def test_initial_state():
    s = make()
    assert s.session_id == "s"
    assert s.state is SessionState.ACTIVE
    assert s.chunk_index == 0
    assert s.event_floor == -1
    assert s.in_flight is None
    assert s.pending_event_ids == ()
    assert s.prompt == "start"
    assert s.worker_live is False


def test_events_sorted_by_id_and_applied_at_the_next_chunk_boundary():
    s = make()
    assert [s.accept_event(ev(i)) for i in (5, 2, 9)] == [ACCEPTED] * 3
    assert s.pending_event_ids == (2, 5, 9)
    req = s.begin_tick()
    assert req == TickRequest(
        session_id="s",
        request_id="s:0",
        chunk_index=0,
        applied_event_ids=(2, 5, 9),
        prompt="start",
        controls=FrozenDict({"keys": (fs(), fs())}),
    )
    assert s.event_floor == 9
    assert s.complete_tick("s:0") is req
    assert s.chunk_index == 1
    assert s.event_floor == 9
    assert s.pending_event_ids == ()
    assert s.in_flight is None


def test_last_prompt_in_id_order_wins_and_prompt_and_controls_persist():
    s = make()
    # Arrival order differs from id order: the id order decides.
    s.accept_event(ev(2, prompt="two", held="d"))
    s.accept_event(ev(1, prompt="one", held="w"))
    s.accept_event(ev(3))
    req = commit(s)
    # In id order w went down and up again within the tick: a one-frame pulse.
    assert (req.prompt, req.controls["keys"]) == ("two", (fs("w", "d"), fs("d")))
    assert s.prompt == "two"
    req = commit(s)
    assert (req.chunk_index, req.applied_event_ids) == (1, ())
    assert (req.prompt, req.controls["keys"]) == ("two", (fs("d"), fs("d")))
    s.accept_event(ev(4, held="wa"))  # prompt None keeps the prompt
    req = commit(s)
    assert (req.prompt, req.controls["keys"]) == ("two", (fs("a", "w"), fs("a", "w")))


def test_keys_script_and_held_expand_per_frame_across_ticks():
    s = make(frames=3)
    s.accept_event(ev(1, held="w"))
    s.accept_event(ev(2, frames=[["a"], ["s"], ["D"], ["i", "j"]]))
    assert commit(s).controls["keys"] == (fs("a"), fs("s"), fs("d"))
    s.accept_event(ev(3, frames=[["k"]]))
    assert commit(s).controls["keys"] == (fs("i", "j"), fs("k"), fs("w"))
    assert commit(s).controls["keys"] == (fs("w"), fs("w"), fs("w"))


def test_request_ids_never_repeat():
    s = make()
    ids = [commit(s).request_id for _ in range(3)]
    s.begin_tick()
    s.fail_tick("boom")
    s.reset()
    ids.append(commit(s).request_id)
    assert ids == ["s:0", "s:1", "s:2", "s:4"]


# -- duplicates, stale events, admission ----------------------------------------


def test_duplicate_when_pending_in_flight_applied_and_after_reset():
    s = make()
    assert s.accept_event(ev(1)) is ACCEPTED
    assert s.accept_event(ev(1, prompt="other")) is DUPLICATE  # pending
    s.begin_tick()
    assert s.accept_event(ev(1)) is DUPLICATE  # in flight
    s.complete_tick("s:0")
    assert s.accept_event(ev(1)) is DUPLICATE  # applied
    s.accept_event(ev(2))
    assert s.reset() == (2,)
    assert s.accept_event(ev(1)) is DUPLICATE  # applied before the reset
    # 2 was dropped by the reset, never applied: it may be sent again.
    assert s.accept_event(ev(2)) is ACCEPTED
    assert s.pending_event_ids == (2,)


def test_stale_event_names_the_floor():
    s = make()
    s.accept_event(ev(1))
    s.accept_event(ev(3))
    commit(s)
    with pytest.raises(SessionError) as info:
        s.accept_event(ev(2))
    err = info.value
    assert err.code is ErrorCode.STALE_EVENT
    assert err.event_id == 2
    assert err.message == "event 2 is at or below the event floor 3; event ids must be above 3"
    assert s.pending_event_ids == ()


def test_floor_includes_the_in_flight_snapshot():
    s = make()
    s.accept_event(ev(4))
    s.accept_event(ev(6))
    s.begin_tick()
    assert s.event_floor == 6
    with pytest.raises(SessionError) as info:
        s.accept_event(ev(5))
    assert (info.value.code, info.value.event_id) == (ErrorCode.STALE_EVENT, 5)
    assert "floor 6" in info.value.message
    assert s.accept_event(ev(7)) is ACCEPTED


def test_full_queue_rejects_the_whole_event_and_leaves_the_queue_unchanged():
    s = make(max_pending=2)
    s.accept_event(ev(1, held="w"))
    s.accept_event(ev(2, prompt="two"))
    with pytest.raises(SessionError) as info:
        s.accept_event(ev(3, prompt="three", held="a"))
    assert info.value.code is ErrorCode.QUEUE_FULL
    assert info.value.message == "2 events pending, at most 2"
    assert info.value.event_id == 3
    assert s.pending_event_ids == (1, 2)
    req = commit(s)
    assert (req.applied_event_ids, req.prompt, req.controls["keys"]) == (
        (1, 2),
        "two",
        (fs("w"), fs("w")),
    )
    # Refused, not remembered: the same id is accepted once there is room.
    assert s.accept_event(ev(3, prompt="three")) is ACCEPTED


def test_in_flight_events_count_against_the_queue():
    s = make(max_pending=1)
    s.accept_event(ev(1))
    s.begin_tick()
    with pytest.raises(SessionError, match="1 events pending, at most 1"):
        s.accept_event(ev(2))


def test_invalid_controls_leave_no_trace():
    s = make()
    cases = [
        (
            parsed(
                {"event_id": 1, "controls": [{"track": "mouse", "schema": "m.v1", "data": {}}]}
            ),
            "controls[0]: unknown track 'mouse'; tracks are keys",
        ),
        (
            parsed(
                {
                    "event_id": 1,
                    "controls": [{"track": "keys", "schema": "keys.v2", "data": {"mode": "state"}}],
                }
            ),
            "controls[0]: track 'keys' takes schema 'keys.v1', got 'keys.v2'",
        ),
        (
            ev(1, prompt="p", held=["w", "x"]),
            "controls[0].data: keys.v1: unknown key 'x' at held[1]; keys are w, a, s, d, i, j, k, l",
        ),
    ]
    for event, message in cases:
        with pytest.raises(SessionError) as info:
            s.accept_event(event)
        assert (info.value.code, info.value.message, info.value.event_id) == (
            ErrorCode.BAD_REQUEST,
            message,
            1,
        )
    assert s.pending_event_ids == ()
    assert s.event_floor == -1
    assert s.accept_event(ev(1)) is ACCEPTED


def test_script_backlog_counts_in_flight_and_pending_updates():
    s = Session("s", reducers={"keys": KeysReducer(2, max_script_frames=512)})
    s.accept_event(ev(1, frames=[["w"]] * 256))
    s.begin_tick()
    s.accept_event(ev(2, frames=[["a"]] * 255))
    with pytest.raises(SessionError) as info:
        s.accept_event(ev(3, frames=[["s"]] * 2))
    assert (info.value.code, info.value.event_id) == (ErrorCode.QUEUE_FULL, 3)
    assert info.value.message == (
        "controls[0]: keys: script backlog would be 513 frames, at most 512"
    )
    assert s.pending_event_ids == (1, 2)
    assert s.accept_event(ev(3, frames=[["s"]])) is ACCEPTED


def test_accepted_event_is_isolated_from_later_mutation():
    s = make()
    held = ["w"]
    wire = {
        "event_id": 1,
        "prompt": "p",
        "controls": [{"track": "keys", "schema": "keys.v1", "data": {"mode": "state", "held": held}}],
    }
    # Built directly: parse_client's objects are its own, a caller's may change after.
    s.accept_event(SessionEvent.from_wire(world_v1.Event(1, "p", (world_v1.Control(**wire["controls"][0]),))))
    held.append("s")
    wire["controls"][0]["data"]["mode"] = "script"
    wire["prompt"] = "q"
    req = commit(s)
    assert (req.prompt, req.controls["keys"]) == ("p", (fs("w"), fs("w")))


# -- in-flight ticks --------------------------------------------------------------


def test_event_accepted_in_flight_waits_and_the_snapshot_never_changes():
    s = make()
    s.accept_event(ev(1, prompt="one", held="w"))
    req = s.begin_tick()
    frozen_copy = dataclasses.replace(req)
    assert s.accept_event(ev(2, prompt="two", held="a")) is ACCEPTED
    assert s.in_flight is req
    assert req == frozen_copy
    assert (req.applied_event_ids, req.prompt, req.controls["keys"]) == (
        (1,),
        "one",
        (fs("w"), fs("w")),
    )
    assert s.pending_event_ids == (1, 2)
    assert s.waiting_event_ids == (2,)
    with pytest.raises(SessionStateError, match="begin_tick while s:0 is in flight"):
        s.begin_tick()
    s.complete_tick(req.request_id)
    assert s.pending_event_ids == (2,)
    assert s.prompt == "one"
    nxt = commit(s)
    assert (nxt.chunk_index, nxt.applied_event_ids, nxt.prompt, nxt.controls["keys"]) == (
        1,
        (2,),
        "two",
        (fs("a"), fs("a")),
    )


def test_complete_without_a_tick_in_flight_is_a_programming_error():
    s = make()
    with pytest.raises(SessionStateError, match="session s: no tick in flight"):
        s.complete_tick("s:0")


# -- failures -------------------------------------------------------------------


def assert_failed_and_needs_reset(s, releases, *, chunk_index, pending):
    assert s.state is SessionState.FAILED
    assert s.chunk_index == chunk_index
    assert s.pending_event_ids == pending
    assert s.in_flight is None
    assert releases.count == 1
    with pytest.raises(SessionError) as info:
        s.accept_event(ev(100))
    assert (info.value.code, info.value.event_id) == (ErrorCode.SESSION_FAILED, 100)
    with pytest.raises(SessionStateError, match="begin_tick in state FAILED"):
        s.begin_tick()
    assert s.reset() == pending
    assert s.state is SessionState.ACTIVE
    assert releases.count == 1  # already released by the failure
    s.begin_close()
    s.finish_close(True)
    assert releases.count == 1


def prepared_session(extra=None):
    releases = Releases()
    s = make(drop_state=releases, extra=extra)
    s.accept_event(ev(1, held="w"))
    commit(s)
    s.accept_event(ev(2, prompt="two", held="a"))
    s.accept_event(ev(3))
    return s, releases


def test_tick_failure_commits_nothing():
    s, releases = prepared_session()
    s.begin_tick()
    s.fail_tick("model raised")
    assert s.failure == "model raised"
    assert s.event_floor == 1
    assert s.prompt == "start"
    assert s.reducers["keys"].held == fs("w")
    assert_failed_and_needs_reset(s, releases, chunk_index=1, pending=(2, 3))


def test_a_result_for_another_tick_is_a_server_bug_that_changes_nothing():
    """The identities were checked where the result was made (the kind's base); the session
    only refuses a result that is not for its oldest tick in flight."""
    s, releases = prepared_session()
    req = s.begin_tick()
    with pytest.raises(SessionStateError, match=r"a result for 's:9' while the oldest tick in flight is s:1"):
        s.complete_tick("s:9")
    assert (s.state, s.in_flight, s.chunk_index, s.pending_event_ids) == (SessionState.ACTIVE, req, 1, (2, 3))
    assert s.reducers["keys"].held == fs("w") and releases.count == 0
    assert s.complete_tick(req.request_id) is req and s.chunk_index == 2


def test_reducer_commit_failure_rolls_back_every_reducer():
    broken = BrokenCommit()
    s, releases = prepared_session(extra=broken)
    assert broken.value == 1
    broken.fail_commit = True
    req = s.begin_tick()
    assert req.controls == {"keys": (fs("a"), fs("a")), "broken": 2}
    with pytest.raises(SessionError) as info:
        s.complete_tick(req.request_id)
    assert info.value.code is ErrorCode.SESSION_FAILED
    assert info.value.message == (
        "reducer 'broken' commit failed: RuntimeError('commit exploded')"
    )
    # keys committed first and was put back; broken's half-write was undone.
    assert s.reducers["keys"].held == fs("w")
    assert broken.value == 1
    assert s.event_floor == 1
    assert_failed_and_needs_reset(s, releases, chunk_index=1, pending=(2, 3))
    assert broken.value == 0  # reset


def test_reducer_prepare_failure_fails_the_session():
    broken = BrokenCommit()
    s, releases = prepared_session(extra=broken)
    broken.fail_prepare = True
    with pytest.raises(SessionError) as info:
        s.begin_tick()
    assert info.value.message == "reducer 'broken' prepare failed: RuntimeError('prepare exploded')"
    assert_failed_and_needs_reset(s, releases, chunk_index=1, pending=(2, 3))


def test_late_failure_reports_are_ignored():
    releases = Releases()
    s = make(drop_state=releases)
    s.begin_tick()
    s.fail_tick("first")
    s.fail_tick("second")
    assert (s.state, s.failure, releases.count) == (SessionState.FAILED, "first", 1)
    with pytest.raises(SessionError) as info:
        s.complete_tick("s:0")
    assert info.value.code is ErrorCode.SESSION_FAILED


def test_failing_release_hook_is_logged_and_not_retried(caplog):
    calls = []

    def release():
        calls.append(1)
        raise OSError("gone")

    s = make("vx", drop_state=release)
    s.begin_tick()
    s.fail_tick("boom")
    s.reset()
    assert calls == [1]
    assert "session vx: drop hook failed" in caplog.text


# -- reset ------------------------------------------------------------------------


def test_reset_restarts_at_chunk_zero_keeps_the_floor_and_returns_dropped_ids():
    releases = Releases()
    s = make(drop_state=releases)
    s.accept_event(ev(1, prompt="one", held="w", frames=None))
    commit(s)
    s.accept_event(ev(2, frames=[["a"]] * 5))
    commit(s)
    s.accept_event(ev(7))
    s.accept_event(ev(5))
    assert (s.chunk_index, s.event_floor, releases.count) == (2, 2, 0)
    assert s.reset() == (5, 7)
    assert (s.state, s.chunk_index, s.event_floor, s.pending_event_ids) == (
        SessionState.ACTIVE,
        0,
        2,
        (),
    )
    assert s.prompt == "start"
    assert (s.reducers["keys"].held, s.reducers["keys"].script) == (fs(), ())
    assert releases.count == 1
    with pytest.raises(SessionError, match="floor 2"):
        s.accept_event(ev(0))
    s.accept_event(ev(3))
    req = commit(s)
    assert (req.request_id, req.chunk_index, req.applied_event_ids, req.prompt) == (
        "s:2",
        0,
        (3,),
        "start",
    )
    assert req.controls["keys"] == (fs(), fs())
    # No tick since the last release ran: a second reset has nothing to release.
    s.reset()
    s.reset()
    assert releases.count == 2


def test_reset_while_in_flight_is_busy():
    s = make()
    s.accept_event(ev(1))
    s.begin_tick()
    with pytest.raises(SessionError) as info:
        s.reset()
    assert info.value.code is ErrorCode.BUSY
    assert info.value.message == "session s: tick s:0 is in flight"
    assert s.pending_event_ids == (1,)


# -- close ------------------------------------------------------------------------


def test_close_active_session_abandons_the_tick_and_releases_once():
    releases = Releases()
    s = make(drop_state=releases)
    s.accept_event(ev(1, held="w"))
    req = s.begin_tick()
    s.begin_close()
    assert (s.state, s.in_flight, s.chunk_index) == (SessionState.CLOSING, None, 0)
    with pytest.raises(SessionError) as info:
        s.complete_tick(req.request_id)
    assert info.value.code is ErrorCode.SESSION_CLOSED
    for call in (s.reset, lambda: s.accept_event(ev(2))):
        with pytest.raises(SessionError) as info:
            call()
        assert info.value.code is ErrorCode.SESSION_CLOSED
    assert releases.count == 0
    s.finish_close(True)
    assert (s.state, releases.count) == (SessionState.CLOSED, 1)
    assert s.reducers["keys"].held == fs()


def test_close_failed_session():
    releases = Releases()
    s = make(drop_state=releases)
    s.begin_tick()
    s.fail_tick("boom")
    s.begin_close()
    s.finish_close(True)
    assert (s.state, releases.count) == (SessionState.CLOSED, 1)


def test_cleanup_failed_is_a_tombstone_until_a_close_retry_succeeds():
    releases = Releases()
    s = make(drop_state=releases)
    commit(s)
    s.begin_close()
    s.finish_close(False)
    assert s.state is SessionState.CLEANUP_FAILED
    assert releases.count == 0
    with pytest.raises(SessionError) as info:
        s.reset()
    assert (info.value.code, info.value.message) == (
        ErrorCode.SESSION_CLOSED,
        "session s is cleanup_failed",
    )
    with pytest.raises(SessionError, match="session_closed"):
        s.accept_event(ev(5))
    s.begin_close()
    s.finish_close(True)
    assert (s.state, releases.count) == (SessionState.CLOSED, 1)


def test_session_without_worker_state_closes_without_release():
    releases = Releases()
    s = make(drop_state=releases)
    s.begin_close()
    s.finish_close(True)
    assert releases.count == 0


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        (["close", "closed", "begin_close"], "illegal transition CLOSED -> CLOSING"),
        (["close", "begin_close"], "illegal transition CLOSING -> CLOSING"),
        (["finish_close"], "finish_close in state ACTIVE"),
        (["close", "closed", "begin_tick"], "begin_tick in state CLOSED"),
    ],
)
def test_illegal_transitions_raise(steps, message):
    s = make()
    actions = {
        "close": s.begin_close,
        "closed": lambda: s.finish_close(True),
        "begin_close": s.begin_close,
        "finish_close": lambda: s.finish_close(True),
        "begin_tick": s.begin_tick,
    }
    for step in steps[:-1]:
        actions[step]()
    with pytest.raises(SessionStateError, match=message):
        actions[steps[-1]]()


def test_transition_table():
    allowed = {
        (a.name, b.name) for a in SessionState for b in SessionState if a.can_become(b)
    }
    assert allowed == {
        ("ACTIVE", "ACTIVE"),
        ("ACTIVE", "FAILED"),
        ("ACTIVE", "CLOSING"),
        ("FAILED", "ACTIVE"),
        ("FAILED", "CLOSING"),
        ("CLOSING", "CLOSED"),
        ("CLOSING", "CLEANUP_FAILED"),
        ("CLEANUP_FAILED", "CLOSING"),
    }


# -- independence ------------------------------------------------------------------


def test_interleaved_sessions_are_independent():
    a, b = make("a", prompt="pa"), make("b", prompt="pb")
    a.accept_event(ev(10, held="w"))
    b.accept_event(ev(1, held="s"))
    ra = a.begin_tick()
    b.accept_event(ev(2))
    rb = b.begin_tick()
    assert (ra.request_id, ra.applied_event_ids) == ("a:0", (10,))
    assert (rb.request_id, rb.applied_event_ids) == ("b:0", (1, 2))
    with pytest.raises(SessionStateError):
        a.complete_tick(rb.request_id)  # b's result is not a's: a refuses it and stays as it was
    assert (a.state, a.in_flight) == (SessionState.ACTIVE, ra)
    a.fail_tick("a's tick failed")
    assert b.complete_tick(rb.request_id) is rb
    assert b.accept_event(ev(3)) is ACCEPTED  # a's floor (10) means nothing to b
    rb2 = commit(b)
    assert (rb2.request_id, rb2.chunk_index, rb2.controls["keys"]) == ("b:1", 1, (fs("s"),) * 2)
    assert (a.chunk_index, a.event_floor, b.chunk_index, b.event_floor) == (0, -1, 2, 3)
    a.reset()
    assert commit(a).request_id == "a:1"
    assert b.prompt == "pb" and a.prompt == "pa"


def test_constructor_checks():
    with pytest.raises(ValueError, match="declares track 'keys'"):
        Session("s", reducers={"mouse": KeysReducer(2)})
    with pytest.raises(ValueError, match="max_pending"):
        Session("s", reducers={}, max_pending=0)
    with pytest.raises(SessionError, match="prompt: 2001 characters"):
        Session("s", reducers={}, prompt="x" * 2001)
