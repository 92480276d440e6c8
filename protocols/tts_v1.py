"""tts.v1: the wire format of ``WS /v1/realtime/tts`` (pure Python, no torch).

JSON text frames carry control; each one is an object with a ``type``. Binary
frames (server to client only) carry audio: PCM16 little-endian mono at the
session's ``sample_rate``, no header, belonging to the sentence of the latest
``audio.start``.

Client -> server
    ``session.update``  {voice?, sample_rate?, format?, speed?}  (partial; omitted
                        fields keep their value)
    ``input.text``      {text}: more text of the current utterance; any string of
                        1..MAX_TEXT_CHARS characters (whitespace-only is fine: it
                        separates streamed words; control characters other than
                        tab/LF/CR and lone surrogates are refused)
    ``input.done``      {}: flush the buffered text; the utterance ends
    ``response.cancel`` {}: barge-in; stop the current utterance's audio
    ``session.close``   {}

Server -> client
    ``session.updated``    {voice, sample_rate, format, speed, voices}
    ``audio.start``        {utterance_index, sentence_index, text, sample_rate}
    (binary PCM16 frames)
    ``audio.done``         {utterance_index, sentence_index, samples}
    ``response.done``      {utterance_index, sentences, samples}: every sentence of
                           an utterance ended by ``input.done`` has been sent
    ``response.cancelled`` {utterance_index}
    ``session.closed``     {}
    ``error``              {code, message}

``parse_client`` raises ``ProtocolError`` with one of ``ERROR_CODES``; the
endpoint answers with ``error`` and keeps the session. Unknown fields are
ignored so newer clients still work with this server.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar, Collection, Mapping, Union

from protocols import close_codes, errors, jsonsafe
from protocols.echo import shown

PROTOCOL = "tts.v1"
FORMATS = ("pcm16",)
SAMPLE_RATES = (22050, 24000)
DEFAULT_SAMPLE_RATE = 22050
MIN_SPEED, MAX_SPEED = 0.5, 2.0
MAX_TEXT_CHARS = 4096  # per input.text message
# Text a session holds not yet spoken: its unfinished sentence plus the sentences queued
# for the speaker (minutes of speech). More answers BUFFER_FULL and drops that message.
MAX_PENDING_TEXT_CHARS = 64 * 1024
# Sentences and utterance ends (input.done) queued for the speaker, however short.
MAX_PENDING_ITEMS = 1024
# One client text frame, as UTF-8. Any valid message fits: 4096 characters escaped as
# JSON take at most 12 bytes each ("\ud83d\ude00" for one astral character, 48 KiB).
# The transport's own limit (realtime/server/server.py, 80 MiB) is for OpenPI's bodies.
MAX_FRAME_BYTES = 64 * 1024

# Codes every protocol that has them spells the same (protocols/errors.py); a client of
# tts.v1 finds them here.
BAD_REQUEST = errors.BAD_REQUEST  # malformed JSON, not an object, wrong field type, binary frame
UNKNOWN_TYPE = errors.UNKNOWN_TYPE
MESSAGE_TOO_LARGE = errors.MESSAGE_TOO_LARGE  # a text frame over MAX_FRAME_BYTES
INTERNAL = errors.INTERNAL  # the engine is unavailable, or the model failed on this session's work
CLOSED_BY_ADMIN = errors.CLOSED_BY_ADMIN  # an operator closed the session (DELETE /v1/sessions/...)
IDLE_TIMEOUT = errors.IDLE_TIMEOUT  # no message and nothing spoken for the server's idle timeout
TOO_MANY_SESSIONS = errors.TOO_MANY_SESSIONS  # the client address holds its limit of live sessions
LOADING = errors.LOADING  # the server is still loading its models: connect again later; close 1013
# Codes of tts.v1 alone.
UNKNOWN_VOICE = "unknown_voice"
UNSUPPORTED_FORMAT = "unsupported_format"
UNSUPPORTED_RATE = "unsupported_rate"
BAD_SPEED = "bad_speed"
EMPTY_TEXT = "empty_text"
TEXT_TOO_LONG = "text_too_long"
INVALID_TEXT = "invalid_text"  # a control character or a lone surrogate in input.text
BUFFER_FULL = "buffer_full"  # past MAX_PENDING_TEXT_CHARS of unspoken text or MAX_PENDING_ITEMS
# Server-side conditions the endpoint reports.
TTS_UNAVAILABLE = "tts_unavailable"  # the tts extra is not installed
GOING_AWAY = "going_away"  # input.text / input.done / session.update while the server drains (SIGTERM)

# The server drained (SIGTERM): the utterance being spoken ended, then the socket closes.
CLOSE_GOING_AWAY = close_codes.CLOSE_GOING_AWAY

ERROR_CODES = frozenset(
    {
        BAD_REQUEST,
        UNKNOWN_TYPE,
        CLOSED_BY_ADMIN,
        IDLE_TIMEOUT,
        TOO_MANY_SESSIONS,
        LOADING,
        GOING_AWAY,
        BUFFER_FULL,
        UNKNOWN_VOICE,
        UNSUPPORTED_FORMAT,
        UNSUPPORTED_RATE,
        BAD_SPEED,
        EMPTY_TEXT,
        TEXT_TOO_LONG,
        INVALID_TEXT,
        MESSAGE_TOO_LARGE,
        TTS_UNAVAILABLE,
        INTERNAL,
    }
)


class ProtocolError(ValueError):
    """A message the session cannot accept; ``code`` is one of ``ERROR_CODES``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message


# --- messages ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionUpdate:
    type: ClassVar[str] = "session.update"
    voice: str | None = None
    sample_rate: int | None = None
    format: str | None = None
    speed: float | None = None


@dataclass(frozen=True)
class InputText:
    type: ClassVar[str] = "input.text"
    text: str


@dataclass(frozen=True)
class InputDone:
    type: ClassVar[str] = "input.done"


@dataclass(frozen=True)
class ResponseCancel:
    type: ClassVar[str] = "response.cancel"


@dataclass(frozen=True)
class SessionClose:
    type: ClassVar[str] = "session.close"


@dataclass(frozen=True)
class SessionUpdated:
    type: ClassVar[str] = "session.updated"
    voice: str
    sample_rate: int
    format: str
    speed: float
    voices: tuple[str, ...]


@dataclass(frozen=True)
class AudioStart:
    type: ClassVar[str] = "audio.start"
    utterance_index: int
    sentence_index: int
    text: str
    sample_rate: int


@dataclass(frozen=True)
class AudioDone:
    type: ClassVar[str] = "audio.done"
    utterance_index: int
    sentence_index: int
    samples: int


@dataclass(frozen=True)
class ResponseDone:
    type: ClassVar[str] = "response.done"
    utterance_index: int
    sentences: int
    samples: int


@dataclass(frozen=True)
class ResponseCancelled:
    type: ClassVar[str] = "response.cancelled"
    utterance_index: int


@dataclass(frozen=True)
class SessionClosed:
    type: ClassVar[str] = "session.closed"


@dataclass(frozen=True)
class Error:
    type: ClassVar[str] = "error"
    code: str
    message: str


ClientMessage = Union[SessionUpdate, InputText, InputDone, ResponseCancel, SessionClose]
ServerMessage = Union[SessionUpdated, AudioStart, AudioDone, ResponseDone, ResponseCancelled, SessionClosed, Error]
Message = Union[ClientMessage, ServerMessage]

_CLIENT_TYPES = {m.type: m for m in (SessionUpdate, InputText, InputDone, ResponseCancel, SessionClose)}
_SERVER_TYPES = {
    m.type: m for m in (SessionUpdated, AudioStart, AudioDone, ResponseDone, ResponseCancelled, SessionClosed, Error)
}


@dataclass(frozen=True)
class SessionConfig:
    """A session's current settings; ``session.update`` changes some of them."""

    voice: str
    sample_rate: int = DEFAULT_SAMPLE_RATE
    format: str = "pcm16"
    speed: float = 1.0

    def apply(self, update: SessionUpdate) -> "SessionConfig":
        changes = {f.name: getattr(update, f.name) for f in fields(update) if getattr(update, f.name) is not None}
        return replace(self, **changes)

    def updated(self, voices: Collection[str]) -> SessionUpdated:
        return SessionUpdated(self.voice, self.sample_rate, self.format, self.speed, tuple(voices))


# --- encoding ---------------------------------------------------------------------------


def to_dict(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"type": message.type}
    for f in fields(message):
        value = getattr(message, f.name)
        if value is None:
            continue
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def encode(message: Message) -> str:
    """One JSON text frame, ``type`` first, compact separators."""
    return json.dumps(to_dict(message), separators=(",", ":"), ensure_ascii=False)


def error(code: str, message: str) -> str:
    """The ``error`` frame for ``code`` (one of ``ERROR_CODES``)."""
    if code not in ERROR_CODES:
        raise ValueError("unknown error code %r" % code)
    return encode(Error(code, message))


# --- parsing ----------------------------------------------------------------------------

# What input.text may not carry: C0 controls except tab, LF and CR (line breaks end a
# sentence), DEL, C1 controls, and UTF-16 surrogates (a JSON "\ud800" escape without
# its pair). None of them is speech; a NUL breaks espeak, a lone surrogate cannot even
# be encoded back into the UTF-8 of audio.start.
_BAD_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def _load_object(raw: str | bytes | bytearray) -> Mapping[str, Any]:
    if not isinstance(raw, str):
        raise ProtocolError(BAD_REQUEST, "tts.v1 control messages are JSON text frames, not binary")
    if jsonsafe.over_size(raw, MAX_FRAME_BYTES):
        raise ProtocolError(MESSAGE_TOO_LARGE, "text frame over %d bytes" % MAX_FRAME_BYTES)
    try:
        obj = jsonsafe.loads(raw)
    except jsonsafe.JSONRejected as exc:
        raise ProtocolError(BAD_REQUEST, str(exc)) from None
    if not isinstance(obj, dict):
        raise ProtocolError(BAD_REQUEST, "a message must be a JSON object")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise ProtocolError(BAD_REQUEST, "a message needs a string 'type'")
    return obj


def _field(obj: Mapping[str, Any], name: str, kinds: tuple[type, ...], required: bool) -> Any:
    if name not in obj or (obj[name] is None and not required):
        if required:
            raise ProtocolError(BAD_REQUEST, "%s needs '%s'" % (obj["type"], name))
        return None
    value = obj[name]
    # bool is an int in Python but not a number here.
    if isinstance(value, bool) or not isinstance(value, kinds):
        expected = " or ".join(k.__name__ for k in kinds)
        raise ProtocolError(BAD_REQUEST, "%s.%s must be %s" % (obj["type"], name, expected))
    return value


def _session_update(obj: Mapping[str, Any], voices: Collection[str] | None) -> SessionUpdate:
    voice = _field(obj, "voice", (str,), False)
    rate = _field(obj, "sample_rate", (int,), False)
    fmt = _field(obj, "format", (str,), False)
    speed = _field(obj, "speed", (int, float), False)
    if voice is not None and voices is not None and voice not in voices:
        raise ProtocolError(UNKNOWN_VOICE, "unknown voice %s; available: %s" % (shown(voice), ", ".join(voices)))
    if rate is not None and rate not in SAMPLE_RATES:
        raise ProtocolError(
            UNSUPPORTED_RATE, "sample_rate %d is not supported; use one of %s" % (rate, ", ".join(map(str, SAMPLE_RATES)))
        )
    if fmt is not None and fmt not in FORMATS:
        raise ProtocolError(UNSUPPORTED_FORMAT, "format %s is not supported; use %s" % (shown(fmt), ", ".join(FORMATS)))
    if speed is not None:
        # Compared as is: Python compares int with float exactly (no float(), which
        # overflows for a huge int), and NaN fails both comparisons.
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ProtocolError(BAD_SPEED, "speed must be between %s and %s" % (MIN_SPEED, MAX_SPEED))
        speed = float(speed)
    return SessionUpdate(voice=voice, sample_rate=rate, format=fmt, speed=speed)


def _input_text(obj: Mapping[str, Any]) -> InputText:
    text = _field(obj, "text", (str,), True)
    if not text:
        raise ProtocolError(EMPTY_TEXT, "input.text needs non-empty text")
    if len(text) > MAX_TEXT_CHARS:
        raise ProtocolError(
            TEXT_TOO_LONG, "input.text carries %d characters; the limit is %d" % (len(text), MAX_TEXT_CHARS)
        )
    bad = _BAD_CHARS.search(text)
    if bad is not None:
        raise ProtocolError(
            INVALID_TEXT, "input.text has U+%04X at character %d (control characters other than tab, "
            "line feed and carriage return, and lone surrogates, are refused)" % (ord(bad.group()), bad.start())
        )
    return InputText(text)


def parse_client(raw: str | bytes, voices: Collection[str] | None = None) -> ClientMessage:
    """Validate one client frame. ``voices`` (when given) are the voice names
    ``session.update`` may choose."""
    obj = _load_object(raw)
    kind = obj["type"]
    if kind == SessionUpdate.type:
        return _session_update(obj, voices)
    if kind == InputText.type:
        return _input_text(obj)
    if kind in _CLIENT_TYPES:
        return _CLIENT_TYPES[kind]()
    raise ProtocolError(UNKNOWN_TYPE, "unknown message type %s" % shown(kind))


def parse_server(raw: str) -> ServerMessage:
    """Decode one server JSON frame (for clients)."""
    obj = _load_object(raw)
    cls = _SERVER_TYPES.get(obj["type"])
    if cls is None:
        raise ProtocolError(UNKNOWN_TYPE, "unknown message type %r" % obj["type"])
    try:
        kwargs = {f.name: obj[f.name] for f in fields(cls)}
    except KeyError as exc:
        raise ProtocolError(BAD_REQUEST, "%s lacks %s" % (obj["type"], exc)) from None
    if cls is SessionUpdated:
        kwargs["voices"] = tuple(kwargs["voices"])
    return cls(**kwargs)
