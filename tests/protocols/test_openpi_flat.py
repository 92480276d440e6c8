"""protocols/openpi.py's copy-free decode of the usual request against msgpack's, as a differential test.

``unpack`` decodes what openpi-client sends every call (a map of str keys to arrays and
strings) itself, with the cameras as views of the received bytes (``_unpack_flat``), and
everything else with msgpack (``_unpack_msgpack``). Whatever the body, both must give the
same value, or the same error.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from openpi_client import msgpack_numpy as ref

from protocols import openpi as op
from test_openpi import _same

pytest.importorskip("hypothesis")  # the dev extra

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

CI = settings(max_examples=300, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _probe_obs(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "observation/exterior_image_1_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/state": rng.standard_normal(32).astype(np.float32),
        "prompt": "pick up the red block and put it in the bowl",
    }


def _outcome(fn, data):
    try:
        return "ok", fn(data)
    except op.ProtocolError as exc:
        return "error", str(exc)


def _check(data) -> None:
    """``unpack`` (the flat path where it applies) and msgpack agree on ``data``."""
    ours, theirs = _outcome(op.unpack, data), _outcome(op._unpack_msgpack, data)
    assert ours[0] == theirs[0], (ours, theirs)
    if ours[0] == "ok":
        _same(ours[1], theirs[1], aligned=True)
    else:
        assert ours[1] == theirs[1]


def test_the_clients_observation_is_decoded_without_copying_the_cameras():
    body = ref.packb(_probe_obs())
    flat = op._unpack_flat(body)
    assert flat is not None
    _same(flat, op._unpack_msgpack(body), aligned=True)
    for key in ("observation/exterior_image_1_left", "observation/wrist_image_left"):
        cam = flat[key]
        assert cam.base is body  # a view of the received message itself
        assert not cam.flags.writeable
        with pytest.raises(ValueError):
            cam[0, 0, 0] = 1
    state = flat["observation/state"]
    assert isinstance(state.base, bytes) and state.base is not body  # copied: aligned
    assert state.flags.aligned and not state.flags.writeable
    assert state.tolist() == _probe_obs()["observation/state"].tolist()


def test_the_usual_request_parses_the_same_either_way():
    meta = op.PolicyMetadata(action_horizon=50, action_dim=32, image_resolution=(224, 224), state_dim=32,
                             image_keys=("observation/exterior_image_1_left", "observation/wrist_image_left"),
                             state_key="observation/state")
    body = ref.packb({**_probe_obs(), "session_id": "robot-1"})
    fast = op.parse_client(body, meta)
    slow = op.parse_request(op._unpack_msgpack(body), meta)
    assert fast.session_id == slow.session_id == "robot-1"
    assert fast.observation.prompt == slow.observation.prompt
    for key in meta.image_keys:
        assert fast.observation.images[key].tobytes() == slow.observation.images[key].tobytes()
    assert fast.observation.state.tolist() == slow.observation.state.tolist()


@pytest.mark.parametrize("data", [
    b"",  # empty: msgpack's error
    b"\x81",  # a map with its entry missing
    ref.packb({"a": np.zeros(3, np.uint8)})[:-1],  # truncated in the shape
    ref.packb({"a": np.zeros(3, np.uint8)}) + b"\x00",  # trailing byte
    ref.packb({"a": np.zeros(3, np.uint8)}).replace(b"|u1", b"|O1"),  # refused dtype
    ref.packb({"a": np.zeros(3, np.uint8)}).replace(b"\x91\x03", b"\x91\x04"),  # shape does not fit the data
    ref.packb({"a": np.zeros(3, np.uint8)}).replace(b"\xa1a", b"\xa1\xff"),  # key not UTF-8
    msgpack.packb({b"a": "bytes key"}),  # a bytes key: msgpack's path
    msgpack.packb({"a": [1, 2]}),  # a list value: msgpack's path
    msgpack.packb({"a": {"b": 1}}),  # a nested map: msgpack's path
    msgpack.packb({"a": None, "b": True, "c": False, "d": "x" * 300, "e": "é"}),
    msgpack.packb([1, 2]),  # not a map
    bytearray(ref.packb(_probe_obs())),  # not bytes: msgpack's path, same value
])
def test_edge_bodies_agree(data):
    _check(data)


_DTYPES = ["|u1", "|b1", "|i1", "<i2", ">i4", "<f4", ">f4", "<f8", "<U3"]
_arrays = st.builds(
    lambda dtype, shape, seed: np.random.default_rng(seed).integers(0, 200, shape).astype(dtype),
    st.sampled_from(_DTYPES), st.lists(st.integers(0, 4), max_size=3).map(tuple), st.integers(0, 2**16))
_values = st.one_of(_arrays, st.text(max_size=40), st.none(), st.booleans(), st.integers(-2**40, 2**40),
                    st.floats(allow_nan=False), st.binary(max_size=8), st.lists(st.integers(-2**40, 2**40), max_size=3))
# Values of the kinds the flat path decodes itself (arrays, str, nil, bool), and of any kind.
_flat_values = st.one_of(_arrays, st.text(max_size=300), st.none(), st.booleans())
_requests = st.one_of(st.dictionaries(st.text(max_size=40), _flat_values, max_size=6),
                      st.dictionaries(st.text(max_size=40), _values, max_size=6))


@CI
@given(_requests, st.data())
def test_any_request_decodes_the_same_either_way(obj, data):
    body = ref.packb(obj)
    _check(body)
    # The same body damaged: cut short, one byte changed, or a byte appended.
    if body:
        cut = data.draw(st.integers(0, len(body) - 1))
        _check(body[:cut])
        at = data.draw(st.integers(0, len(body) - 1))
        _check(body[:at] + bytes([data.draw(st.integers(0, 255))]) + body[at + 1:])
    _check(body + b"\xc0")
