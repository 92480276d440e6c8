import pickle

from sessions import ErrorCode, SessionError


def test_to_wire_without_event_id():
    err = SessionError(ErrorCode.NO_SESSION, "no session 'x'")
    assert err.to_wire() == {"type": "error", "code": "no_session", "message": "no session 'x'"}
    assert err.event_id is None
    assert str(err) == "no_session: no session 'x'"


def test_to_wire_with_event_id_zero():
    err = SessionError(ErrorCode.STALE_EVENT, "old", event_id=0)
    assert err.to_wire() == {
        "type": "error",
        "code": "stale_event",
        "message": "old",
        "event_id": 0,
    }


def test_codes_are_wire_strings():
    assert [c.value for c in ErrorCode] == [
        "bad_request",
        "unknown_type",
        "stale_event",
        "queue_full",
        "session_exists",
        "no_session",
        "session_failed",
        "message_too_large",
        "internal",
        "session_evicted",
        "session_closed",
        "busy",
        "closed_by_admin",
        "idle_timeout",
        "too_many_sessions",
        "format_unavailable",
        "loading",
    ]
    assert ErrorCode("busy") is ErrorCode.BUSY


def test_pickle_keeps_event_id():
    err = pickle.loads(pickle.dumps(SessionError(ErrorCode.QUEUE_FULL, "full", event_id=7)))
    assert (err.code, err.message, err.event_id) == (ErrorCode.QUEUE_FULL, "full", 7)
