"""protocols/openpi.py: a body holds at most MAX_OBJECTS msgpack objects, whatever its lists.

The per-list limit (MAX_LIST_ITEMS) alone let a 63 MiB body of 1,000 lists, each of 65,535
empty lists, decode to 4.7 GB of Python objects in 37 s on the event loop. The objects are
counted from the type bytes before anything is decoded.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from openpi_client import msgpack_numpy as ref

from protocols import openpi as op

TOO_MANY = (f"body holds more than {op.MAX_OBJECTS} msgpack objects (values, keys, arrays and maps; "
            "an array's data is one)")


@pytest.mark.parametrize(
    "obj, count",
    [
        (None, 1),
        ({"a": [1, 2]}, 5),  # the map, its key, the array, its two items
        ([], 1),
        ("x" * 40, 1),  # a str 8: its payload is stepped over
        ("x" * 70000, 1),  # str 32
        (b"\x00" * 300, 1),  # bin 16
        ([-1, -200, 2**40, -(2**40), 2**64 - 1, 0.5, 1e300, True, False], 10),
        ({"x": {"y": {}}}, 5),
        ([msgpack.ExtType(3, b"ab" * 100), msgpack.ExtType(1, b"a"), msgpack.ExtType(2, b"a" * 16)], 4),
        (np.zeros((224, 224, 3), np.uint8), 12),  # pack_array's map, 4 keys, 4 values, 3 shape items
    ],
)
def test_objects_are_counted_from_the_type_bytes(obj, count):
    assert op._object_count(ref.packb(obj), 10**9) == count


def test_counting_stops_past_the_limit_and_at_a_byte_msgpack_never_writes():
    body = msgpack.packb([None] * 1000)
    assert op._object_count(body, 10) == 11
    assert op._object_count(b"\x92\xc0\xc1\xc0\xc0", 100) == 3
    assert op._object_count(b"\xc4\xff", 100) == 1  # a bin longer than the body: counting ends


def test_a_body_of_many_small_lists_is_refused_before_decoding():
    # 4 lists of 65,535 empty lists: each list is within MAX_LIST_ITEMS, the body is not.
    body = b"\x94" + (b"\xdc\xff\xff" + b"\x90" * 65535) * 4
    with pytest.raises(op.ProtocolError) as info:
        op.unpack(body)
    assert str(info.value) == TOO_MANY


def test_a_flat_map_of_many_arrays_is_refused_as_msgpack_refuses_it():
    # What the copy-free path decodes itself, but with more objects than a body may hold:
    # 20,000 zero-size arrays are 20,000 * 11 objects and the map.
    body = ref.packb({f"k{i}": np.zeros((0,), np.uint8) for i in range(20000)})
    assert op._unpack_flat(body) is None
    with pytest.raises(op.ProtocolError) as info:
        op.unpack(body)
    assert str(info.value) == TOO_MANY


def test_a_body_at_the_limit_decodes_and_one_more_object_is_refused():
    # The map, two keys, two lists (5 objects) and floats, each list within MAX_LIST_ITEMS.
    floats = op.MAX_OBJECTS - 5
    split = {"x": [0.5] * (floats // 2), "y": [0.25] * (floats - floats // 2)}
    assert op._object_count(msgpack.packb(split), op.MAX_OBJECTS) == op.MAX_OBJECTS
    assert op.unpack(msgpack.packb(split))["y"][0] == 0.25
    split["y"].append(0.25)
    with pytest.raises(op.ProtocolError) as info:
        op.unpack(msgpack.packb(split))
    assert str(info.value) == TOO_MANY


def test_a_state_of_max_list_items_floats_still_decodes():
    meta = op.PolicyMetadata(action_horizon=1, action_dim=1, image_keys=(), image_resolution=(1, 1),
                             state_dim=op.MAX_LIST_ITEMS)
    req = op.parse_client(msgpack.packb({"state": [1.0] * op.MAX_LIST_ITEMS, "prompt": "go"}), meta)
    assert req.observation.state.shape == (op.MAX_LIST_ITEMS,)
