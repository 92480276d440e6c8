"""WebSocket close codes (RFC 6455) that mean the same on every protocol here.

Each protocol module re-exports what it uses, so a client of one protocol needs only
that module; the value is defined once, here.
"""

# The server is shutting down (SIGTERM, docs/reliability.md "Drain"): the session's
# in-flight work (a world tick, the utterance being spoken, a policy call) finished and
# was sent, or the drain deadline passed; either way the socket closes with this code.
CLOSE_GOING_AWAY = 1001
