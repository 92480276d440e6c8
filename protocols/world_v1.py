"""world.v1: the wire format of ``WS /v1/realtime/world`` (pure Python, no torch; see
docs/protocols.md).

JSON text frames carry control; each one is an object with a ``type``. Binary frames
(server to client only) carry encoded frames, exactly ``frames`` of them right after
each ``chunk`` message (or each ``chunk.frames`` message of a session created with
``stream_frames``).

Client -> server
    ``session.create``  {session_id, model?, prompt?, seed?, format?, credits?, options?,
                        image?, stream_frames?, bitrate_kbps?, profile?}; an ``image`` is the
                        binary frame that follows; ``bitrate_kbps`` and ``profile`` go with
                        ``format: "h264"`` only
    ``event``           {event_id, prompt?, controls?}: a new prompt and at most one update
                        per control track, applied at the next chunk boundary
    ``credit``          {chunks}: the server may run that many more chunks ahead
    ``keyframe``        {}: the next frame of an ``h264`` session is an IDR (one a chunk at most)
    ``session.reset``   {}
    ``session.close``   {session_id?}

Server -> client
    ``session.created`` {session_id, model, height, width, frames_per_chunk, fps, format, credits,
                        codec?}: ``codec`` (h264 only) is WebCodecs' ``avc1.PPCCLL``
    ``event.accepted``  {event_id, status}
    ``chunk.frames``    {session_id, request_id, chunk_index, first, frames, format, height,
                        width}, then ``frames`` binary frames (``stream_frames`` sessions)
    ``chunk``           {session_id, request_id, chunk_index, applied_event_ids, frames,
                        format, height, width, tick_ms, streamed?, info?}, then ``frames``
                        binary frames
    ``session.reset``   {session_id, chunk_index, dropped_event_ids}
    ``session.closed``  {session_id, dropped_event_ids}
    ``error``           {code, message, event_id?, pending_event_ids?}

``parse_client`` raises ``ProtocolError`` with one of ``ERROR_CODES``; the endpoint
answers with ``error`` and keeps the session. A field a message does not define is
refused (a misspelt ``chunks`` would otherwise be dropped without a word). This module
only parses and builds messages; it knows nothing of sessions or models.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Union

from protocols import close_codes, errors, jsonsafe
from protocols.echo import listed, shown

PATH = "/v1/realtime/world"
MAX_TEXT_BYTES = 64 * 1024
MAX_CREDITS = 64
DEFAULT_CREDITS = 4
FORMATS = ("jpeg", "png", "rgb8", "h264")
# ``format: "h264"``: one H.264 stream per session (one Annex B access unit a binary frame),
# with its own create fields. The default bitrate is sized for 480x832 at 16 fps.
H264_PROFILES = ("baseline", "main")
DEFAULT_H264_PROFILE = "baseline"
DEFAULT_BITRATE_KBPS = 2500
MIN_BITRATE_KBPS = 100
MAX_BITRATE_KBPS = 20000
# The quality of every ``jpeg`` frame, whichever encoder makes it (PIL on the server's pool,
# nvJPEG on the GPU for frames a model made there).
JPEG_QUALITY = 92
# session.create "options": model-declared settings (GET /v1/models lists each model's).
MAX_CREATE_OPTIONS = 16
# A first image (``session.create`` with ``image``): its formats and most bytes.
IMAGE_FORMATS = ("png", "jpeg")
MAX_IMAGE_BYTES = 8 << 20
# A chunk's ``info`` (model facts about the chunk, e.g. a simulator's pose and goal): a JSON
# object of at most this many bytes, checked where the model hands it over (models/world/base.py).
MAX_CHUNK_INFO_BYTES = 4096
# Limits of an ``event``.
MAX_PROMPT_CHARS = 2000
# One entry per track, and there are only a few tracks; the cap bounds the work a
# single event can ask for before the track names are even looked at.
MAX_CONTROLS = 16
# Event ids are client-chosen; keep them in a range every consumer can store.
MAX_EVENT_ID = 2**63 - 1

# Codes every protocol that has them spells the same (protocols/errors.py); a client of
# world.v1 finds them here.
BAD_REQUEST = errors.BAD_REQUEST
UNKNOWN_TYPE = errors.UNKNOWN_TYPE
MESSAGE_TOO_LARGE = errors.MESSAGE_TOO_LARGE  # a text frame over MAX_TEXT_BYTES; close CLOSE_TOO_BIG follows
INTERNAL = errors.INTERNAL  # the engine is unavailable, or a close's cleanup failed (retry session.close)
CLOSED_BY_ADMIN = errors.CLOSED_BY_ADMIN  # an operator closed the session (DELETE /v1/sessions/...)
IDLE_TIMEOUT = errors.IDLE_TIMEOUT  # no message and no chunk taken for the server's idle timeout
TOO_MANY_SESSIONS = errors.TOO_MANY_SESSIONS  # the client address holds its limit of live sessions
LOADING = errors.LOADING  # the server is still loading its models: connect again later; close 1013
# A format this server cannot encode (``h264`` without PyAV's libx264); the message names what is missing.
FORMAT_UNAVAILABLE = "format_unavailable"
# Codes of world.v1 alone; the session layer raises them too (``sessions.ErrorCode`` is
# the same codes as one type).
STALE_EVENT = "stale_event"
QUEUE_FULL = "queue_full"
SESSION_EXISTS = "session_exists"
NO_SESSION = "no_session"
SESSION_FAILED = "session_failed"
SESSION_EVICTED = "session_evicted"
SESSION_CLOSED = "session_closed"
BUSY = "busy"

ERROR_CODES = frozenset(
    {
        BAD_REQUEST,
        UNKNOWN_TYPE,
        STALE_EVENT,
        QUEUE_FULL,
        SESSION_EXISTS,
        NO_SESSION,
        SESSION_FAILED,
        MESSAGE_TOO_LARGE,
        INTERNAL,
        SESSION_EVICTED,
        SESSION_CLOSED,
        BUSY,
        CLOSED_BY_ADMIN,
        IDLE_TIMEOUT,
        TOO_MANY_SESSIONS,
        FORMAT_UNAVAILABLE,
        LOADING,
    }
)

# WebSocket close codes for protocol violations (RFC 6455).
CLOSE_UNSUPPORTED_DATA = 1003  # a binary frame from the client
CLOSE_TOO_BIG = 1009  # a frame over MAX_TEXT_BYTES
# The server is draining (SIGTERM): the session was closed after its last committed chunk.
CLOSE_GOING_AWAY = close_codes.CLOSE_GOING_AWAY


class ProtocolError(ValueError):
    """A client message that cannot be accepted; answered with an ``error``. ``code`` is
    one of ``ERROR_CODES``; ``event_id`` is the one the message carries, when it can be
    read; ``message_type`` is the message's ``type`` when the message was refused for one
    of its fields (None when the frame is not a message of a known type)."""

    def __init__(self, code: str, message: str, *, event_id: int | None = None,
                 message_type: str | None = None) -> None:
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message
        self.event_id = event_id
        self.message_type = message_type


# --- client messages --------------------------------------------------------------------


@dataclass(frozen=True)
class ImageSpec:
    """``session.create``'s ``image``: the binary message of ``bytes`` bytes that follows."""

    format: str
    bytes: int

    def to_wire(self) -> dict[str, Any]:
        return {"format": self.format, "bytes": self.bytes}


@dataclass(frozen=True)
class CreateRequest:
    """``session.create``; ``to_wire`` leaves out what equals the default."""

    type: ClassVar[str] = "session.create"
    session_id: str
    model: str | None = None
    prompt: str | None = None
    seed: int = 0
    format: str = "jpeg"
    credits: int = DEFAULT_CREDITS
    options: Mapping[str, Any] = field(default_factory=dict)
    image: ImageSpec | None = None
    # Frames sent as they are decoded (``chunk.frames``), the ``chunk`` commit after them.
    stream_frames: bool = False
    # ``h264`` only (parsed with their defaults there; None with any other format).
    bitrate_kbps: int | None = None
    profile: str | None = None

    def to_wire(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"type": self.type, "session_id": self.session_id}
        if self.stream_frames:
            msg["stream_frames"] = True
        if self.options:
            msg["options"] = dict(self.options)
        for key, value, default in (("model", self.model, None), ("prompt", self.prompt, None),
                                    ("seed", self.seed, 0), ("format", self.format, "jpeg"),
                                    ("credits", self.credits, DEFAULT_CREDITS)):
            if value != default:
                msg[key] = value
        if self.image is not None:
            msg["image"] = self.image.to_wire()
        if self.bitrate_kbps is not None:
            msg["bitrate_kbps"] = self.bitrate_kbps
        if self.profile is not None:
            msg["profile"] = self.profile
        return msg


@dataclass(frozen=True)
class Control:
    """One update of one control track in an ``event``. ``data`` is the decoded JSON
    object as sent; what it means (and its deep freeze) is the session's business,
    since the session owns the control schemas."""

    track: str
    schema: str
    data: Mapping[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return {"track": self.track, "schema": self.schema, "data": dict(self.data)}


@dataclass(frozen=True)
class Event:
    """``event``: an optional new prompt and at most one update per control track."""

    type: ClassVar[str] = "event"
    event_id: int
    prompt: str | None = None
    controls: tuple[Control, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"type": self.type, "event_id": self.event_id,
                               "controls": [control.to_wire() for control in self.controls]}
        if self.prompt is not None:
            msg["prompt"] = self.prompt
        return msg


@dataclass(frozen=True)
class Credit:
    """``credit``: let the server run ``chunks`` more chunks ahead."""

    type: ClassVar[str] = "credit"
    chunks: int

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.type, "chunks": self.chunks}


@dataclass(frozen=True)
class Keyframe:
    """``keyframe``: the next encoded frame of an ``h264`` session is an IDR (at most one a chunk)."""

    type: ClassVar[str] = "keyframe"

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.type}


@dataclass(frozen=True)
class Reset:
    """``session.reset``."""

    type: ClassVar[str] = "session.reset"

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.type}


@dataclass(frozen=True)
class Close:
    """``session.close``; ``session_id`` retries a tombstone from another connection."""

    type: ClassVar[str] = "session.close"
    session_id: str | None = None

    def to_wire(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"type": self.type}
        if self.session_id is not None:
            msg["session_id"] = self.session_id
        return msg


ClientMessage = Union[CreateRequest, Event, Credit, Keyframe, Reset, Close]

# The keys.v1 key names (WASD move, IJKL look), in the order every model reads its 8 action
# bits; the one definition of that order.
KEY_NAMES: tuple[str, ...] = ("w", "a", "s", "d", "i", "j", "k", "l")


def keys_control(data: Mapping[str, Any]) -> Control:
    """One ``keys.v1`` control of an event (``{"mode": "state", "held": [...]}`` or a script)."""
    return Control("keys", "keys.v1", dict(data))


# --- encoding and server messages -------------------------------------------------------


def encode(message: ClientMessage | Mapping[str, Any]) -> str:
    """One JSON text frame: a client message, or a server message one of the builders
    below made. Compact; non-ASCII characters are escaped, as in every world.v1 frame."""
    obj = message if isinstance(message, Mapping) else message.to_wire()
    return json.dumps(obj, separators=(",", ":"))


def error(code: str, message: str, *, event_id: int | None = None,
          pending_event_ids: list[int] | None = None) -> dict[str, Any]:
    """The ``error`` for ``code`` (one of ``ERROR_CODES``): ``event_id`` when it concerns
    one event; ``pending_event_ids`` (``session_failed``, ``session_evicted``) the accepted
    events no chunk applied."""
    if code not in ERROR_CODES:
        raise ValueError("unknown error code %r" % code)
    msg: dict[str, Any] = {"type": "error", "code": code, "message": message}
    if event_id is not None:
        msg["event_id"] = event_id
    if pending_event_ids is not None:
        msg["pending_event_ids"] = pending_event_ids
    return msg


def created(session_id: str, model: str, *, height: int, width: int, frames_per_chunk: int, fps: float,
            format: str, credits: int, codec: str | None = None) -> dict[str, Any]:
    """``codec``: an ``h264`` session's WebCodecs codec string; sent only when given."""
    msg = {
        "type": "session.created",
        "session_id": session_id,
        "model": model,
        "height": height,
        "width": width,
        "frames_per_chunk": frames_per_chunk,
        "fps": fps,
        "format": format,
        "credits": credits,
    }
    if codec is not None:
        msg["codec"] = codec
    return msg


def event_accepted(event_id: int, status: str) -> dict[str, Any]:
    return {"type": "event.accepted", "event_id": event_id, "status": status}


def chunk(session_id: str, request_id: str, chunk_index: int, applied_event_ids: list[int], *, frames: int,
          format: str, height: int, width: int, tick_ms: float, streamed: int | None = None,
          info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The commit of a chunk; ``frames`` binary messages follow. A streamed chunk has
    ``frames: 0`` and ``streamed: N``: its N frames came before, in ``chunk.frames``.
    ``info``: the model's facts about the chunk (``info_problem`` checked), sent when given."""
    msg = {
        "type": "chunk",
        "session_id": session_id,
        "request_id": request_id,
        "chunk_index": chunk_index,
        "applied_event_ids": applied_event_ids,
        "frames": frames,
        "format": format,
        "height": height,
        "width": width,
        "tick_ms": round(tick_ms, 3),
    }
    if streamed is not None:
        msg["streamed"] = streamed
    if info is not None:
        msg["info"] = dict(info)
    return msg


def info_problem(info: Any) -> str | None:
    """What keeps ``info`` from going out as a chunk's ``info`` (None: nothing): it must be a
    JSON object (str keys; finite numbers, strings, bools, null, lists and objects of them)
    of at most ``MAX_CHUNK_INFO_BYTES`` bytes."""
    if not isinstance(info, Mapping):
        return f"chunk info must be a mapping, got {type(info).__name__}"
    try:
        text = json.dumps(info, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        return f"chunk info is not JSON ({exc})"
    if len(text.encode()) > MAX_CHUNK_INFO_BYTES:
        return f"chunk info of {len(text.encode())} bytes is over {MAX_CHUNK_INFO_BYTES}"
    return None


def chunk_frames(session_id: str, request_id: str, chunk_index: int, *, first: int, frames: int,
                 format: str, height: int, width: int) -> dict[str, Any]:
    """Frames ``first .. first+frames-1`` of a chunk not committed yet; ``frames`` binary
    messages follow. Its ``chunk`` (the commit) comes after all of them, or an ``error``."""
    return {"type": "chunk.frames", "session_id": session_id, "request_id": request_id,
            "chunk_index": chunk_index, "first": first, "frames": frames, "format": format,
            "height": height, "width": width}


def reset_done(session_id: str, dropped_event_ids: list[int]) -> dict[str, Any]:
    return {"type": "session.reset", "session_id": session_id, "chunk_index": 0,
            "dropped_event_ids": dropped_event_ids}


def closed(session_id: str, dropped_event_ids: list[int]) -> dict[str, Any]:
    return {"type": "session.closed", "session_id": session_id, "dropped_event_ids": dropped_event_ids}


# --- parsing ----------------------------------------------------------------------------

# The fields each client message defines; any other is refused, naming it.
_CREATE_FIELDS = frozenset({"type", "session_id", "model", "prompt", "seed", "format", "credits",
                            "options", "image", "stream_frames", "bitrate_kbps", "profile"})
_EVENT_FIELDS = frozenset({"type", "event_id", "prompt", "controls"})
_CREDIT_FIELDS = frozenset({"type", "chunks"})
_RESET_FIELDS = frozenset({"type"})
_KEYFRAME_FIELDS = frozenset({"type"})
_CLOSE_FIELDS = frozenset({"type", "session_id"})
_CONTROL_FIELDS = frozenset({"track", "schema", "data"})
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def parse_client(text: str, *, default_model: str | None = None) -> ClientMessage:
    """Validate one client text frame. A ``session.create`` that names no ``model`` gets
    ``default_model``. An error about a message carries the integer ``event_id`` the
    message holds, if any, so that a client can match the refusal to what it sent."""
    obj = _load_object(text)
    kind = obj["type"]
    try:
        if kind == CreateRequest.type:
            return _create(obj, default_model)
        if kind == Event.type:
            return _event(obj)
        if kind == Credit.type:
            return _credit(obj)
        if kind == Reset.type:
            return _reset(obj)
        if kind == Keyframe.type:
            _refuse_unknown(obj, _KEYFRAME_FIELDS)
            return Keyframe()
        return _close(obj)
    except ProtocolError as exc:
        exc.message_type = kind
        eid = obj.get("event_id")
        # isinstance, not type(...) is int: a bool event_id is echoed back too, as it always was.
        if exc.event_id is None and isinstance(eid, int):
            exc.event_id = eid
        raise


def _load_object(text: str) -> Mapping[str, Any]:
    """One frame as a JSON object with a ``type`` world.v1 has."""
    if jsonsafe.over_size(text, MAX_TEXT_BYTES):
        raise ProtocolError(MESSAGE_TOO_LARGE, f"text frame over {MAX_TEXT_BYTES} bytes")
    try:
        obj = jsonsafe.loads(text)
    except jsonsafe.JSONRejected as exc:
        raise ProtocolError(BAD_REQUEST, str(exc)) from None
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(obj):
        # JSON's \ud800 escapes decode to a lone surrogate, which no text encoder takes: a
        # prompt of one was accepted and then failed every tick of its session.
        eid = obj.get("event_id") if isinstance(obj, dict) and obj.get("type") == Event.type else None
        raise ProtocolError(BAD_REQUEST, "a string holds a lone surrogate (\\ud800-\\udfff without its pair): "
                                         "not Unicode text", event_id=eid if type(eid) is int else None)
    if not isinstance(obj, dict):
        raise ProtocolError(BAD_REQUEST, "a message must be a JSON object")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise ProtocolError(BAD_REQUEST, "a message needs a string 'type'")
    if kind not in _CLIENT_TYPES:
        raise ProtocolError(UNKNOWN_TYPE, f"unknown message type {shown(kind)}")
    return obj


_CLIENT_TYPES = frozenset(m.type for m in (CreateRequest, Event, Credit, Keyframe, Reset, Close))


def _has_lone_surrogate(obj: Any) -> bool:
    """Whether a decoded message holds a surrogate that is not half of a pair (json joins pairs)."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _refuse_unknown(obj: Mapping[str, Any], known: frozenset[str], event_id: int | None = None) -> None:
    unknown = sorted(str(k) for k in obj if k not in known)
    if unknown:
        raise ProtocolError(BAD_REQUEST, f"unknown {obj['type']} fields: {listed(unknown)}", event_id=event_id)


def _create(obj: Mapping[str, Any], default_model: str | None) -> CreateRequest:
    _refuse_unknown(obj, _CREATE_FIELDS)
    session_id = obj.get("session_id")
    if not isinstance(session_id, str) or not session_id:
        raise ProtocolError(BAD_REQUEST, "session.create needs a non-empty string session_id")
    model = obj.get("model", default_model)
    if model is not None and (not isinstance(model, str) or not model):
        raise ProtocolError(BAD_REQUEST, "model must be a non-empty string (or left out for the default)")
    prompt = obj.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise ProtocolError(BAD_REQUEST, "prompt must be a string")
    seed = obj.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise ProtocolError(BAD_REQUEST, "seed must be an integer in [0, 2^31)")
    fmt = obj.get("format", "jpeg")
    if fmt not in FORMATS:
        raise ProtocolError(BAD_REQUEST, f"format must be one of {', '.join(FORMATS)}")
    credits = _credits(obj.get("credits", DEFAULT_CREDITS), "credits")
    options = obj.get("options", {})
    # Only the shape is checked here; the model checks names and ranges (WorldAdapter.check_options).
    if not isinstance(options, dict) or len(options) > MAX_CREATE_OPTIONS or not all(
            isinstance(v, (str, int, float)) for v in options.values()):
        raise ProtocolError(BAD_REQUEST, f"options must be an object of at most {MAX_CREATE_OPTIONS} "
                                         "string or number values")
    image = _image(obj["image"]) if obj.get("image") is not None else None
    stream = obj.get("stream_frames", False)
    if not isinstance(stream, bool):
        raise ProtocolError(BAD_REQUEST, "stream_frames must be true or false")
    bitrate, profile = _h264_fields(obj, fmt)
    return CreateRequest(session_id, default_model if model is None else model, prompt, seed, fmt, credits, options,
                         image, stream, bitrate, profile)


def _h264_fields(obj: Mapping[str, Any], fmt: str) -> tuple[int | None, str | None]:
    """``bitrate_kbps`` and ``profile``: with ``h264`` checked and defaulted, with any other format refused."""
    if fmt != "h264":
        given = [name for name in ("bitrate_kbps", "profile") if name in obj]
        if given:
            raise ProtocolError(BAD_REQUEST, f"{listed(given)} go with format h264 only, not {fmt}")
        return None, None
    bitrate = obj.get("bitrate_kbps", DEFAULT_BITRATE_KBPS)
    if isinstance(bitrate, bool) or not isinstance(bitrate, int) or not MIN_BITRATE_KBPS <= bitrate <= MAX_BITRATE_KBPS:
        raise ProtocolError(BAD_REQUEST, f"bitrate_kbps must be an integer in "
                                         f"[{MIN_BITRATE_KBPS}, {MAX_BITRATE_KBPS}], got {shown(bitrate)}")
    profile = obj.get("profile", DEFAULT_H264_PROFILE)
    if profile not in H264_PROFILES:
        raise ProtocolError(BAD_REQUEST, f"profile must be one of {', '.join(H264_PROFILES)}, got {shown(profile)}")
    return bitrate, profile


def _image(spec: Any) -> ImageSpec:
    """``{"format": "png"|"jpeg", "bytes": N}`` with 1 <= N <= ``MAX_IMAGE_BYTES``."""
    if not isinstance(spec, dict) or set(spec) != {"format", "bytes"}:
        raise ProtocolError(BAD_REQUEST, 'image must be an object {"format": ..., "bytes": N}')
    fmt, size = spec["format"], spec["bytes"]
    if fmt not in IMAGE_FORMATS:
        raise ProtocolError(BAD_REQUEST, f"image format must be one of {', '.join(IMAGE_FORMATS)}, got {shown(fmt)}")
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_IMAGE_BYTES:
        raise ProtocolError(BAD_REQUEST, f"image bytes must be an integer in [1, {MAX_IMAGE_BYTES}]")
    return ImageSpec(fmt, size)


def _event(obj: Mapping[str, Any]) -> Event:
    """Checks the shape only (a bad field is ``bad_request`` naming it); whether a track
    exists and its data is valid is checked by the session, which owns the control schemas."""
    if "event_id" not in obj:
        raise ProtocolError(BAD_REQUEST, "event_id is required")
    eid = obj["event_id"]
    if type(eid) is not int or not 0 <= eid <= MAX_EVENT_ID:
        raise ProtocolError(BAD_REQUEST, f"event_id must be an integer in [0, {MAX_EVENT_ID}], got {shown(eid)}")
    _refuse_unknown(obj, _EVENT_FIELDS, eid)
    prompt = obj.get("prompt")
    problem = prompt_problem(prompt)
    if problem is not None:
        raise ProtocolError(BAD_REQUEST, problem, event_id=eid)
    raw_controls = obj.get("controls", ())
    if raw_controls is None:
        raw_controls = ()
    if not isinstance(raw_controls, (list, tuple)):
        raise ProtocolError(BAD_REQUEST, "controls must be a list", event_id=eid)
    if len(raw_controls) > MAX_CONTROLS:
        raise ProtocolError(BAD_REQUEST, f"controls: {len(raw_controls)} entries, at most {MAX_CONTROLS}",
                            event_id=eid)
    controls: list[Control] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(raw_controls):
        control = _control(raw, f"controls[{i}]", eid)
        if control.track in seen:
            raise ProtocolError(
                BAD_REQUEST,
                f"controls[{i}]: track {shown(control.track)} already updated by "
                f"controls[{seen[control.track]}]; one update per track per event",
                event_id=eid,
            )
        seen[control.track] = i
        controls.append(control)
    return Event(eid, prompt, tuple(controls))


def _control(raw: Any, where: str, eid: int) -> Control:
    if not isinstance(raw, Mapping):
        raise ProtocolError(BAD_REQUEST, f"{where} must be an object", event_id=eid)
    fields = set(raw)
    if fields != _CONTROL_FIELDS:
        missing = sorted(_CONTROL_FIELDS - fields)
        extra = sorted(str(k) for k in fields - _CONTROL_FIELDS)
        detail = "; ".join(part for part in (f"missing {', '.join(missing)}" if missing else "",
                                             f"unknown {listed(extra)}" if extra else "") if part)
        raise ProtocolError(BAD_REQUEST, f"{where} needs exactly track, schema, data ({detail})", event_id=eid)
    track, schema, data = raw["track"], raw["schema"], raw["data"]
    if type(track) is not str or not track:
        raise ProtocolError(BAD_REQUEST, f"{where}.track must be a non-empty string", event_id=eid)
    if type(schema) is not str or not schema:
        raise ProtocolError(BAD_REQUEST, f"{where}.schema must be a non-empty string", event_id=eid)
    if not isinstance(data, Mapping):
        raise ProtocolError(BAD_REQUEST, f"{where}.data must be an object", event_id=eid)
    return Control(track, schema, data)


def _credit(obj: Mapping[str, Any]) -> Credit:
    _refuse_unknown(obj, _CREDIT_FIELDS)
    return Credit(_credits(obj.get("chunks"), "chunks", minimum=1))


def _reset(obj: Mapping[str, Any]) -> Reset:
    _refuse_unknown(obj, _RESET_FIELDS)
    return Reset()


def _close(obj: Mapping[str, Any]) -> Close:
    """The optional ``session_id`` names a session whose cleanup failed on an earlier
    connection (a retry by id); None closes this connection's session."""
    _refuse_unknown(obj, _CLOSE_FIELDS)
    session_id = obj.get("session_id")
    if session_id is not None and (not isinstance(session_id, str) or not session_id):
        raise ProtocolError(BAD_REQUEST, "session.close takes an optional non-empty string session_id")
    return Close(session_id)


def prompt_problem(prompt: Any, where: str = "prompt") -> str | None:
    """What is wrong with a prompt (None or a str of at most ``MAX_PROMPT_CHARS``
    characters), or None if nothing is."""
    if prompt is None:
        return None
    if type(prompt) is not str:
        return f"{where} must be a string or null, got {type(prompt).__name__}"
    if len(prompt) > MAX_PROMPT_CHARS:
        return f"{where}: {len(prompt)} characters, at most {MAX_PROMPT_CHARS}"
    return None


def _credits(value: Any, name: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_CREDITS:
        raise ProtocolError(BAD_REQUEST, f"{name} must be an integer in [{minimum}, {MAX_CREDITS}]")
    return value

