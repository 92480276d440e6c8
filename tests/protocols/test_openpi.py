"""protocols/openpi.py against the real openpi_client.msgpack_numpy, byte for byte."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from openpi_client import msgpack_numpy as ref

from protocols import openpi as op

META = op.PolicyMetadata(
    action_horizon=4, action_dim=2, image_keys=("cam_a", "cam_b"), image_resolution=(8, 6), state_dim=3
)


def _obs(**over):
    obs = {
        "cam_a": np.full((8, 6, 3), 7, np.uint8),
        "cam_b": np.full((8, 6, 3), 9, np.uint8),
        "state": np.array([0.5, -1.0, 2.0], np.float32),
        "prompt": "pick up the block",
    }
    obs.update(over)
    return {k: v for k, v in obs.items() if v is not None}


def _error(msg) -> str:
    with pytest.raises(op.ProtocolError) as info:
        op.parse_request(msg, META)
    return str(info.value)


# ----------------------------------------------------------------------------- codec

SAMPLES = [
    1,
    1.0,
    "hello",
    b"raw",
    None,
    np.bool_(True),
    np.int64(-3),
    np.float32(1.5),
    np.float64(2.5),  # a float subclass: packed natively, never by the hook
    np.str_("asdf"),
    [1, 2, 3],
    {"key": [1, {"n": np.uint16(7)}]},
    np.array(1.0),
    np.array([1, 2, 3], np.int32),
    np.array(["asdf", "qwer"]),
    np.array([True, False]),
    np.arange(6, dtype=">f4").reshape(2, 3),  # big-endian survives as such
    np.arange(24, dtype=np.int16).reshape(2, 3, 4)[:, ::2],  # non-contiguous: C-order bytes
    np.array([np.nan, np.inf, -np.inf]),
    np.zeros((0, 5), np.float32),
    _obs(),
]


@pytest.mark.parametrize("obj", SAMPLES, ids=range(len(SAMPLES)))
def test_pack_is_byte_identical_to_the_client(obj):
    assert op.pack(obj) == ref.packb(obj)
    assert op.make_packer().pack(obj) == ref.Packer().pack(obj)


def test_pack_exact_bytes():
    assert op.pack({"a": np.array([1, 2], np.int16)}) == (
        b"\x81\xa1a\x84\xc4\x0b__ndarray__\xc3\xc4\x04data\xc4\x04\x01\x00\x02\x00"
        b"\xc4\x05dtype\xa3<i2\xc4\x05shape\x91\x02"
    )
    assert op.pack(np.float32(1.5)) == (
        b"\x83\xc4\r__npgeneric__\xc3\xc4\x04data\xcb?\xf8\x00\x00\x00\x00\x00\x00\xc4\x05dtype\xa3<f4"
    )


@pytest.mark.parametrize("obj", SAMPLES, ids=range(len(SAMPLES)))
def test_unpack_matches_the_client(obj):
    data = ref.packb(obj)
    ours, theirs = op.unpack(data), ref.unpackb(data)
    _same(ours, theirs)


def _same(a, b, aligned: bool = False):
    """Equal decoded values: types, array bytes, read-only arrays (and, with ``aligned``, the
    arrays' alignment alike: test_openpi_flat.py's two decoders)."""
    assert type(a) is type(b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()
        assert not a.flags.writeable and not b.flags.writeable
        assert not aligned or a.flags.aligned == b.flags.aligned
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k], aligned)
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y, aligned)
    else:
        assert a == b


def test_decoded_array_is_a_read_only_view():
    arr = op.unpack(op.pack(np.arange(4, dtype=np.float32)))
    assert arr.tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError):
        arr[0] = 5


@pytest.mark.parametrize(
    "obj,text",
    [
        (np.array([1 + 2j]), "Unsupported dtype: complex128"),
        (np.array([object()], dtype=object), "Unsupported dtype: object"),
        (np.zeros(2, dtype="V4"), "Unsupported dtype: |V4"),
        (np.complex64(1j), "Unsupported dtype: complex64"),
    ],
)
def test_pack_refuses_v_o_c_like_the_client(obj, text):
    with pytest.raises(ValueError) as theirs:
        ref.packb(obj)
    with pytest.raises(ValueError) as ours:
        op.pack(obj)
    assert str(ours.value) == str(theirs.value) == text


def _raw_array(over):
    arr = {b"__ndarray__": True, b"data": b"\x00" * 8, b"dtype": "<f4", b"shape": [2]}
    arr.update(over)
    return msgpack.packb({"x": arr})


@pytest.mark.parametrize(
    "data,text",
    [
        (_raw_array({b"dtype": "|O"}), "unsupported array dtype '|O'"),
        (_raw_array({b"dtype": "<c8"}), "unsupported array dtype '<c8'"),
        (_raw_array({b"dtype": "|V4"}), "unsupported array dtype '|V4'"),
        (_raw_array({b"dtype": "i4,i4"}), "unsupported array dtype 'i4,i4'"),
        (_raw_array({b"dtype": "(2,)f4"}), "unsupported array dtype '(2,)f4'"),
        (_raw_array({b"dtype": "nonsense"}), "unknown array dtype 'nonsense'"),
        # numpy reads a comma string as a record format and raises SyntaxError, ValueError...
        (_raw_array({b"dtype": "f4,("}), "unknown array dtype 'f4,('"),
        (_raw_array({b"dtype": "f4,(1,)("}), "unknown array dtype 'f4,(1,)('"),
        (_raw_array({b"dtype": "f4,(2**70)i4"}), "unknown array dtype 'f4,(2**70)i4'"),
        # numpy wraps a string length past its range ("<U1073741824" is "<U0"): not what was sent
        (_raw_array({b"dtype": "<U1073741824"}), "unsupported array dtype '<U1073741824'"),
        (_raw_array({b"dtype": "U99999999999"}), "unsupported array dtype 'U99999999999'"),
        (_raw_array({b"dtype": "f4," + "9" * 5000 + "i4"}),
         "unknown array dtype 'f4," + "9" * 61 + "'... (5005 characters)"),
        (msgpack.packb({"x": [None] * (op.MAX_LIST_ITEMS + 1)}),
         f"body is not valid msgpack ({op.MAX_LIST_ITEMS + 1} exceeds max_array_len({op.MAX_LIST_ITEMS}))"),
        (_raw_array({b"dtype": 5}), "array dtype must be a string, got int"),
        (_raw_array({b"shape": [3]}), "array data has 8 bytes, shape [3] of <f4 needs 12"),
        (_raw_array({b"shape": [-2]}), "array shape must be a list of non-negative ints"),
        (_raw_array({b"data": "text"}), "array data must be bytes"),
        (msgpack.packb({b"__npgeneric__": True, b"data": 1, b"dtype": "|O"}), "unsupported array dtype '|O'"),
        (msgpack.packb({1: 2}), "body is not valid msgpack (int is not allowed for map key when strict_map_key=True)"),
        (b"\xc1", "body is not valid msgpack (FormatError)"),
        (b"\x92\x01", "body is not valid msgpack (Unpack failed: incomplete input)"),
    ],
)
def test_unpack_rejects_bad_bodies(data, text):
    with pytest.raises(op.ProtocolError) as info:
        op.unpack(data)
    assert str(info.value) == text


def test_unpack_rejects_over_limit_before_decoding():
    with pytest.raises(op.ProtocolError) as info:
        op.unpack(b"\x00" * (op.MAX_MESSAGE_BYTES + 1))
    assert str(info.value) == "message of 67108865 bytes is over the 67108864 byte limit"


def test_text_frame_is_an_error():
    with pytest.raises(op.ProtocolError) as info:
        op.parse_client("hello", META)
    assert str(info.value) == "expected a binary msgpack frame, got a text frame"


# ----------------------------------------------------------------------------- metadata


def test_metadata_wire_form():
    meta = op.PolicyMetadata(50, 32, ["a", "b"], [224, 224], 32, extra={"policy": "x"})
    assert meta.to_wire() == {
        "policy": "x",
        "action_horizon": 50,
        "action_dim": 32,
        "image_keys": ["a", "b"],
        "image_resolution": [224, 224],
        "state_dim": 32,
        "state_key": "state",
        "prompt_key": "prompt",
    }
    assert meta.image_keys == ("a", "b") and meta.image_resolution == (224, 224)
    assert meta.action_shape == (50, 32)
    # Round trip through the client's decoder.
    assert ref.unpackb(op.pack(meta.to_wire())) == meta.to_wire()


def test_metadata_from_a_user_dict():
    meta = op.PolicyMetadata.from_mapping(
        {"action_horizon": 10, "action_dim": 7, "image_keys": ["wrist"], "image_resolution": (96, 128),
         "state_dim": 8, "state_key": "qpos", "robot": "arm"}
    )
    assert meta == op.PolicyMetadata(10, 7, ("wrist",), (96, 128), 8, state_key="qpos", extra={"robot": "arm"})
    with pytest.raises(ValueError) as info:
        op.PolicyMetadata.from_mapping({"action_horizon": 10, "action_dim": 7})
    assert str(info.value) == "policy metadata is missing ['image_keys', 'image_resolution', 'state_dim']"


@pytest.mark.parametrize(
    "kwargs,text",
    [
        ({"action_horizon": 0}, "metadata action_horizon must be a positive int, got 0"),
        ({"state_dim": -1}, "metadata state_dim must be a non-negative int, got -1"),
        ({"image_resolution": (8,)}, "metadata image_resolution must be [H, W], got (8,)"),
        ({"image_keys": ("a", "a")}, "metadata keys must be distinct non-empty strings, got ('a', 'a', 'state', 'prompt')"),
        ({"image_keys": ("batch",)}, "metadata keys may not use the reserved ['batch']"),
    ],
)
def test_metadata_rejects_nonsense(kwargs, text):
    base = dict(action_horizon=4, action_dim=2, image_keys=("a",), image_resolution=(8, 8), state_dim=3)
    with pytest.raises(ValueError) as info:
        op.PolicyMetadata(**{**base, **kwargs})
    assert str(info.value) == text


# ----------------------------------------------------------------------------- observations


def test_valid_observation():
    req = op.parse_client(ref.packb(_obs(extra_key=np.ones(2))), META)
    assert isinstance(req, op.InferRequest)
    assert req.session_id is None and req.sampling == op.SamplingParams()
    obs = req.observation
    assert list(obs.images) == ["cam_a", "cam_b"]
    assert obs.images["cam_b"][0, 0].tolist() == [9, 9, 9]
    assert obs.state.dtype == np.float32 and obs.state.tolist() == [0.5, -1.0, 2.0]
    assert not obs.state.flags.writeable
    assert obs.prompt == "pick up the block"
    assert list(obs.extras) == ["extra_key"]
    assert sorted(obs.as_dict(META)) == ["cam_a", "cam_b", "extra_key", "prompt", "state"]


def test_state_of_another_real_dtype_becomes_float32():
    obs = op.parse_request(_obs(state=np.array([1, 2, 3], np.int64)), META).observation
    assert obs.state.dtype == np.float32 and obs.state.tolist() == [1.0, 2.0, 3.0]
    obs = op.parse_request(_obs(state=[0.25, 0.5, 1]), META).observation
    assert obs.state.tolist() == [0.25, 0.5, 1.0]


def test_prompt_is_optional():
    assert op.parse_request(_obs(prompt=None), META).observation.prompt is None


@pytest.mark.parametrize(
    "msg,text",
    [
        ([1, 2], "request must be a msgpack map, got array"),
        ("obs", "request must be a msgpack map, got string"),
        ({b"cam_a": 1}, "request keys must be strings, got bytes key b'cam_a'"),
        (_obs(cam_b=None), "missing camera 'cam_b'"),
        (_obs(cam_a=np.zeros((8, 6, 3), np.float32)), "camera 'cam_a' must be uint8 [8, 6, 3], got float32 [8, 6, 3]"),
        (_obs(cam_a=np.zeros((6, 8, 3), np.uint8)), "camera 'cam_a' must be uint8 [8, 6, 3], got uint8 [6, 8, 3]"),
        (_obs(cam_a=np.zeros((8, 6, 4), np.uint8)), "camera 'cam_a' must be uint8 [8, 6, 3], got uint8 [8, 6, 4]"),
        (_obs(cam_a="jpeg"), "camera 'cam_a' must be uint8 [8, 6, 3], got string"),
        (_obs(cam_c=np.zeros((8, 6, 3), np.uint8)), "unknown camera key 'cam_c' (this policy's cameras: ['cam_a', 'cam_b'])"),
        (_obs(top=np.zeros((4, 4), np.uint8)), "unknown camera key 'top' (this policy's cameras: ['cam_a', 'cam_b'])"),
        (_obs(state=None), "missing 'state' (float32 [3])"),
        (_obs(state=np.zeros(4, np.float32)), "'state' must have shape [3], got [4]"),
        (_obs(state=np.zeros((1, 3), np.float32)), "'state' must have shape [3], got [1, 3]"),
        (_obs(state=np.array(["a", "b", "c"])), "'state' must be a float32 array, got str32 [3]"),
        (_obs(state=np.array([True, False, True])), "'state' must be a float32 array, got bool [3]"),
        (_obs(state="1,2,3"), "'state' must be a float32 array, got string"),
        (_obs(state=np.array([0.0, np.nan, 1.0], np.float32)), "'state' has a non-finite value (NaN or inf) at index 1"),
        (_obs(state=np.array([0.0, 1.0, np.inf])), "'state' has a non-finite value (NaN or inf) at index 2"),
        (_obs(state=np.array([1e300, 0.0, 0.0])), "'state' has a value beyond float32's range (|x| > 3.4e38) at index 0"),
        (_obs(prompt=b"bytes"), "'prompt' must be a string, got bytes"),
        (_obs(prompt="x" * 8193), "'prompt' is over 8192 characters"),
    ],
)
def test_invalid_observations_name_the_field(msg, text):
    assert _error(msg) == text


# ----------------------------------------------------------------------------- extensions


def test_session_and_sampling_params():
    req = op.parse_request(_obs(session_id="robot-7", sampling_params={"num_inference_steps": 3, "seed": 42}), META)
    assert req.session_id == "robot-7"
    assert req.sampling == op.SamplingParams(num_inference_steps=3, seed=42)
    assert "session_id" not in req.observation.extras and "sampling_params" not in req.observation.extras
    # numpy integer scalars (what a robot's code often has) are fine.
    req = op.parse_request(_obs(sampling_params={"seed": np.int64(5)}), META)
    assert req.sampling == op.SamplingParams(seed=5)


@pytest.mark.parametrize(
    "over,text",
    [
        ({"session_id": ""}, "session_id must be 1-128 characters of [A-Za-z0-9_.:@/+-]"),
        ({"session_id": "a b"}, "session_id must be 1-128 characters of [A-Za-z0-9_.:@/+-]"),
        ({"session_id": 5}, "session_id must be 1-128 characters of [A-Za-z0-9_.:@/+-]"),
        ({"sampling_params": [1]}, "sampling_params must be a map, got array"),
        ({"sampling_params": {"temperature": 1.0}}, "unknown sampling_params ['temperature'] (known: num_inference_steps, seed)"),
        ({"sampling_params": {"num_inference_steps": 0}}, "sampling_params.num_inference_steps must be an int in [1, 1000]"),
        ({"sampling_params": {"num_inference_steps": 2.0}}, "sampling_params.num_inference_steps must be an int in [1, 1000]"),
        ({"sampling_params": {"seed": True}}, "sampling_params.seed must be an int in [0, 2**63)"),
        ({"sampling_params": {"seed": -1}}, "sampling_params.seed must be an int in [0, 2**63)"),
    ],
)
def test_bad_extensions(over, text):
    assert _error(_obs(**over)) == text


def test_reset_request():
    assert op.parse_request({"endpoint": "reset"}, META) == op.ResetRequest(None)
    assert op.parse_request({"endpoint": "reset", "session_id": "r1"}, META) == op.ResetRequest("r1")
    assert _error({"endpoint": "load"}) == "unknown endpoint 'load' (known: 'infer', 'reset')"
    assert _error({"endpoint": "reset", "x": 1}) == "reset takes only 'session_id', got ['x']"
    assert op.reset_reply() == {"status": "reset successful"}


def test_batch_request():
    req = op.parse_request({"batch": [_obs(), _obs(session_id="r2", sampling_params={"seed": 1})]}, META)
    assert isinstance(req, op.BatchRequest) and len(req.items) == 2
    assert [i.session_id for i in req.items] == [None, "r2"]
    assert req.items[1].sampling.seed == 1
    assert _error({"batch": []}) == "'batch' must be a list of 1 to 64 observations"
    assert _error({"batch": [_obs()] * 65}) == "'batch' must be a list of 1 to 64 observations"
    assert _error({"batch": [_obs()], "session_id": "x"}) == "a batch request takes only 'batch', got ['session_id']"
    assert _error({"batch": [_obs(), 3]}) == "batch[1] must be a msgpack map, got int"
    assert _error({"batch": [{"endpoint": "reset"}]}) == "batch[0] must be an observation"
    assert _error({"batch": [_obs(), _obs(state=None)]}) == "missing batch[1].'state' (float32 [3])"
    assert _error({"batch": [_obs(session_id="no way")]}) == (
        "batch[0].session_id must be 1-128 characters of [A-Za-z0-9_.:@/+-]"
    )


def test_one_request_asks_for_bounded_work():
    def batch(n: int, steps: int) -> dict:
        return {"batch": [_obs(sampling_params={"num_inference_steps": steps})] * n}

    # The case: 64 observations at 1000 steps each once held the engine for minutes.
    assert _error(batch(64, 1000)) == ("the batch asks for 64000 num_inference_steps in all; one request may ask "
                                       f"for at most {op.MAX_REQUEST_STEPS}")
    assert _error(batch(2, 501)).startswith("the batch asks for 1002")
    assert len(op.parse_request(batch(2, 500), META).items) == 2  # exactly the bound
    assert len(op.parse_request(batch(64, 15), META).items) == 64
    assert len(op.parse_request({"batch": [_obs()] * 64}, META).items) == 64  # the model's default steps
    assert op.parse_request(_obs(sampling_params={"num_inference_steps": 1000}), META).sampling.num_inference_steps == 1000


# ----------------------------------------------------------------------------- replies


def test_infer_reply_as_the_client_sees_it():
    actions = np.arange(8, dtype=np.float32).reshape(4, 2)
    first = op.infer_reply(actions, infer_ms=1.5, policy_infer_ms=1.25)
    assert list(first) == ["actions", "server_timing", "policy_timing"]
    assert first["server_timing"] == {"infer_ms": 1.5}
    assert first["policy_timing"] == {"infer_ms": 1.25}
    later = op.infer_reply(actions, infer_ms=2, policy_infer_ms=1, prev_total_ms=3, outputs={"state": np.zeros(2), "actions": 0})
    got = ref.unpackb(op.pack(later))
    assert list(got) == ["actions", "state", "server_timing", "policy_timing"]
    assert got["actions"].dtype == np.float32 and got["actions"].tolist() == actions.tolist()
    assert got["server_timing"] == {"infer_ms": 2.0, "prev_total_ms": 3.0}
    assert ref.unpackb(op.pack(op.batch_reply([first, first])))["batch"][1]["policy_timing"] == {"infer_ms": 1.25}


@pytest.mark.parametrize("spec", ["f4,(", "f4,(1,)(", "f4,(2**70)i4", "x" * 5000])
def test_a_malformed_dtype_in_the_usual_request_is_a_wire_error(spec):
    """An array in pack_array's own layout goes to the copy-free decoder (``_unpack_flat``)
    first: a dtype numpy cannot parse is a ProtocolError there too (it once escaped as a
    SyntaxError, an internal error with a traceback), and its text is short."""
    arr = {b"__ndarray__": True, b"data": b"", b"dtype": spec, b"shape": [0]}  # the client's key order
    data = msgpack.packb({"prompt": "go", "extra": arr})
    assert data.startswith(b"\x82") and op._ND_HEAD in data  # the layout _unpack_flat reads
    with pytest.raises(op.ProtocolError, match="^unknown array dtype") as info:
        op.parse_client(data, META)
    assert len(str(info.value)) < 120


@pytest.mark.parametrize("endpoint,text", [
    (np.zeros(3, np.uint8), "endpoint must be a string, got uint8 [3]"),
    (np.zeros(0, np.uint8), "endpoint must be a string, got uint8 [0]"),  # once answered as a reset
    (["reset"], "endpoint must be a string, got array"),
    ("r" * 100_000, "unknown endpoint '" + "r" * 64 + "'... (100000 characters) (known: 'infer', 'reset')"),
])
def test_only_the_string_reset_is_a_reset_and_echoes_are_short(endpoint, text):
    assert _error({"endpoint": endpoint}) == text


def test_every_echo_of_client_text_is_clipped():
    big = "x" * (1 << 20)
    for msg in ({"endpoint": "reset", big: 1}, {"batch": [_obs()], big: 1}, _obs(sampling_params={big: 1}),
                _obs(**{big: np.zeros((8, 6, 3), np.uint8)}), {1: 2, big: 3}):
        assert len(_error(msg)) < 300
