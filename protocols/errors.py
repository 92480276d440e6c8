"""Error codes that more than one protocol here sends, with one meaning and one spelling.

world.v1 and tts.v1 send them as an ``error`` message's ``code``; OpenPI, whose client
raises a text frame as it is, as the text's first word (``idle_timeout: ...``). Each
protocol module re-exports the ones its clients see, so a client needs only that module;
each is spelled once, here. A code only one protocol has (world.v1's ``stale_event``,
tts.v1's ``buffer_full``) is that protocol module's own.
"""

from __future__ import annotations

# A message the protocol cannot take: malformed JSON, not an object, a field of the wrong
# type or an unknown one (world.v1, tts.v1).
BAD_REQUEST = "bad_request"
# A ``type`` the protocol does not have (world.v1, tts.v1).
UNKNOWN_TYPE = "unknown_type"
# The server failed, not the client: the engine is unavailable, the model failed on this
# session's work, a close's cleanup failed (world.v1, tts.v1).
INTERNAL = "internal"
# No message from the client and no output taken for the server's --idle-timeout-s; the
# socket then closes with close_codes.CLOSE_IDLE_TIMEOUT.
IDLE_TIMEOUT = "idle_timeout"
# An operator closed the session (DELETE /v1/sessions/...); close_codes.CLOSE_ADMIN follows.
CLOSED_BY_ADMIN = "closed_by_admin"
# The client address holds --max-sessions-per-client live sessions already.
TOO_MANY_SESSIONS = "too_many_sessions"
# A client frame over the protocol's bound (the frame is dropped).
MESSAGE_TOO_LARGE = "message_too_large"
# The server is still loading its models (it answers while it does; GET /healthz says
# ``loading: ...`` until it is ready): nothing was started; connect again in a few seconds.
# world.v1, tts.v1 and OpenPI (its text's first word) refuse the connection with it and
# close with close_codes.CLOSE_TRY_AGAIN_LATER (1013).
LOADING = "loading"
