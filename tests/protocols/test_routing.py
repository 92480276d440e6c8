"""protocols/routing.py: the ?session_id= a proxy hashes on."""

from __future__ import annotations

from protocols.routing import SESSION_ID_PARAM, session_id_of, with_session_id


def test_with_session_id_adds_the_query():
    assert with_session_id("ws://h:8000/v1/realtime/world", "w1") == "ws://h:8000/v1/realtime/world?session_id=w1"
    assert SESSION_ID_PARAM == "session_id"


def test_with_session_id_replaces_one_and_keeps_the_rest():
    url = with_session_id("ws://h/v1/realtime/tts?session_id=old&x=1", "new")
    assert url == "ws://h/v1/realtime/tts?x=1&session_id=new"
    assert session_id_of(url) == "new"


def test_percent_encoding_matches_encode_uri_component():
    # The page builds the same query with encodeURIComponent: ':' -> %3A, ' ' -> %20.
    assert with_session_id("ws://h/p", "a:b c") == "ws://h/p?session_id=a%3Ab%20c"
    assert session_id_of("ws://h/p?session_id=a%3Ab%20c") == "a:b c"
    assert session_id_of("ws://h/p?x=1") is None
