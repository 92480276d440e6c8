"""Hypothesis strategies for hostile client frames of each protocol (world.v1, tts.v1, OpenPI).

A case is a ``Frame``: text or binary, as a client can put it on the wire. Each
protocol's strategy mixes

* valid messages with one field mutated (a random JSON value, removed, or an extra
  field), so most cases get past the envelope and reach the field checks;
* serialised text mutated after the fact (truncated, a character inserted, a huge
  number literal or ~1,000 levels of nesting spliced in, NaN/Infinity tokens);
* unicode edge cases (lone surrogates as JSON escapes, NUL and other controls, BOM,
  astral characters), binary where text is expected, text over the frame limit;
* for OpenPI: observations whose arrays carry bad dtypes, shapes, data lengths and
  numpy scalars, bad sampling params and session ids, batch and reset forms, random
  and mutated msgpack.

The fuzz tests (a few hundred cases each) and ``bench/fuzz/run_fuzz.py`` (10,000+
each) draw from these same strategies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgpack
from hypothesis import strategies as st

from protocols import tts_v1, world_v1


@dataclass(frozen=True)
class Frame:
    """One client WebSocket message."""

    data: str | bytes
    label: str  # which generator made it (for the benchmark's counts)

    @property
    def is_text(self) -> bool:
        return isinstance(self.data, str)


# ------------------------------------------------------------------ JSON pieces
NUMBER_LITERALS = ["9" * 400, "-" + "9" * 120, "1e400", "-1e400", "1e-400", "NaN", "Infinity", "-Infinity",
                   str(2**63), str(2**64), "-0", "0.0", "1" + "0" * 99, "1.5e308", "4.9e-324", "true", "null"]
EDGE_STRINGS = ["", " ", "\ud800", "\udfff", "a\ud83d", "\x00", "a\x00b", "\x07\x1b[0m", "\x7f", "\x85", "\ufeff",
                "\u2028", "\U0001f600", "e\u0301", "\u200d", "[[[{{{", '"', "\\", "\n\t\r", "x" * 5000]

json_scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40), st.sampled_from(EDGE_STRINGS),
)
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)), max_leaves=20)


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@st.composite
def mutated_text(draw: st.DrawFn, text: str) -> str:
    """``text`` with one textual mutation."""
    how = draw(st.sampled_from(["truncate", "insert", "number", "deep", "deep_object", "replace", "duplicate"]))
    i = draw(st.integers(0, len(text)))
    if how == "truncate":
        return text[:i]
    if how == "insert":
        return text[:i] + draw(st.sampled_from(list("{}[]\",:\\") + EDGE_STRINGS[:12])) + text[i:]
    if how == "number":
        return text[:i] + draw(st.sampled_from(NUMBER_LITERALS)) + text[i:]
    if how == "deep":
        return text[:i] + _deep(draw(st.integers(33, 5000))) + text[i:]
    if how == "deep_object":
        depth = draw(st.integers(33, 2000))
        return '{"type":"session.update","x":' + '{"a":' * depth + "1" + "}" * depth + "}"
    if how == "replace":
        j = draw(st.integers(i, len(text)))
        return text[:i] + draw(st.text(max_size=8)) + text[j:]
    return text + text


@st.composite
def mutated_message(draw: st.DrawFn, templates: list[dict[str, Any]]) -> dict[str, Any]:
    """A valid message of the protocol with one field changed, removed or added."""
    msg = dict(draw(st.sampled_from(templates)))
    fields = sorted(msg)
    how = draw(st.sampled_from(["value", "value", "number", "drop", "extra", "type", "none"]))
    if how == "value":
        msg[draw(st.sampled_from(fields))] = draw(json_values)
    elif how == "number":
        # Replaced after dumping: a literal json.dumps cannot write (huge, NaN, 1e400).
        msg[draw(st.sampled_from(fields))] = "__NUMBER__"
    elif how == "drop":
        msg.pop(draw(st.sampled_from(fields)))
    elif how == "extra":
        msg[draw(st.text(max_size=12))] = draw(json_values)
    elif how == "type":
        msg["type"] = draw(st.one_of(st.sampled_from(EDGE_STRINGS), json_values))
    return msg


def _dump(msg: dict[str, Any], literal: str) -> str:
    return json.dumps(msg).replace('"__NUMBER__"', literal)


@st.composite
def json_frames(draw: st.DrawFn, templates: list[dict[str, Any]], max_bytes: int) -> Frame:
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "text_mutated", "random_json", "random_text",
                                 "binary", "oversized", "valid"]))
    if kind == "valid":
        return Frame(json.dumps(draw(st.sampled_from(templates))), kind)
    if kind == "mutated":
        return Frame(_dump(draw(mutated_message(templates)), draw(st.sampled_from(NUMBER_LITERALS))), kind)
    if kind == "text_mutated":
        return Frame(draw(mutated_text(json.dumps(draw(st.sampled_from(templates))))), kind)
    if kind == "random_json":
        return Frame(json.dumps(draw(json_values)), kind)
    if kind == "random_text":
        return Frame(draw(st.text(max_size=200)), kind)
    if kind == "binary":
        return Frame(draw(st.one_of(st.binary(max_size=64), st.just(json.dumps(templates[0]).encode()))), kind)
    # Varied sizes and fillers: hypothesis never repeats an identical case, so a fixed
    # oversized frame would be tried only once per template.
    pad = draw(st.integers(1, max_bytes))
    filler = draw(st.sampled_from(["a", "\u00e9", "\U0001f600", " ", "["]))
    body = json.dumps({**draw(st.sampled_from(templates)), "pad": filler * (max_bytes + pad)}, ensure_ascii=False)
    return Frame(body, kind)


# ------------------------------------------------------------------ world.v1
WORLD_TEMPLATES: list[dict[str, Any]] = [
    {"type": "session.create", "session_id": "fuzz-1", "model": "tiny", "prompt": "a maze", "seed": 1,
     "format": "rgb8", "credits": 2},
    {"type": "event", "event_id": 1, "prompt": "left",
     "controls": [{"track": "keys", "schema": "keys.v1", "data": {"mode": "state", "held": ["w", "j"]}}]},
    {"type": "event", "event_id": 2,
     "controls": [{"track": "keys", "schema": "keys.v1", "data": {"mode": "script", "frames": [["w"], []]}}]},
    {"type": "credit", "chunks": 1},
    {"type": "session.reset"},
    {"type": "session.close"},
]


def world_frames() -> st.SearchStrategy[Frame]:
    return json_frames(WORLD_TEMPLATES, world_v1.MAX_TEXT_BYTES)


# ------------------------------------------------------------------ tts.v1
TTS_TEMPLATES: list[dict[str, Any]] = [
    {"type": "session.update", "voice": "en_US-joe-medium", "sample_rate": 24000, "format": "pcm16", "speed": 1.5},
    {"type": "input.text", "text": "Hi."},
    {"type": "input.text", "text": " and"},
    {"type": "input.done"},
    {"type": "response.cancel"},
]


def tts_frames(*, with_close: bool = False) -> st.SearchStrategy[Frame]:
    templates = TTS_TEMPLATES + ([{"type": "session.close"}] if with_close else [])
    return json_frames(templates, tts_v1.MAX_FRAME_BYTES)


# ------------------------------------------------------------------ OpenPI
DTYPES = ["|u1", "<f4", ">f4", "<f8", "<i8", "|b1", "<f2", "<U4", "|S3", "|V8", "|O", "<c8", "(2,)<f4", "i4,i4",
          "<M8[s]", "<U2000000000", "bogus", "", "<f4 ", "float32"]
# msgpack carries ints in [-2**63, 2**64); anything else cannot even be sent.
msgpack_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40), st.sampled_from(EDGE_STRINGS),
    st.binary(max_size=16),
)
msgpack_values = st.recursive(msgpack_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.one_of(st.text(max_size=10), st.binary(max_size=4)), inner,
                                                 max_size=5)), max_leaves=20)
SCALAR_DATA = st.one_of(msgpack_scalars, st.binary(max_size=8), st.lists(st.integers(-5, 5), max_size=3),
                        st.sampled_from([2**64 - 1, -(2**63), 2**63, 1e308, float("nan")]))


def policy_metadata_template(meta: dict[str, Any]) -> dict[str, Any]:
    """A valid observation for the server's metadata (first frame), as plain msgpack values."""
    h, w = meta["image_resolution"]
    obs: dict[str, Any] = {key: _array("|u1", [h, w, 3], bytes(h * w * 3)) for key in meta["image_keys"]}
    obs[meta["state_key"]] = _array("<f4", [meta["state_dim"]], bytes(4 * meta["state_dim"]))
    obs[meta["prompt_key"]] = "pick up the cube"
    return obs


def _array(dtype: Any, shape: Any, data: Any) -> dict[bytes, Any]:
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}


@st.composite
def bad_arrays(draw: st.DrawFn) -> Any:
    dtype = draw(st.one_of(st.sampled_from(DTYPES), msgpack_scalars))
    shape = draw(st.one_of(
        st.lists(st.integers(min_value=-2, max_value=8), max_size=4),
        st.lists(st.sampled_from([0, 2**31, 2**63, 2**64 - 1, -1, True, 1.0]), max_size=3),
        st.just([1] * 40), msgpack_values))
    data = draw(st.one_of(st.binary(max_size=64), msgpack_scalars))
    arr = _array(dtype, shape, data)
    if draw(st.booleans()):
        arr.pop(draw(st.sampled_from([b"data", b"dtype", b"shape"])))
    if draw(st.integers(0, 4)) == 0:
        return {b"__npgeneric__": True, b"data": draw(SCALAR_DATA), b"dtype": dtype}
    return arr


@st.composite
def openpi_frames(draw: st.DrawFn, valid: dict[str, Any]) -> Frame:
    """Frames for a policy whose valid observation is ``valid`` (see ``policy_metadata_template``)."""
    kind = draw(st.sampled_from(["field", "field", "array", "sampling", "session", "batch", "reset",
                                 "random_msgpack", "mutated_bytes", "text", "deep", "valid"]))
    obs = dict(valid)
    keys = sorted(obs)
    if kind == "valid":
        pass
    elif kind == "field":
        key = draw(st.one_of(st.sampled_from(keys), st.text(max_size=8)))
        obs[key] = draw(st.one_of(msgpack_values, bad_arrays(), st.binary(max_size=16)))
    elif kind == "array":
        obs[draw(st.sampled_from(keys))] = draw(bad_arrays())
    elif kind == "sampling":
        obs["sampling_params"] = draw(st.one_of(
            msgpack_values, st.fixed_dictionaries({}, optional={
                "num_inference_steps": st.one_of(msgpack_scalars, st.sampled_from([0, 1, 1000, 1001, 2**64 - 1])),
                "seed": st.one_of(msgpack_scalars, st.sampled_from([-1, 2**63, 2**64 - 1]))})))
    elif kind == "session":
        obs["session_id"] = draw(st.one_of(msgpack_scalars, st.text(max_size=140)))
    elif kind == "batch":
        items = draw(st.lists(st.one_of(st.just(valid), msgpack_values, st.builds(lambda a: {**valid, "x": a},
                                                                              bad_arrays())), max_size=3))
        obs = {"batch": items} if draw(st.booleans()) else {"batch": items, **draw(st.dictionaries(
            st.text(max_size=6), msgpack_scalars, max_size=2))}
    elif kind == "reset":
        obs = {"endpoint": draw(st.one_of(st.just("reset"), msgpack_scalars)),
               **draw(st.fixed_dictionaries({}, optional={"session_id": msgpack_scalars, "extra": msgpack_scalars}))}
    if kind == "random_msgpack":
        return Frame(_pack(draw(msgpack_values)), kind)
    if kind == "deep":
        depth = draw(st.integers(100, 100_000))
        return Frame(draw(st.sampled_from([b"\x91", b"\x81\xa1k"])) * depth + b"\xc0", kind)
    if kind == "text":
        return Frame(draw(st.one_of(st.text(max_size=50), st.just(json.dumps({"prompt": "x"})))), kind)
    body = _pack(obs)
    if kind == "mutated_bytes":
        packed = msgpack.packb(valid)
        i = draw(st.integers(0, len(packed) - 1))
        how = draw(st.sampled_from(["truncate", "flip", "insert"]))
        if how == "truncate":
            body = packed[:i]
        elif how == "flip":
            body = packed[:i] + bytes([packed[i] ^ draw(st.integers(1, 255))]) + packed[i + 1:]
        else:
            body = packed[:i] + draw(st.binary(min_size=1, max_size=9)) + packed[i:]
    return Frame(body, kind)


def _pack(obj: Any) -> bytes:
    """msgpack bytes of ``obj``; what msgpack itself refuses (a lone surrogate cannot be
    UTF-8) becomes a still-hostile stand-in rather than a generator error."""
    try:
        return msgpack.packb(obj)
    except (TypeError, ValueError, OverflowError):
        return msgpack.packb({"unpackable": True, "prompt": b"\xed\xa0\x80"})
