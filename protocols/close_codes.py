"""WebSocket close codes that mean the same on every protocol here (world.v1, tts.v1, OpenPI).

Each protocol's own codes stay in its module (``world_v1.CLOSE_TOO_BIG``,
``openpi.CLOSE_ERROR``). These mean the same on every endpoint, so a client of any kind
can act on them: reconnect to another replica, reconnect when it has something to say
again, or close one of its other sessions first. A protocol module re-exports what its
clients need (``world_v1.CLOSE_GOING_AWAY``), so a client of one protocol needs only that
module; each value is defined once, here.
"""

from __future__ import annotations

# RFC 6455's own: a normal close, and an error inside the server (OpenPI's error close,
# a tts.v1 voice that cannot load, a dead engine).
CLOSE_NORMAL = 1000
CLOSE_INTERNAL = 1011
# An operator closed the session (DELETE /v1/sessions/...): RFC 6455 "policy violation".
CLOSE_ADMIN = 1008

# The server is shutting down (SIGTERM, docs/reliability.md "Drain"): the session's
# in-flight work (a world tick, the utterance being spoken, a policy call) finished and
# was sent, or the drain deadline passed; either way the socket closes with this code.
CLOSE_GOING_AWAY = 1001
# The session sat idle past the server's ``--idle-timeout-s``: no message from the
# client and no output taken by it. Application range (RFC 6455 7.4.2), 4000 + HTTP's
# 408 Request Timeout, as graphql-ws numbers its own timeouts. Reason: "idle timeout".
CLOSE_IDLE_TIMEOUT = 4408
# A tts.v1 or OpenPI connection (the connection is the session) from a client address
# that already holds ``--max-sessions-per-client`` live sessions: RFC 6455's registered
# 1013 Try Again Later. A world.v1 ``session.create`` is refused without closing.
CLOSE_TRY_AGAIN_LATER = 1013

IDLE_TIMEOUT_REASON = "idle timeout"
TOO_MANY_SESSIONS_REASON = "too many sessions from this client"
