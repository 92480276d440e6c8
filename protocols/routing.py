"""The routing key in a session's URL: ``?session_id=...``.

A proxy in front of several replicas (deploy/nginx: ``hash $arg_session_id consistent``)
sends every connection of one session to the replica that holds its state, without
parsing a single message. Clients put the id in the query of every endpoint's URL (world,
tts, and the OpenPI URL a robot connects to); the server ignores the query.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

# The query parameter; nginx reads it as $arg_session_id (deploy/nginx/realtime.conf.template).
SESSION_ID_PARAM = "session_id"


def with_session_id(url: str, session_id: str) -> str:
    """``url`` with ``?session_id=`` set to ``session_id`` (replacing one already there).

    Percent-encoded as the page's ``encodeURIComponent`` does, so a proxy that hashes the
    raw query sees the same key from either client:

    >>> with_session_id("ws://h:8000/v1/realtime/world?x=1", "w:1")
    'ws://h:8000/v1/realtime/world?x=1&session_id=w%3A1'
    """
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != SESSION_ID_PARAM]
    query.append((SESSION_ID_PARAM, session_id))
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


def session_id_of(url: str) -> str | None:
    """The ``session_id`` in ``url``'s query, or None."""
    for key, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        if key == SESSION_ID_PARAM:
            return value
    return None
