"""world.v1 ``event``: the wire shape, parsed by ``protocols.world_v1.parse_client``."""

from __future__ import annotations

import json

import pytest

from protocols import world_v1 as wire


def parse_event(obj):
    return wire.parse_client(json.dumps({"type": "event", **obj}))


def keys_state(*held):
    return {"track": "keys", "schema": "keys.v1", "data": {"mode": "state", "held": list(held)}}


def bad(obj):
    with pytest.raises(wire.ProtocolError) as info:
        parse_event(obj)
    assert (info.value.code, info.value.message_type) == (wire.BAD_REQUEST, "event")
    return info.value


def test_full_event():
    event = parse_event({"type": "event", "event_id": 3, "prompt": "fog", "controls": [keys_state("w", "D")]})
    assert event == wire.Event(3, "fog", (wire.Control("keys", "keys.v1", {"mode": "state", "held": ["w", "D"]}),))


def test_minimal_event_and_round_trip():
    event = parse_event({"event_id": 0})
    assert event == wire.Event(0)
    assert event.to_wire() == {"type": "event", "event_id": 0, "controls": []}
    full = parse_event({"event_id": 9, "prompt": "", "controls": [keys_state("a")], "type": "event"})
    assert full.to_wire() == {"type": "event", "event_id": 9, "prompt": "", "controls": [keys_state("a")]}
    assert parse_event(full.to_wire()) == full
    # A null controls list is an empty one.
    assert parse_event({"event_id": 1, "controls": None}) == wire.Event(1)


@pytest.mark.parametrize(
    ("obj", "message", "event_id"),
    [
        ({}, "event_id is required", None),
        # An id out of range is still named in the error, as the client sent it (a bool too).
        ({"event_id": True}, "event_id must be an integer in [0, 9223372036854775807], got True", True),
        ({"event_id": -1}, "event_id must be an integer in [0, 9223372036854775807], got -1", -1),
        ({"event_id": 1.0}, "event_id must be an integer in [0, 9223372036854775807], got 1.0", None),
        ({"event_id": 2**63}, f"event_id must be an integer in [0, 9223372036854775807], got {2**63}", 2**63),
        ({"event_id": 4, "promt": "x"}, "unknown event fields: promt", 4),
        ({"event_id": 4, "prompt": 5}, "prompt must be a string or null, got int", 4),
        ({"event_id": 4, "prompt": "x" * 2001}, "prompt: 2001 characters, at most 2000", 4),
        ({"event_id": 4, "controls": {}}, "controls must be a list", 4),
        ({"event_id": 4, "controls": [keys_state()] * 17}, "controls: 17 entries, at most 16", 4),
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
    assert err.event_id == event_id and type(err.event_id) is type(event_id)


def test_prompt_of_exactly_2000_chars_is_accepted():
    assert parse_event({"event_id": 1, "prompt": "x" * 2000}).prompt == "x" * 2000


def test_one_track_at_most_once_per_event():
    err = bad({"event_id": 5, "controls": [keys_state("w"), keys_state("a")]})
    assert err.message == "controls[1]: track 'keys' already updated by controls[0]; one update per track per event"
    assert err.event_id == 5
