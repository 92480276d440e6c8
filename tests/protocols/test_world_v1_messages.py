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


def test_create_options_build_and_parse_back():
    req = wire.CreateRequest("w1", options={"guidance_scale": 4.0, "negative_prompt": "blurry"})
    assert req.to_wire()["options"] == {"guidance_scale": 4.0, "negative_prompt": "blurry"}
    assert wire.parse_create(roundtrip(req.to_wire()), default_model="maze") == \
        wire.CreateRequest("w1", model="maze", options={"guidance_scale": 4.0, "negative_prompt": "blurry"})


@pytest.mark.parametrize("options", [[1], "s", {"a": [1]}, {"a": {"b": 1}}, {"a": None},
                                     {f"o{i}": 1 for i in range(17)}])
def test_create_options_must_be_a_small_flat_object(options):
    with pytest.raises(wire.ProtocolError, match="options must be an object of at most 16 string or number values"):
        wire.parse_create({"type": "session.create", "session_id": "w", "options": options}, default_model="maze")


def test_create_with_a_first_image():
    req = wire.CreateRequest("w1", image=wire.ImageSpec("png", 1234))
    assert req.to_wire()["image"] == {"format": "png", "bytes": 1234}
    assert wire.parse_create(roundtrip(req.to_wire()), default_model="lingbot") == \
        wire.CreateRequest("w1", model="lingbot", image=wire.ImageSpec("png", 1234))
    assert wire.parse_image({"format": "jpeg", "bytes": wire.MAX_IMAGE_BYTES}) == \
        wire.ImageSpec("jpeg", 8 << 20)


@pytest.mark.parametrize("spec,text", [
    ({"format": "gif", "bytes": 3}, "png, jpeg"),
    ({"format": "png", "bytes": 0}, "[1, 8388608]"),
    ({"format": "png", "bytes": (8 << 20) + 1}, "[1, 8388608]"),
    ({"format": "png", "bytes": True}, "[1, 8388608]"),
    ({"format": "png"}, "must be an object"),
    ({"format": "png", "bytes": 3, "name": "x"}, "must be an object"),
    ("png", "must be an object"),
])
def test_a_bad_image_spec_is_a_bad_request(spec, text):
    with pytest.raises(wire.ProtocolError) as info:
        wire.parse_create({"type": "session.create", "session_id": "w", "image": spec}, default_model="m")
    assert info.value.code == wire.BAD_REQUEST and text in info.value.message


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


@pytest.mark.parametrize("msg, parse, error", [
    ({"type": "session.create", "session_id": "w", "fromat": "png"}, lambda m: wire.parse_create(m, default_model="m"),
     "unknown session.create fields: fromat"),
    ({"type": "credit", "chunks": 2, "chunk": 2}, wire.parse_credit, "unknown credit fields: chunk"),
    ({"type": "session.reset", "hard": True}, wire.parse_reset, "unknown session.reset fields: hard"),
    ({"type": "session.close", "sessionid": "w"}, wire.parse_close, "unknown session.close fields: sessionid"),
])
def test_an_unknown_field_is_refused_naming_it(msg, parse, error):
    with pytest.raises(wire.ProtocolError) as err:
        parse(msg)
    assert (err.value.code, err.value.message) == ("bad_request", error)


def test_an_empty_model_is_refused_and_a_missing_one_is_the_default():
    with pytest.raises(wire.ProtocolError, match="model must be a non-empty string"):
        wire.parse_create({"type": "session.create", "session_id": "w", "model": ""}, default_model="m")
    assert wire.parse_create({"type": "session.create", "session_id": "w"}, default_model="m").model == "m"
    assert wire.parse_create({"type": "session.create", "session_id": "w", "model": None}, default_model="m").model == "m"
