"""world.v1 client messages: what clients/world.py builds is what the server parses."""

from __future__ import annotations

import json

import pytest

from protocols import world_v1 as wire


def roundtrip(msg: dict) -> dict:
    return wire.parse(wire.dumps(msg))


def test_create_builds_and_parses_back():
    req = wire.CreateRequest("w1", model="tiny", prompt="p", seed=3, format="rgb8", credits=0)
    assert wire.parse_create(roundtrip(req.to_wire()), default_model="maze") == req
    assert wire.CreateRequest("w2").to_wire() == {"type": "session.create", "session_id": "w2"}
    assert wire.parse_create(roundtrip(wire.CreateRequest("w2").to_wire()), default_model="maze") == \
        wire.CreateRequest("w2", model="maze")


def test_credit_reset_close():
    assert wire.parse_credit(roundtrip(wire.Credit(5).to_wire())) == wire.Credit(5)
    assert roundtrip(wire.Reset().to_wire()) == {"type": "session.reset"}
    assert wire.parse_close(roundtrip(wire.Close().to_wire())) == wire.Close()
    assert wire.parse_close(roundtrip(wire.Close("t1").to_wire())) == wire.Close("t1")
    with pytest.raises(wire.ProtocolError, match="optional non-empty string session_id"):
        wire.parse_close({"type": "session.close", "session_id": 7})


def test_event_message():
    msg = wire.Event(4, prompt="fog", controls=(wire.keys_control({"mode": "state", "held": ["w"]}),)).to_wire()
    assert json.loads(wire.dumps(msg)) == {"type": "event", "event_id": 4, "prompt": "fog", "controls": [
        {"track": "keys", "schema": "keys.v1", "data": {"mode": "state", "held": ["w"]}}]}
    assert wire.parse_event(roundtrip(msg)) == wire.Event(4, "fog", (wire.keys_control({"mode": "state", "held": ["w"]}),))
