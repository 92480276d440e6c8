import math

import pytest

from sessions import ControlInput, ErrorCode, FrozenDict, SessionError, SessionEvent


def keys_state(*held):
    return {"track": "keys", "schema": "keys.v1", "data": {"mode": "state", "held": list(held)}}


def bad(obj):
    with pytest.raises(SessionError) as info:
        SessionEvent.from_wire(obj)
    assert info.value.code is ErrorCode.BAD_REQUEST
    return info.value


def test_from_wire_full_event():
    event = SessionEvent.from_wire(
        {"type": "event", "event_id": 3, "prompt": "fog", "controls": [keys_state("w", "D")]}
    )
    assert event == SessionEvent(
        event_id=3,
        prompt="fog",
        controls=(ControlInput("keys", "keys.v1", FrozenDict({"mode": "state", "held": ("w", "D")})),),
    )
    assert type(event.controls[0].data) is FrozenDict
    assert event.control("keys") is event.controls[0]
    assert event.control("camera") is None


def test_from_wire_minimal_event_and_round_trip():
    event = SessionEvent.from_wire({"event_id": 0})
    assert event == SessionEvent(0, None, ())
    assert event.to_wire() == {"event_id": 0, "controls": []}
    full = SessionEvent.from_wire({"event_id": 9, "prompt": "", "controls": [keys_state("a")]})
    assert full.to_wire() == {
        "event_id": 9,
        "prompt": "",
        "controls": [
            {"track": "keys", "schema": "keys.v1", "data": {"mode": "state", "held": ["a"]}}
        ],
    }
    assert SessionEvent.from_wire(full.to_wire()) == full


def test_composite_event_is_isolated_from_later_mutation():
    held = ["w"]
    data = {"mode": "state", "held": held}
    controls = [{"track": "keys", "schema": "keys.v1", "data": data}]
    wire = {"event_id": 1, "prompt": "a", "controls": controls}
    event = SessionEvent.from_wire(wire)
    held.append("s")
    data["mode"] = "script"
    controls.append(keys_state("d"))
    wire["prompt"] = "b"
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
    ("obj", "message", "event_id"),
    [
        ([], "event must be a JSON object", None),
        ({}, "event_id is required", None),
        ({"event_id": True}, "event_id must be an integer in [0, 9223372036854775807], got True", None),
        ({"event_id": -1}, "event_id must be an integer in [0, 9223372036854775807], got -1", None),
        ({"event_id": 1.0}, "event_id must be an integer in [0, 9223372036854775807], got 1.0", None),
        ({"event_id": 2**63}, f"event_id must be an integer in [0, 9223372036854775807], got {2**63}", None),
        ({"event_id": 4, "promt": "x"}, "unknown event fields: promt", 4),
        ({"event_id": 4, "prompt": 5}, "prompt must be a string or null, got int", 4),
        ({"event_id": 4, "prompt": "x" * 2001}, "prompt: 2001 characters, at most 2000", 4),
        ({"event_id": 4, "controls": {}}, "controls must be a list", 4),
        ({"event_id": 4, "controls": ["keys"]}, "controls[0] must be an object", 4),
        (
            {"event_id": 4, "controls": [{"track": "keys", "data": {}, "x": 1}]},
            "controls[0] needs exactly track, schema, data (missing schema; unknown x)",
            4,
        ),
        (
            {"event_id": 4, "controls": [{"track": "", "schema": "keys.v1", "data": {}}]},
            "controls[0].track must be a non-empty string",
            4,
        ),
        (
            {"event_id": 4, "controls": [{"track": "keys", "schema": 1, "data": {}}]},
            "controls[0].schema must be a non-empty string",
            4,
        ),
        (
            {"event_id": 4, "controls": [{"track": "keys", "schema": "keys.v1", "data": []}]},
            "controls[0].data must be an object",
            4,
        ),
    ],
)
def test_malformed_events(obj, message, event_id):
    err = bad(obj)
    assert err.message == message
    assert err.event_id == event_id


def test_prompt_of_exactly_2000_chars_is_accepted():
    assert SessionEvent.from_wire({"event_id": 1, "prompt": "x" * 2000}).prompt == "x" * 2000


def test_one_track_at_most_once_per_event():
    err = bad({"event_id": 5, "controls": [keys_state("w"), keys_state("a")]})
    assert err.message == (
        "controls[1]: track 'keys' already updated by controls[0]; one update per track per event"
    )
    assert err.event_id == 5
    with pytest.raises(SessionError, match="already updated"):
        SessionEvent(
            5,
            controls=(
                ControlInput("keys", "keys.v1", FrozenDict({"mode": "state", "held": ()})),
                ControlInput("keys", "keys.v1", FrozenDict({"mode": "state", "held": ()})),
            ),
        )


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
    err = bad(
        {
            "event_id": 2,
            "controls": [
                {"track": "keys", "schema": "keys.v1", "data": {"mode": "state", "held": [payload]}}
            ],
        }
    )
    assert err.message == message
    assert err.event_id == 2


def test_events_are_hashable_values():
    a = SessionEvent.from_wire({"event_id": 1, "controls": [keys_state("w")]})
    b = SessionEvent.from_wire({"event_id": 1, "controls": [keys_state("w")]})
    assert a == b and hash(a) == hash(b)
