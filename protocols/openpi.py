"""OpenPI wire format: msgpack with numpy arrays, byte-compatible with ``openpi-client``.

The rules below were read off the installed client (``openpi_client`` 0.1.2:
``websocket_client_policy.py``, ``msgpack_numpy.py``) and the reference server
(``openpi_server`` 0.1.0, identical to openpi's ``websocket_policy_server.py``):

* The client connects with ``compression=None, max_size=None`` and no subprotocol,
  then reads ONE binary frame: the msgpack metadata dict.
* Then strictly one request/response at a time: ``pack(obs)`` out, one frame back.
  A binary reply is unpacked; a text reply is raised as ``RuntimeError(text)``.
* numpy arrays travel as msgpack maps with *bytes* keys::

      {b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": arr.dtype.str, b"shape": arr.shape}
      {b"__npgeneric__": True, b"data": scalar.item(), b"dtype": scalar.dtype.str}

  dtype kinds V (void/structured), O (object) and c (complex) are refused. Strings
  are msgpack str, bytes are msgpack bin (``use_bin_type``), map keys must be str
  or bytes (``strict_map_key``), and decoded arrays are read-only views of the
  received bytes: copy before mutating.
* ``np.float64`` is a subclass of ``float`` and ``np.str_`` of ``str``: msgpack packs
  them natively, so they never reach the ``__npgeneric__`` hook (nor do they here).

Our extensions, which the real client never sends and which never change what it
sees: ``session_id`` (per-robot state across calls), ``{"endpoint": "reset"}``,
``sampling_params`` and the batch form ``{"batch": [obs, ...]}``.

Client -> server (binary msgpack frames)
    observation  {<camera key>: uint8 [H, W, 3] ..., <state_key>: [state_dim],
                 <prompt_key>?, session_id?, sampling_params?, <other keys, passed on>}
    reset        {"endpoint": "reset", session_id?}
    batch        {"batch": [observation, ...]}

Server -> client
    metadata     ``PolicyMetadata.to_wire()``, once, before any request
    reply        ``infer_reply``, ``batch_reply`` or ``reset_reply``, one per request
    text frame   an error the real client raises as it is; the socket then closes:
                 ``invalid request: ...`` for a ``ProtocolError``, ``<code>: ...`` for
                 one of ``ERROR_CODES``

``parse_client`` raises ``ProtocolError`` naming the offending field. This module is
pure (msgpack + numpy): decode, validate, encode. The endpoint in
``realtime/endpoints/openpi.py`` does the I/O.
"""

from __future__ import annotations

import numbers
import re
import struct
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import msgpack
import numpy as np

from protocols import close_codes, errors
from protocols.echo import clipped, shown, shown_all

if TYPE_CHECKING:  # protocols/roboarena.py imports this module; its config is only held here
    from protocols.roboarena import RoboArenaConfig

# A request body above this is refused with an error frame (close 1011). Three
# 224x224 cameras pack to ~452 KB, so this leaves two orders of magnitude of room.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# The WebSocket server's own limit (uvicorn ``ws_max_size``) must be above this, so
# that an over-limit body still reaches the endpoint and gets a readable error;
# beyond the transport's limit the connection closes with 1009 and no text.
# Close code after an error frame; the reference server uses the same (INTERNAL_ERROR).
CLOSE_ERROR = close_codes.CLOSE_INTERNAL
# The server drained (SIGTERM): the reply in flight was sent, then the socket closes (the
# client's next recv raises websockets' ConnectionClosedOK).
CLOSE_GOING_AWAY = close_codes.CLOSE_GOING_AWAY
# Text frames that end a connection for a server limit start with a code, spelled as on
# world.v1 and tts.v1 (protocols/errors.py; the close codes are protocols/close_codes.py's):
IDLE_TIMEOUT = errors.IDLE_TIMEOUT  # no request for the server's idle timeout; close 4408
TOO_MANY_SESSIONS = errors.TOO_MANY_SESSIONS  # the client address, or this connection, holds its limit; close 1013
CLOSED_BY_ADMIN = errors.CLOSED_BY_ADMIN  # an operator closed the session (DELETE /v1/sessions/...); close 1008
LOADING = errors.LOADING  # the server is still loading its models: connect again later; close 1013
ERROR_CODES = frozenset({IDLE_TIMEOUT, TOO_MANY_SESSIONS, CLOSED_BY_ADMIN, LOADING})
# Observations per batch-form request.
MAX_BATCH_ITEMS = 64
MAX_PROMPT_CHARS = 8192
MAX_INFERENCE_STEPS = 1000
# The work one request may ask for: explicit num_inference_steps summed over its
# observations (1000 at batch 1, 15 each at batch 64). Items that name no steps run the
# model's own default, which the operator chose. 64 x 1000 once held the engine for minutes.
MAX_REQUEST_STEPS = 1000
# numpy's own limit (NPY_MAXDIMS of numpy 1.x); numpy raises beyond it, so check first.
MAX_ARRAY_DIMS = 32
# An array's dtype string: "<f4", "|u1", "<U12"... are a few characters; a longer one is
# refused before numpy parses it (a comma string is a record format to numpy).
MAX_DTYPE_CHARS = 16
# Items of one msgpack array or map in a body. Arrays travel as pack_array's bytes, so
# only a plain list (a state of floats) or the batch form is long; 60 million nils in a
# 57 MiB body took 1.4 s and 530 MB to decode on the event loop.
MAX_LIST_ITEMS = 65536
MAX_MAP_ITEMS = 65536
# Objects of a whole body: every value, key, array and map counts one (an array's bytes are
# one bin). The per-list limit alone let 1,000 lists of 65,535 empty lists through: a 63 MiB
# body that decoded to 4.7 GB of Python objects in 37 s on the event loop. Requests are a
# few dozen objects an observation (a batch of 64 with plain-list states: ~5,000); a state
# of 65,536 floats still fits.
MAX_OBJECTS = 2 * MAX_LIST_ITEMS

RESET_ENDPOINT = "reset"
# RoboArena's clients name the endpoint of every observation (protocols/roboarena.py).
INFER_ENDPOINT = "infer"
RESET_REPLY: Mapping[str, str] = MappingProxyType({"status": "reset successful"})
# Top-level request keys that belong to the protocol, never to the observation.
RESERVED_KEYS = frozenset({"session_id", "sampling_params", "endpoint", "batch"})

_REFUSED_KINDS = ("V", "O", "c")
# The state of a policy that takes none (read-only, shared by every observation).
_NO_STATE = np.zeros((0,), np.float32)
_NO_STATE.flags.writeable = False
_SAME_KEYS: Mapping[str, str] = MappingProxyType({})
_SESSION_ID = re.compile(r"^[A-Za-z0-9_.:@/+-]{1,128}$")
# numpy's dtypes of builtin types are singletons: "is" first, then the full comparison.
_UINT8 = np.dtype(np.uint8)
_FLOAT32 = np.dtype(np.float32)


class ProtocolError(ValueError):
    """A request the endpoint answers with the text frame ``invalid request: <message>``
    and close 1011.

    The message is short and names the offending field; it is sent to the robot."""


# --------------------------------------------------------------------------- codec


def _encode(obj: Any) -> Any:
    """msgpack ``default`` hook, identical in output to ``openpi_client.msgpack_numpy.pack_array``."""
    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind in _REFUSED_KINDS:
        raise ValueError(f"Unsupported dtype: {obj.dtype}")
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


# Accepted dtype strings seen so far ("|u1", "<f4", ...): a robot sends the same few every call.
_DTYPES: dict[str, np.dtype] = {}


def _dtype(spec: Any) -> np.dtype:
    dtype = _DTYPES.get(spec) if isinstance(spec, str) else None
    if dtype is not None:
        return dtype
    if not isinstance(spec, str):
        raise ProtocolError(f"array dtype must be a string, got {type(spec).__name__}")
    if len(spec) > MAX_DTYPE_CHARS:
        raise ProtocolError(f"unknown array dtype {shown(spec)}")
    try:
        # numpy parses a comma string as a record format: it raises SyntaxError, ValueError,
        # TypeError... for a malformed one; each is the client's bad dtype, not a bug here.
        dtype = np.dtype(spec)
    except Exception as exc:  # noqa: BLE001
        raise ProtocolError(f"unknown array dtype {shown(spec)}") from exc
    if dtype.kind in _REFUSED_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise ProtocolError(f"unsupported array dtype {shown(spec)}")
    length = dtype.itemsize // 4 if dtype.kind == "U" else dtype.itemsize
    if dtype.kind in "US" and (length == 0 or not spec.endswith(str(length))):
        # numpy wraps a string length past its int range ("<U1073741824" is "<U0"): not what was sent
        raise ProtocolError(f"unsupported array dtype {shown(spec)}")
    if len(_DTYPES) < 256:
        _DTYPES[spec] = dtype
    return dtype


def _decode(obj: dict) -> Any:
    """msgpack ``object_hook``: the reference ``unpack_array`` plus the checks it leaves to numpy."""
    if b"__ndarray__" in obj:
        data, shape = obj.get(b"data"), obj.get(b"shape")
        if not isinstance(data, bytes):
            raise ProtocolError("array data must be bytes")
        return _array(data, _dtype(obj.get(b"dtype")), shape)
    if b"__npgeneric__" in obj:
        return _scalar(_dtype(obj.get(b"dtype")), obj.get(b"data"))
    return obj


def _array(data: bytes | memoryview, dtype: np.dtype, shape: Any) -> np.ndarray:
    """An ``__ndarray__`` map's fields as a read-only view of ``data``, or a ``ProtocolError``."""
    if type(shape) is not list:
        raise ProtocolError("array shape must be a list of non-negative ints")
    if len(shape) > MAX_ARRAY_DIMS:
        raise ProtocolError(f"array shape has {len(shape)} dimensions, at most {MAX_ARRAY_DIMS}")
    count = 1
    for d in shape:
        if type(d) is not int or d < 0:
            raise ProtocolError("array shape must be a list of non-negative ints")
        # No real array of a bounded body has a longer axis; a zero-size array could
        # otherwise claim [0, 2**63] and make numpy raise instead of us.
        if d > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"array axis of {d} is over the {MAX_MESSAGE_BYTES} limit")
        count *= d
    if count * dtype.itemsize != len(data):
        raise ProtocolError(f"array data has {len(data)} bytes, shape {shape} of {dtype.str} needs "
                            f"{count * dtype.itemsize}")
    # A view of the immutable received bytes: read-only, as with the reference.
    return np.ndarray(buffer=data, dtype=dtype, shape=shape)


def _scalar(dtype: np.dtype, data: Any) -> np.generic:
    """A numpy scalar from what ``scalar.item()`` packed, range-checked before converting
    (numpy would raise, warn or wrap around on an out-of-range int)."""
    kind = dtype.kind
    if kind in "iu":
        info = np.iinfo(dtype)
        if type(data) is not int or not info.min <= data <= info.max:
            raise ProtocolError(f"numpy scalar of dtype {dtype.str} needs an int in [{info.min}, {info.max}]")
    elif kind == "b":
        if type(data) is not bool:
            raise ProtocolError(f"numpy scalar of dtype {dtype.str} needs a bool")
    elif kind == "f":
        if type(data) not in (int, float):
            raise ProtocolError(f"numpy scalar of dtype {dtype.str} needs a number")
        with np.errstate(over="ignore"):  # a float64 value beyond float16's range is inf there too
            return dtype.type(data)
    elif kind in "US":
        expected = str if kind == "U" else bytes
        if type(data) is not expected:
            raise ProtocolError(f"numpy scalar of dtype {dtype.str} needs a {expected.__name__}")
    else:  # datetimes and the like: item() gives objects msgpack cannot even pack
        raise ProtocolError(f"numpy scalars of dtype {dtype.str} are not accepted")
    try:
        return dtype.type(data)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"bad numpy scalar of dtype {dtype.str}") from exc


def make_packer() -> msgpack.Packer:
    """A reusable packer (one per connection; msgpack packers are not thread-safe)."""
    return msgpack.Packer(default=_encode)


def pack(obj: Any) -> bytes:
    """Encode ``obj`` exactly as ``openpi_client.msgpack_numpy.packb`` does."""
    return msgpack.packb(obj, default=_encode)


def unpack(data: bytes) -> Any:
    """Decode one message; anything malformed becomes a ``ProtocolError``."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(data)} bytes is over the {MAX_MESSAGE_BYTES} byte limit")
    if type(data) is bytes:
        flat = _unpack_flat(data)
        if flat is not None:
            return flat
    return _unpack_msgpack(data)


def _unpack_msgpack(data: bytes) -> Any:
    """Any message, by msgpack with ``_decode`` as its hook (the one source of errors)."""
    # Every object takes a byte at least: a shorter body cannot hold too many.
    if len(data) > MAX_OBJECTS and _object_count(data, MAX_OBJECTS) > MAX_OBJECTS:
        raise ProtocolError(f"body holds more than {MAX_OBJECTS} msgpack objects (values, keys, arrays and maps; "
                            "an array's data is one)")
    try:
        return msgpack.unpackb(data, object_hook=_decode, strict_map_key=True, raw=False,
                               max_array_len=MAX_LIST_ITEMS, max_map_len=MAX_MAP_ITEMS)
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types for bad input
        raise ProtocolError(f"body is not valid msgpack ({clipped(str(exc) or type(exc).__name__)})") from None


def _object_steps() -> list[int]:
    """Bytes of each msgpack object by its first byte, headers included; 0 for the types whose
    size follows the type byte (``_SIZED``) and for 0xC1, which msgpack never writes."""
    steps = [1] * 256  # fixints, fixmaps, fixarrays (their items are objects of their own), nil, bools
    for t in range(0xA0, 0xC0):  # fixstr: its length is in the type byte
        steps[t] = 1 + (t & 0x1F)
    steps[0xC1] = 0
    for t in _SIZED:
        steps[t] = 0
    for t, size in ((0xCA, 5), (0xCB, 9), (0xCC, 2), (0xCD, 3), (0xCE, 5), (0xCF, 9), (0xD0, 2), (0xD1, 3),
                    (0xD2, 5), (0xD3, 9), (0xD4, 3), (0xD5, 4), (0xD6, 6), (0xD7, 10), (0xD8, 18),
                    (0xDC, 3), (0xDD, 5), (0xDE, 3), (0xDF, 5)):
        steps[t] = size
    return steps


# bin, str and ext with a length field: (bytes of the length, bytes between it and the payload).
_SIZED = {0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0), 0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0),
          0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1)}
_STEPS = _object_steps()


def _object_count(data: bytes, limit: int) -> int:
    """The msgpack objects in ``data``, counted up to ``limit`` + 1 at most, from the type
    bytes alone (nothing is decoded; a bin or str payload is stepped over in one go).

    ``{"a": [1, 2]}`` is 5: the map, its key, the array and its two items. Counting
    stops at a byte msgpack never writes or at the end; malformed bodies are msgpack's
    to name."""
    n, p, count, steps = len(data), 0, 0, _STEPS
    while p < n and count <= limit:
        t = data[p]
        step = steps[t]
        count += 1
        if step:
            p += step
        elif t == 0xC1:
            break
        else:
            width, gap = _SIZED[t]
            p += 1 + width + gap + int.from_bytes(data[p + 1:p + 1 + width], "big")
    return count


# How openpi-client's pack_array writes every array: a map of 4 entries, in this order,
# {b"__ndarray__": True, b"data": <bin>, b"dtype": <str>, b"shape": <array of ints>}.
_ND_HEAD = b"\x84\xc4\x0b__ndarray__\xc3\xc4\x04data"
_ND_DTYPE = b"\xc4\x05dtype"
_ND_SHAPE = b"\xc4\x05shape"
_U16 = struct.Struct(">H").unpack_from
_U32 = struct.Struct(">I").unpack_from


def _unpack_flat(data: bytes) -> dict[str, Any] | None:
    """The usual request, decoded without copying its images; None for anything else.

    The usual request is what openpi-client sends every call: one map of str keys to
    arrays in ``pack_array``'s layout (above) or strings. msgpack would copy each
    array's bytes out of the message first (three cameras: ~450 KB a call, and the
    cache they evict); here a one-byte-per-item array (uint8: the cameras) is a
    read-only view of ``data`` itself. A wider one (the state) is copied, so that it
    is aligned as msgpack's copy was. The result is what ``_unpack_msgpack`` returns,
    arrays equal and read-only alike (tests/protocols/test_openpi_flat.py compares
    the two). Anything else (other value types, other layouts, a truncated, trailing
    or malformed body) is None, and msgpack decodes it or names the error. (A policy
    that keeps a camera array keeps the whole message alive with it.)
    """
    try:
        return _flat_map(data)
    except (IndexError, UnicodeDecodeError, struct.error, ProtocolError):
        return None


def _flat_map(b: bytes) -> dict[str, Any] | None:
    n, mv = len(b), memoryview(b)
    t = b[0]
    if 0x80 <= t <= 0x8F:  # fixmap
        count, p = t & 0x0F, 1
    elif t == 0xDE:  # map 16
        count, p = _U16(b, 1)[0], 3
    else:
        return None
    out: dict[str, Any] = {}
    objects = 1 + 2 * count  # as _object_count counts: the map, then a key and a value each
    for _ in range(count):
        key, p = _flat_str(b, mv, p, n)
        if key is None:
            return None
        t = b[p]
        value: Any
        if t == 0x84:
            if not b.startswith(_ND_HEAD, p):
                return None
            value, p = _flat_array(b, mv, p + len(_ND_HEAD), n)
            if value is None:
                return None
            objects += 8 + value.ndim  # the array's map: 4 keys, 4 values, the shape's items
        elif t == 0xC0:
            value, p = None, p + 1
        elif t == 0xC2 or t == 0xC3:
            value, p = t == 0xC3, p + 1
        else:
            value, p = _flat_str(b, mv, p, n)
            if value is None:
                return None
        out[key] = value
    # Over MAX_OBJECTS: msgpack's path names the error.
    return out if p == n and objects <= MAX_OBJECTS else None


def _flat_str(b: bytes, mv: memoryview, p: int, n: int) -> tuple[str | None, int]:
    """A msgpack str at ``p`` and the offset after it; (None, p) if there is none."""
    t = b[p]
    if 0xA0 <= t <= 0xBF:
        start, end = p + 1, p + 1 + (t & 0x1F)
    elif t == 0xD9:
        start = p + 2
        end = start + b[p + 1]
    elif t == 0xDA:
        start = p + 3
        end = start + _U16(b, p + 1)[0]
    else:
        return None, p
    if end > n:
        return None, p
    return str(mv[start:end], "utf-8"), end


def _flat_array(b: bytes, mv: memoryview, p: int, n: int) -> tuple[np.ndarray | None, int]:
    """The rest of a ``pack_array`` map after its head (``_ND_HEAD``): bin, dtype, shape.
    Checked by ``_array`` (its ``ProtocolError``: None from ``_unpack_flat``, and msgpack's path names it)."""
    t = b[p]
    if t == 0xC6:
        size, p = _U32(b, p + 1)[0], p + 5
    elif t == 0xC5:
        size, p = _U16(b, p + 1)[0], p + 3
    elif t == 0xC4:
        size, p = b[p + 1], p + 2
    else:
        return None, p
    start, p = p, p + size
    if p > n or not b.startswith(_ND_DTYPE, p):
        return None, p
    spec, p = _flat_str(b, mv, p + len(_ND_DTYPE), n)
    if spec is None or not b.startswith(_ND_SHAPE, p):
        return None, p
    p += len(_ND_SHAPE)
    t = b[p]
    if not 0x90 <= t <= 0x9F:  # fixarray: at most 15 dimensions, within MAX_ARRAY_DIMS
        return None, p
    p += 1
    shape = []
    for _ in range(t & 0x0F):  # non-negative ints only: what msgpack gives for these types
        t = b[p]
        if t <= 0x7F:
            d, p = t, p + 1
        elif t == 0xCC:
            d, p = b[p + 1], p + 2
        elif t == 0xCD:
            d, p = _U16(b, p + 1)[0], p + 3
        elif t == 0xCE:
            d, p = _U32(b, p + 1)[0], p + 5
        else:
            return None, p
        shape.append(d)
    dtype = _dtype(spec)
    view = mv[start:start + size]
    # One byte per item: a view of the received bytes; wider: a copy, aligned as msgpack's is.
    return _array(view if dtype.itemsize == 1 else bytes(view), dtype, shape), p


# --------------------------------------------------------------------------- metadata


@dataclass(frozen=True)
class PolicyMetadata:
    """What a policy advertises in the first frame and what observations are checked against."""

    action_horizon: int
    action_dim: int
    image_keys: tuple[str, ...]
    image_resolution: tuple[int, int]  # (H, W)
    state_dim: int
    state_key: str = "state"
    prompt_key: str = "prompt"
    # Anything else the policy wants the robot to know (wire-safe values only).
    extra: Mapping[str, Any] = field(default_factory=dict)
    # A camera may carry up to this many frames, [T, H, W, 3] (every camera the same T), as well
    # as one frame [H, W, 3]: a video policy's frames since its last call. Sent as "max_frames" when > 1.
    max_frames: int = 1
    # The longest prompt accepted; a policy with a short text window bounds it lower. Sent as
    # "max_prompt_chars" when below MAX_PROMPT_CHARS.
    max_prompt_chars: int = MAX_PROMPT_CHARS
    # RoboArena's server config, sent beside these keys; its cameras must be image_keys, and
    # observations must carry its state vectors (protocols/roboarena.py).
    roboarena: RoboArenaConfig | None = None

    def __post_init__(self) -> None:
        for name in ("action_horizon", "action_dim"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise ValueError(f"metadata {name} must be a positive int, got {getattr(self, name)!r}")
        if not _is_int(self.state_dim) or self.state_dim < 0:
            raise ValueError(f"metadata state_dim must be a non-negative int, got {self.state_dim!r}")
        res = tuple(self.image_resolution)
        if len(res) != 2 or not all(_is_int(v) and v > 0 for v in res):
            raise ValueError(f"metadata image_resolution must be [H, W], got {self.image_resolution!r}")
        keys = tuple(self.image_keys)
        names = (*keys, self.state_key, self.prompt_key)
        if not all(isinstance(k, str) and k for k in names) or len(set(names)) != len(names):
            raise ValueError(f"metadata keys must be distinct non-empty strings, got {names!r}")
        if RESERVED_KEYS & set(names):
            raise ValueError(f"metadata keys may not use the reserved {sorted(RESERVED_KEYS & set(names))}")
        if not _is_int(self.max_frames) or self.max_frames < 1:
            raise ValueError(f"metadata max_frames must be a positive int, got {self.max_frames!r}")
        if not _is_int(self.max_prompt_chars) or not 0 < self.max_prompt_chars <= MAX_PROMPT_CHARS:
            raise ValueError(f"metadata max_prompt_chars must be an int in [1, {MAX_PROMPT_CHARS}], "
                             f"got {self.max_prompt_chars!r}")
        arena = self.roboarena
        if arena is not None:
            if set(arena.camera_keys) != set(keys) or len(keys) != len(arena.camera_keys):
                raise ValueError(f"metadata image_keys {list(keys)} must be the roboarena cameras "
                                 f"{list(arena.camera_keys)}")
            if tuple(arena.image_resolution) != tuple(int(v) for v in res):
                raise ValueError(f"metadata image_resolution {list(res)} differs from roboarena's "
                                 f"{list(arena.image_resolution)}")
            if self.action_dim != arena.action_dim:
                raise ValueError(f"metadata action_dim {self.action_dim} differs from roboarena's "
                                 f"{arena.action_dim} ({arena.action_space})")
            clash = sorted(set(self.extra) & set(arena.to_wire()))
            if clash:
                raise ValueError(f"metadata extra {clash} would hide the roboarena config")
        object.__setattr__(self, "image_keys", keys)
        object.__setattr__(self, "image_resolution", (int(res[0]), int(res[1])))
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))
        object.__setattr__(self, "_named", frozenset({*keys, self.state_key, self.prompt_key, *RESERVED_KEYS}))
        object.__setattr__(self, "_image_shape", (*self.image_resolution, 3))
        object.__setattr__(self, "_state_shape", (self.state_dim,))

    def to_wire(self) -> dict[str, Any]:
        """The metadata dict sent as the first frame (plain types only)."""
        wire = {
            **self.extra,
            "action_horizon": int(self.action_horizon),
            "action_dim": int(self.action_dim),
            "image_keys": list(self.image_keys),
            "image_resolution": list(self.image_resolution),
            "state_dim": int(self.state_dim),
            "state_key": self.state_key,
            "prompt_key": self.prompt_key,
        }
        if self.max_frames > 1:
            wire["max_frames"] = int(self.max_frames)
        if self.max_prompt_chars < MAX_PROMPT_CHARS:
            wire["max_prompt_chars"] = int(self.max_prompt_chars)
        if self.roboarena is not None:
            wire.update(self.roboarena.to_wire())
        return wire

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> PolicyMetadata:
        """Build from a user policy's metadata dict; unknown keys go to ``extra``."""
        required = ("action_horizon", "action_dim", "image_keys", "image_resolution", "state_dim")
        missing = [k for k in required if k not in m]
        if missing:
            raise ValueError(f"policy metadata is missing {missing}")
        known = {*required, "state_key", "prompt_key"}
        return cls(
            action_horizon=int(m["action_horizon"]),
            action_dim=int(m["action_dim"]),
            image_keys=tuple(m["image_keys"]),
            image_resolution=tuple(m["image_resolution"]),
            state_dim=int(m["state_dim"]),
            state_key=m.get("state_key", "state"),
            prompt_key=m.get("prompt_key", "prompt"),
            extra={k: v for k, v in m.items() if k not in known},
        )

    @property
    def named_keys(self) -> frozenset[str]:
        """Every top-level key with a meaning of its own: cameras, state, prompt, protocol keys."""
        return self._named

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """Every camera's array shape: ``[H, W, 3]``."""
        return self._image_shape

    @property
    def state_shape(self) -> tuple[int]:
        return self._state_shape

    @property
    def action_shape(self) -> tuple[int, int]:
        return (self.action_horizon, self.action_dim)

    @property
    def needs_session_id(self) -> bool:
        """The policy keeps per-robot state under a client's ``session_id`` beyond one
        connection (RoboArena's ``needs_session_id``): see docs/protocols_openpi.md, Stateful policies."""
        return self.roboarena is not None and self.roboarena.needs_session_id


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class SamplingParams:
    """Per-call knobs from the ``sampling_params`` extension; None means the policy default."""

    num_inference_steps: int | None = None
    seed: int | None = None


# Frozen: one instance serves every request that sets no sampling_params.
_DEFAULT_SAMPLING = SamplingParams()


@dataclass(frozen=True)
class Observation:
    """A validated observation. Arrays are read-only; ``state`` is float32."""

    images: Mapping[str, np.ndarray] = field(repr=False)  # key -> uint8 [H, W, 3] (or [T, H, W, 3]: max_frames)
    state: np.ndarray = field(repr=False)  # float32 [state_dim]
    prompt: str | None
    # Keys the metadata does not name (non-image), passed to the policy as decoded.
    extras: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def as_dict(self, metadata: PolicyMetadata) -> dict[str, Any]:
        """The openpi-style dict a ``BasePolicy.infer`` expects (the keys as sent)."""
        out: dict[str, Any] = dict(self.extras)
        out.update(self.images)
        out[metadata.state_key] = self.state
        if self.prompt is not None:
            out[metadata.prompt_key] = self.prompt
        return out


@dataclass(frozen=True)
class InferRequest:
    observation: Observation
    session_id: str | None = None
    sampling: SamplingParams = SamplingParams()


@dataclass(frozen=True)
class ResetRequest:
    session_id: str | None = None


@dataclass(frozen=True)
class BatchRequest:
    items: tuple[InferRequest, ...]


Request = InferRequest | ResetRequest | BatchRequest


def parse_client(frame: bytes | str, metadata: PolicyMetadata) -> Request:
    """Validate one client frame (bytes, or str for a text frame) against the policy's
    ``metadata``."""
    if isinstance(frame, str):
        raise ProtocolError("expected a binary msgpack frame, got a text frame")
    return parse_request(unpack(frame), metadata)



def parse_request(msg: Any, metadata: PolicyMetadata) -> Request:
    """Classify and validate a decoded message. Raises ``ProtocolError`` naming the field."""
    if not isinstance(msg, dict):
        raise ProtocolError(f"request must be a msgpack map, got {_type_name(msg)}")
    _check_keys(msg, "request")
    if "endpoint" in msg:
        endpoint = msg["endpoint"]
        if not isinstance(endpoint, str):
            raise ProtocolError(f"endpoint must be a string, got {_describe(endpoint)}")
        if endpoint == INFER_ENDPOINT:  # RoboArena's observation: the same, named
            return _infer_request({k: v for k, v in msg.items() if k != "endpoint"}, metadata, "")
        if endpoint != RESET_ENDPOINT:
            raise ProtocolError(f"unknown endpoint {shown(endpoint)} (known: {INFER_ENDPOINT!r}, {RESET_ENDPOINT!r})")
        extra = set(msg) - {"endpoint", "session_id"}
        if extra:
            raise ProtocolError(f"reset takes only 'session_id', got {shown_all(sorted(extra))}")
        return ResetRequest(_session_id(msg.get("session_id"), "session_id"))
    if "batch" in msg:
        items = msg["batch"]
        if set(msg) != {"batch"}:
            raise ProtocolError(f"a batch request takes only 'batch', got {shown_all(sorted(set(msg) - {'batch'}))}")
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH_ITEMS:
            raise ProtocolError(f"'batch' must be a list of 1 to {MAX_BATCH_ITEMS} observations")
        parsed = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise ProtocolError(f"batch[{i}] must be a msgpack map, got {_type_name(item)}")
            _check_keys(item, f"batch[{i}]")
            if "batch" in item or "endpoint" in item:
                raise ProtocolError(f"batch[{i}] must be an observation")
            parsed.append(_infer_request(item, metadata, f"batch[{i}]."))
        steps = sum(p.sampling.num_inference_steps or 0 for p in parsed)
        if steps > MAX_REQUEST_STEPS:
            raise ProtocolError(f"the batch asks for {steps} num_inference_steps in all; one request may ask for at "
                                f"most {MAX_REQUEST_STEPS}")
        return BatchRequest(tuple(parsed))
    return _infer_request(msg, metadata, "")


def _infer_request(msg: dict, metadata: PolicyMetadata, where: str) -> InferRequest:
    return InferRequest(
        observation=validate_observation(msg, metadata, where),
        session_id=_session_id(msg.get("session_id"), where + "session_id"),
        sampling=_sampling(msg.get("sampling_params"), where + "sampling_params"),
    )


def validate_observation(msg: Mapping[str, Any], metadata: PolicyMetadata, where: str = "") -> Observation:
    """Check camera keys, image shape/dtype, state length and finiteness, prompt type and length,
    and a RoboArena policy's state vectors."""
    image_shape = metadata.image_shape
    images: dict[str, np.ndarray] = {}
    frames = None  # the T of the first camera sent as [T, H, W, 3]; None: one frame
    # Cameras a RoboArena client sent under its own numbering (their key -> the key sent).
    sent = metadata.roboarena.sent_cameras(msg) if metadata.roboarena is not None else _SAME_KEYS
    for key in metadata.image_keys:
        name = sent.get(key, key)
        if name not in msg:
            raise ProtocolError(f"missing camera {where}{name!r}")
        img = msg[name]
        if not isinstance(img, np.ndarray) or (img.dtype is not _UINT8 and img.dtype != _UINT8) \
                or (img.shape != image_shape and not _frames_ok(img, metadata)):
            h, w = metadata.image_resolution
            stack = f" or [T, {h}, {w}, 3] with T in [1, {metadata.max_frames}]" if metadata.max_frames > 1 else ""
            raise ProtocolError(f"camera {where}{name!r} must be uint8 [{h}, {w}, 3]{stack}, got {_describe(img)}")
        t = img.shape[0] if img.ndim == 4 else None
        if images and t != frames:
            first = sent.get(metadata.image_keys[0], metadata.image_keys[0])
            raise ProtocolError(f"camera {where}{name!r} has {_frame_count(t)}, {where}{first!r} "
                                f"has {_frame_count(frames)}: every camera must carry the same")
        frames = t
        images[key] = img

    if metadata.state_dim > 0 or metadata.state_key in msg:
        state = _state(msg.get(metadata.state_key), metadata, where)
    else:
        state = _NO_STATE

    prompt = msg.get(metadata.prompt_key)
    if prompt is not None:
        if not isinstance(prompt, str):
            raise ProtocolError(f"{where}{metadata.prompt_key!r} must be a string, got {_type_name(prompt)}")
        if len(prompt) > metadata.max_prompt_chars:
            raise ProtocolError(f"{where}{metadata.prompt_key!r} is over {metadata.max_prompt_chars} characters")
        prompt = str(prompt)

    vectors = metadata.roboarena.state_vectors(msg, where) if metadata.roboarena is not None else None
    extras = {}
    known = len(images) + (metadata.state_key in msg) + (metadata.prompt_key in msg)
    if len(msg) > known:  # more than cameras, state and prompt: look at the rest
        named = metadata.named_keys
        renamed = set(sent.values())
        for key, value in msg.items():
            if key in named or key in renamed:
                continue
            if _looks_like_image(value):
                raise ProtocolError(f"unknown camera key {where}{shown(key)} (this policy's cameras: "
                                    f"{list(metadata.image_keys)})")
            extras[key] = value
    if vectors:
        extras.update(vectors)
    return Observation(MappingProxyType(images), state, prompt, MappingProxyType(extras))


def _frames_ok(img: np.ndarray, metadata: PolicyMetadata) -> bool:
    return img.ndim == 4 and img.shape[1:] == metadata.image_shape and 1 <= img.shape[0] <= metadata.max_frames


def _frame_count(t: int | None) -> str:
    return "one frame [H, W, 3]" if t is None else f"{t} frames"


def _state(value: Any, metadata: PolicyMetadata, where: str) -> np.ndarray:
    if type(value) is np.ndarray and value.dtype is _FLOAT32 and value.shape == metadata.state_shape \
            and not value.flags.writeable:  # the usual case: read-only float32 of the right length
        if np.isfinite(value).all():
            return value
    return _state_checked(value, metadata, f"{where}{metadata.state_key!r}")


def _state_checked(value: Any, metadata: PolicyMetadata, name: str) -> np.ndarray:
    if value is None:
        raise ProtocolError(f"missing {name} (float32 [{metadata.state_dim}])")
    if isinstance(value, (list, tuple)) and all(_is_real(v) for v in value):
        value = np.asarray(value, dtype=np.float64)
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "fiu":
        raise ProtocolError(f"{name} must be a float32 array, got {_describe(value)}")
    if value.shape != (metadata.state_dim,):
        raise ProtocolError(f"{name} must have shape [{metadata.state_dim}], got {list(value.shape)}")
    # Any real dtype is accepted (robots often send float64); the policy gets float32.
    if value.dtype == np.float32 and not value.flags.writeable:
        state = value  # the usual case: a read-only view of the received bytes
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            state = value.astype(np.float32)
        state.flags.writeable = False
    if not np.isfinite(state).all():
        bad = int(np.flatnonzero(~np.isfinite(state))[0])
        if np.isfinite(value[bad]):  # finite as sent, past float32's range once converted
            raise ProtocolError(f"{name} has a value beyond float32's range (|x| > 3.4e38) at index {bad}")
        raise ProtocolError(f"{name} has a non-finite value (NaN or inf) at index {bad}")
    return state


def _sampling(value: Any, name: str) -> SamplingParams:
    if value is None:
        return _DEFAULT_SAMPLING
    if not isinstance(value, dict):
        raise ProtocolError(f"{name} must be a map, got {_type_name(value)}")
    unknown = set(value) - {"num_inference_steps", "seed"}
    if unknown:
        raise ProtocolError(f"unknown {name} {shown_all(sorted(map(str, unknown)))} (known: num_inference_steps, seed)")
    steps, seed = value.get("num_inference_steps"), value.get("seed")
    if steps is not None and (not _is_int(steps) or not 1 <= steps <= MAX_INFERENCE_STEPS):
        raise ProtocolError(f"{name}.num_inference_steps must be an int in [1, {MAX_INFERENCE_STEPS}]")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**63):
        raise ProtocolError(f"{name}.seed must be an int in [0, 2**63)")
    return SamplingParams(
        num_inference_steps=None if steps is None else int(steps),
        seed=None if seed is None else int(seed),
    )


def _session_id(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _SESSION_ID.match(value):
        raise ProtocolError(f"{name} must be 1-128 characters of [A-Za-z0-9_.:@/+-]")
    return str(value)


def _check_keys(msg: dict, name: str) -> None:
    for key in msg:
        if not isinstance(key, str):
            raise ProtocolError(f"{name} keys must be strings, got {_type_name(key)} key {shown(key)}")


def _looks_like_image(value: Any) -> bool:
    """A camera: a uint8 array of 2+ dims, or any array shaped [H, W, 3]."""
    if not isinstance(value, np.ndarray):
        return False
    return (value.dtype == np.uint8 and value.ndim >= 2) or (value.ndim == 3 and value.shape[-1] == 3)


# --------------------------------------------------------------------------- replies


def infer_reply(
    actions: np.ndarray,
    *,
    infer_ms: float,
    policy_infer_ms: float,
    prev_total_ms: float | None = None,
    outputs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One inference reply.

    ``infer_ms``: time from the request entering the engine to its result (queue
    wait + forward). ``policy_infer_ms``: the forward alone. ``prev_total_ms``: the
    previous request on this connection, from its receipt to its reply being sent
    (absent on the first reply, as with the reference server).
    """
    reply: dict[str, Any] = {"actions": actions}
    if outputs:
        reply.update((k, v) for k, v in outputs.items() if k not in ("actions", "server_timing", "policy_timing"))
    timing: dict[str, float] = {"infer_ms": float(infer_ms)}
    if prev_total_ms is not None:
        timing["prev_total_ms"] = float(prev_total_ms)
    reply["server_timing"] = timing
    reply["policy_timing"] = {"infer_ms": float(policy_infer_ms)}
    return reply


def batch_reply(replies: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {"batch": list(replies)}


def reset_reply() -> dict[str, str]:
    return dict(RESET_REPLY)


# --------------------------------------------------------------------------- helpers


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _type_name(v: Any) -> str:
    return {dict: "map", list: "array", str: "string", bytes: "bytes", type(None): "nil"}.get(type(v), type(v).__name__)


def _describe(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"{v.dtype.name} {list(v.shape)}"
    return _type_name(v)
