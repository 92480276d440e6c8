import logging

import pytest

from sessions import (
    ErrorCode,
    SessionError,
    SessionEvent,
    SessionManager,
    SessionState,
    default_reducers,
)


def close(manager, session_id, cleanup):
    """The two-step close as the world endpoint runs it: begin, clean up, finish."""
    manager.begin_close(session_id)
    try:
        cleanup()
    except RuntimeError:
        return manager.finish_close(session_id, False)
    return manager.finish_close(session_id, True)


def create(manager, session_id, **kwargs):
    return manager.create(session_id, reducers=default_reducers(2), **kwargs)


def code_of(call):
    with pytest.raises(SessionError) as info:
        call()
    return info.value.code


def test_create_get_and_registry_views():
    m = SessionManager()
    a = create(m, "a", prompt="pa", max_pending=3)
    b = create(m, "B-1.x:y_z")
    assert m.get("a") is a and m.get("B-1.x:y_z") is b
    assert (a.prompt, a.max_pending, a.state) == ("pa", 3, SessionState.ACTIVE)
    assert "a" in m and "c" not in m
    assert len(m) == 2
    assert m.sessions() == [a, b]
    with pytest.raises(SessionError) as info:
        m.get("c")
    assert (info.value.code, info.value.message) == (ErrorCode.NO_SESSION, "no session 'c'")


@pytest.mark.parametrize("bad_id", ["", "a b", "a/b", "é", "x" * 129, 7, None])
def test_session_id_syntax(bad_id):
    m = SessionManager()
    assert code_of(lambda: create(m, bad_id)) is ErrorCode.BAD_REQUEST
    assert len(m) == 0


def test_longest_session_id_is_accepted():
    assert create(SessionManager(), "x" * 128).session_id == "x" * 128


def test_existing_id_and_capacity():
    m = SessionManager(max_sessions=2)
    create(m, "a")
    with pytest.raises(SessionError) as info:
        create(m, "a")
    assert (info.value.code, info.value.message) == (
        ErrorCode.SESSION_EXISTS,
        "session a already exists (active)",
    )
    create(m, "b")
    with pytest.raises(SessionError) as info:
        create(m, "c")
    assert (info.value.code, info.value.message) == (
        ErrorCode.BUSY,
        "2 sessions open, at most 2",
    )
    assert close(m, "a", lambda: None) is SessionState.CLOSED
    assert create(m, "c").session_id == "c"


def test_close_removes_the_session_and_frees_the_id():
    m = SessionManager()
    released, cleaned = [], []
    s = create(m, "a", drop_state=lambda: released.append("a"))
    s.accept_event(SessionEvent(1))
    s.begin_tick()
    assert close(m, "a", lambda: cleaned.append(s.state)) is SessionState.CLOSED
    assert cleaned == [SessionState.CLOSING]  # cleanup runs between the two steps
    assert released == ["a"]
    assert "a" not in m and len(m) == 0
    assert code_of(lambda: m.get("a")) is ErrorCode.NO_SESSION
    fresh = create(m, "a")
    assert fresh is not s and fresh.chunk_index == 0 and fresh.event_floor == -1


def test_cleanup_failure_leaves_a_tombstone_until_a_retry_succeeds(caplog):
    m = SessionManager()
    s = create(m, "tomb")

    def failing_cleanup():
        raise RuntimeError("kv still mapped")

    with caplog.at_level(logging.WARNING, logger="sessions"):
        assert close(m, "tomb", failing_cleanup) is SessionState.CLEANUP_FAILED
    assert "session tomb: cleanup failed; kept as a tombstone" in caplog.text
    assert m.get("tomb") is s and len(m) == 1
    assert code_of(lambda: create(m, "tomb")) is ErrorCode.SESSION_EXISTS
    assert code_of(s.reset) is ErrorCode.SESSION_CLOSED
    assert code_of(lambda: s.accept_event(SessionEvent(1))) is ErrorCode.SESSION_CLOSED
    # A retry through the two-step API.
    assert m.begin_close("tomb") is s
    assert s.state is SessionState.CLOSING
    assert m.finish_close("tomb", True) is SessionState.CLOSED
    assert "tomb" not in m
    assert create(m, "tomb").state is SessionState.ACTIVE


def test_tombstones_count_against_capacity():
    m = SessionManager(max_sessions=1)
    create(m, "a")
    m.begin_close("a")
    assert m.finish_close("a", False) is SessionState.CLEANUP_FAILED
    assert code_of(lambda: create(m, "b")) is ErrorCode.BUSY


def test_close_of_a_failed_session():
    m = SessionManager()
    s = create(m, "f")
    s.begin_tick()
    s.fail_tick("model raised")
    assert close(m, "f", lambda: None) is SessionState.CLOSED
    assert len(m) == 0


def test_log_lines_name_the_session(caplog):
    m = SessionManager()
    with caplog.at_level(logging.DEBUG, logger="sessions"):
        s = create(m, "logme")
        s.accept_event(SessionEvent(1))
        s.begin_tick()
        s.fail_tick("boom")
        s.reset()
        close(m, "logme", lambda: None)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) >= 7
    assert all("session logme" in line for line in lines), lines
