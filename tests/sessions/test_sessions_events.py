import json
import math

import pytest

from protocols import world_v1 as wire
from sessions import ControlInput, ErrorCode, FrozenDict, SessionError, SessionEvent


def keys_state(*held):
    return {"track": "keys", "schema": "keys.v1", "data": {"mode": "state", "held": list(held)}}


def session_event(msg):
    return SessionEvent.from_wire(wire.parse_client(json.dumps({"type": "event", **msg})))


def test_from_wire_full_event():
    event = session_event({"type": "event", "event_id": 3, "prompt": "fog", "controls": [keys_state("w", "D")]})
    assert event == SessionEvent(
        event_id=3,
        prompt="fog",
        controls=(ControlInput("keys", "keys.v1", FrozenDict({"mode": "state", "held": ("w", "D")})),),
    )
    assert type(event.controls[0].data) is FrozenDict
    assert event.control("keys") is event.controls[0]
    assert event.control("camera") is None


def test_from_wire_minimal_event():
    assert session_event({"event_id": 0}) == SessionEvent(0, None, ())


def test_composite_event_is_isolated_from_later_mutation():
    held = ["w"]
    data = {"mode": "state", "held": held}
    controls = [{"track": "keys", "schema": "keys.v1", "data": data}]
    # Built directly: parse_client's objects are its own, a caller's may change after.
    event = SessionEvent.from_wire(wire.Event(1, "a", tuple(wire.Control(**c) for c in controls)))
    held.append("s")
    data["mode"] = "script"
    controls.append(keys_state("d"))
    assert event.prompt == "a"
    assert event.controls == (
        ControlInput("keys", "keys.v1", FrozenDict({"mode": "state", "held": ("w",)})),
    )


def test_direct_construction_freezes_a_plain_dict_copy():
    data = {"mode": "state", "held": ["w"]}
    control = ControlInput("keys", "keys.v1", data)  # type: ignore[arg-type]
    data["held"].append("a")
    assert control.data == {"mode": "state", "held": ("w",)}
    assert type(control.data["held"]) is tuple


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"w", "controls[0].data.held[0]: a bytes is not a plain JSON value"),
        ({"w"}, "controls[0].data.held[0]: a set is not a plain JSON value"),
        (math.nan, "controls[0].data.held[0]: nan is not a finite number"),
        (object(), "controls[0].data.held[0]: a object is not a plain JSON value"),
    ],
)
def test_non_json_payloads_rejected(payload, message):
    with pytest.raises(SessionError) as info:
        # Not JSON, so built directly: what from_wire refuses whatever its caller parsed.
        SessionEvent.from_wire(wire.Event(2, None, (wire.Control("keys", "keys.v1", {"mode": "state",
                                                                                     "held": [payload]}),)))
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert info.value.message == message
    assert info.value.event_id == 2


def test_events_are_hashable_values():
    a = session_event({"event_id": 1, "controls": [keys_state("w")]})
    b = session_event({"event_id": 1, "controls": [keys_state("w")]})
    assert a == b and hash(a) == hash(b)
