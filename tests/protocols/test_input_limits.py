"""Hostile input through the public parse functions of world.v1, tts.v1 and OpenPI.

Each case here once escaped as RecursionError, OverflowError or a silent failure
(issue 14); now each is one documented error code.
"""

from __future__ import annotations

import json

import msgpack
import numpy as np
import pytest

from protocols import jsonsafe, openpi, tts_v1, world_v1

VOICES = ("en_US-joe-medium",)
DEEP = "[" * 1000 + "]" * 1000


def world_code(text: str) -> str:
    with pytest.raises(world_v1.ProtocolError) as info:
        world_v1.parse_client(text, default_model="tiny")
    return info.value.code


def tts_code(text: str | bytes) -> str:
    with pytest.raises(tts_v1.ProtocolError) as info:
        tts_v1.parse_client(text, VOICES)
    assert info.value.code in tts_v1.ERROR_CODES
    return info.value.code


# ------------------------------------------------------------------ nesting
def test_deep_nesting_is_bad_request_in_world_v1():
    assert world_code('{"type":"session.create","session_id":"a","prompt":%s}' % DEEP) == "bad_request"
    assert world_code('{"type":"event","event_id":1,"controls":%s}' % DEEP) == "bad_request"
    assert world_code(DEEP) == "bad_request"
    assert world_code("{\"a\":" * 1000 + "1" + "}" * 1000) == "bad_request"


def test_deep_nesting_is_bad_request_in_tts_v1():
    assert tts_code('{"type":"input.text","text":"hi","x":%s}' % DEEP) == "bad_request"
    assert tts_code('{"type":"session.update","speed":%s}' % DEEP) == "bad_request"


def test_brackets_inside_strings_do_not_count_as_nesting():
    text = "[[[{{{" * 500 + '\\"]]]'
    msg = world_v1.parse_client(json.dumps({"type": "session.create", "session_id": "a", "prompt": text}))
    assert msg.prompt == text
    assert tts_v1.parse_client(json.dumps({"type": "input.text", "text": "[" * 4000})) == tts_v1.InputText("[" * 4000)


def test_nesting_depth_limit_is_exact():
    ok = "[" * jsonsafe.MAX_DEPTH + "]" * jsonsafe.MAX_DEPTH
    assert jsonsafe.nesting_depth(ok) == jsonsafe.MAX_DEPTH
    assert jsonsafe.loads(ok) is not None
    with pytest.raises(jsonsafe.JSONRejected, match="nested deeper than 32"):
        jsonsafe.loads("[" + ok + "]")


# ------------------------------------------------------------------ numbers
@pytest.mark.parametrize("literal", ["9" * 400, "-" + "9" * 5000, "1e400", "-1e400", "NaN", "Infinity", "-Infinity",
                                     "1." + "0" * 200])
def test_hostile_numbers_are_bad_request(literal):
    assert tts_code('{"type":"session.update","speed":%s}' % literal) == "bad_request"
    assert tts_code('{"type":"session.update","sample_rate":%s}' % literal) == "bad_request"
    assert world_code('{"type":"session.create","session_id":"a","seed":%s}' % literal) == "bad_request"
    assert world_code('{"type":"credit","chunks":%s}' % literal) == "bad_request"
    assert world_code('{"type":"event","event_id":%s}' % literal) == "bad_request"


def test_numbers_in_range_checks_never_convert():
    # Within the literal limit but beyond float range as an int: a range check, not float().
    assert tts_code('{"type":"session.update","speed":%s}' % ("9" * 99)) == "bad_speed"
    assert tts_code('{"type":"session.update","speed":-%s}' % ("9" * 99)) == "bad_speed"
    assert tts_code('{"type":"session.update","speed":1e300}') == "bad_speed"
    assert tts_code('{"type":"session.update","sample_rate":%s}' % ("9" * 99)) == "unsupported_rate"
    assert tts_code('{"type":"session.update","speed":true}') == "bad_request"
    assert tts_code('{"type":"session.update","sample_rate":true}') == "bad_request"
    assert tts_v1.parse_client('{"type":"session.update","speed":2}') == tts_v1.SessionUpdate(speed=2.0)
    assert world_code('{"type":"credit","chunks":true}') == "bad_request"
    assert world_code('{"type":"session.create","session_id":"a","seed":%s}' % ("9" * 99)) == "bad_request"


def test_unicode_edge_cases_in_parse_never_raise_outside_the_protocol():
    for text in ('"\ud800"', '{"type":"\udfff"}', "\x00", "\ufeff{}"):
        assert world_code(text) in world_v1.ERROR_CODES
        tts_code(text)


# ------------------------------------------------------------------ TTS text
@pytest.mark.parametrize("text", ["\ud800", "ok \udc00 ok", "a\x00b", "\x07", "x\x1b[31m", "\x7f", "\x85", "\x9f"])
def test_tts_text_with_controls_or_lone_surrogates_is_invalid_text(text):
    assert tts_code(json.dumps({"type": "input.text", "text": text})) == "invalid_text"


def test_tts_text_keeps_tabs_line_breaks_and_real_unicode():
    for text in ("a\tb\nc\r\n", "caf\u00e9 \U0001f600 \u200d \u00a0"):
        assert tts_v1.parse_client(json.dumps({"type": "input.text", "text": text})) == tts_v1.InputText(text)


def test_tts_frames_over_the_frame_limit_are_message_too_large():
    big = json.dumps({"type": "input.text", "text": "a" * tts_v1.MAX_FRAME_BYTES})
    assert tts_code(big) == "message_too_large"
    # The largest valid input.text (every character escaped as a surrogate pair) still fits.
    worst = json.dumps({"type": "input.text", "text": "\U0001f600" * tts_v1.MAX_TEXT_CHARS})
    assert len(worst) < tts_v1.MAX_FRAME_BYTES
    assert tts_v1.parse_client(worst).text == "\U0001f600" * tts_v1.MAX_TEXT_CHARS
    assert tts_code(b"\x00" * 10) == "bad_request"


# ------------------------------------------------------------------ OpenPI
META = openpi.PolicyMetadata(action_horizon=2, action_dim=2, image_keys=("cam",), image_resolution=(4, 4),
                             state_dim=2)


def arr(dtype: str, shape: list, data: bytes) -> dict:
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}


def obs(**extra) -> dict:
    base = {"cam": np.zeros((4, 4, 3), np.uint8), "state": np.zeros(2, np.float32)}
    base.update(extra)
    return base


def openpi_error(frame: bytes) -> str:
    with pytest.raises(openpi.ProtocolError) as info:
        openpi.parse_client(frame, META)
    return str(info.value)


@pytest.mark.parametrize("shape", [[0, 2**63], [2**64 - 1, 0], [0] * 40, [1] * 64 + [0], [-1, 0], [True, 0], [0.0]])
def test_openpi_hostile_shapes_are_wire_errors(shape):
    assert openpi_error(msgpack.packb({"x": arr("<f4", shape, b"")})) != ""


@pytest.mark.parametrize("dtype", ["<U2000000000", "V8", "O", "<c8", "(2,)i4", "i4,i4", "M8[Y]", "bogus", "", 7, None])
def test_openpi_hostile_dtypes_are_wire_errors(dtype):
    assert openpi_error(msgpack.packb({"x": arr(dtype, [0], b"")})) != ""


@pytest.mark.parametrize("data", [2**64 - 1, -(2**63), 1e308, float("nan"), [1] * 10, {"a": 1}, "x" * 10, None, True])
def test_openpi_hostile_numpy_scalars_never_escape(data):
    frame = msgpack.packb({"x": {b"__npgeneric__": True, b"data": data, b"dtype": "<i1"}})
    try:
        openpi.parse_client(frame, META)
    except openpi.ProtocolError:
        pass


@pytest.mark.parametrize("value", [2**64 - 1, -1, 0, True, 1.5, float("nan"), float("inf"), "5", [5]])
def test_openpi_sampling_numbers_are_range_checked(value):
    for name in ("num_inference_steps", "seed"):
        if name == "seed" and value == 0:
            continue
        frame = openpi.pack(obs(sampling_params={name: value}))
        assert name in openpi_error(frame)


def test_openpi_state_with_huge_or_non_finite_values_is_a_wire_error():
    assert "non-finite" in openpi_error(openpi.pack(obs(state=[1e308 * 10, 0.0])))
    assert "non-finite" in openpi_error(openpi.pack(obs(state=np.array([np.inf, 0.0]))))
    assert "beyond float32's range" in openpi_error(openpi.pack(obs(state=[1e300, 0.0])))  # finite in f64, inf in f32
    assert openpi.parse_client(openpi.pack(obs(state=[2**64 - 1, 0])), META).observation.state[0] == np.float32(2**64)


def test_openpi_deep_msgpack_nesting_is_a_wire_error():
    frame = b"\x91" * 100_000 + b"\xc0"  # [[[...nil...]]]
    assert "msgpack" in openpi_error(frame)


@pytest.mark.parametrize("text", ['"' + '\\"' * 30000 + "[" * 40, '["\\' * 20000, '"a' * 30000 + "[" * 40,
                                  "[" * 60000])
def test_the_nesting_scan_is_linear_on_hostile_64_kib_frames(text):
    import time

    started = time.perf_counter()
    assert world_code(text) == "bad_request"
    tts_code(text)
    # Quadratic scanning took seconds for 10 KB; linear is milliseconds (generous for loaded CI).
    assert time.perf_counter() - started < 1.0
