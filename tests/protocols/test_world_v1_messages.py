"""world.v1 client messages: what clients/world.py builds is what the server parses."""

from __future__ import annotations

import json

import pytest

from protocols import world_v1 as wire


def parse(msg: dict, default_model: str | None = "maze") -> wire.ClientMessage:
    """``msg`` as the client sends it, parsed as the server does."""
    return wire.parse_client(wire.encode(msg), default_model=default_model)


def test_create_builds_and_parses_back():
    req = wire.CreateRequest("w1", model="tiny", prompt="p", seed=3, format="rgb8", credits=0)
    assert parse(req.to_wire()) == req
    assert wire.CreateRequest("w2").to_wire() == {"type": "session.create", "session_id": "w2"}
    assert parse(wire.CreateRequest("w2").to_wire()) == wire.CreateRequest("w2", model="maze")
    assert parse(wire.CreateRequest("w2").to_wire(), default_model=None) == wire.CreateRequest("w2")


def test_create_options_build_and_parse_back():
    req = wire.CreateRequest("w1", options={"guidance_scale": 4.0, "negative_prompt": "blurry"})
    assert req.to_wire()["options"] == {"guidance_scale": 4.0, "negative_prompt": "blurry"}
    assert parse(req.to_wire()) == \
        wire.CreateRequest("w1", model="maze", options={"guidance_scale": 4.0, "negative_prompt": "blurry"})


@pytest.mark.parametrize("options", [[1], "s", {"a": [1]}, {"a": {"b": 1}}, {"a": None},
                                     {f"o{i}": 1 for i in range(17)}])
def test_create_options_must_be_a_small_flat_object(options):
    with pytest.raises(wire.ProtocolError, match="options must be an object of at most 16 string or number values"):
        parse({"type": "session.create", "session_id": "w", "options": options})


def test_create_with_a_first_image():
    req = wire.CreateRequest("w1", image=wire.ImageSpec("png", 1234))
    assert req.to_wire()["image"] == {"format": "png", "bytes": 1234}
    assert parse(req.to_wire(), default_model="lingbot") == \
        wire.CreateRequest("w1", model="lingbot", image=wire.ImageSpec("png", 1234))
    largest = wire.CreateRequest("w1", image=wire.ImageSpec("jpeg", wire.MAX_IMAGE_BYTES))
    assert parse(largest.to_wire()).image == wire.ImageSpec("jpeg", 8 << 20)


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
        parse({"type": "session.create", "session_id": "w", "image": spec})
    assert info.value.code == wire.BAD_REQUEST and text in info.value.message


def test_credit_reset_close():
    assert parse(wire.Credit(5).to_wire()) == wire.Credit(5)
    assert wire.encode(wire.Credit(5)) == '{"type":"credit","chunks":5}'
    assert parse(wire.Reset().to_wire()) == wire.Reset()
    assert wire.Reset().to_wire() == {"type": "session.reset"}
    assert parse(wire.Close().to_wire()) == wire.Close()
    assert parse(wire.Close("t1").to_wire()) == wire.Close("t1")
    with pytest.raises(wire.ProtocolError, match="optional non-empty string session_id"):
        parse({"type": "session.close", "session_id": 7})


def test_event_message():
    msg = wire.Event(4, prompt="fog", controls=(wire.keys_control({"mode": "state", "held": ["w"]}),)).to_wire()
    assert json.loads(wire.encode(msg)) == {"type": "event", "event_id": 4, "prompt": "fog", "controls": [
        {"track": "keys", "schema": "keys.v1", "data": {"mode": "state", "held": ["w"]}}]}
    assert parse(msg) == wire.Event(4, "fog", (wire.keys_control({"mode": "state", "held": ["w"]}),))


@pytest.mark.parametrize("msg, error", [
    ({"type": "session.create", "session_id": "w", "fromat": "png"}, "unknown session.create fields: fromat"),
    ({"type": "credit", "chunks": 2, "chunk": 2}, "unknown credit fields: chunk"),
    ({"type": "session.reset", "hard": True}, "unknown session.reset fields: hard"),
    ({"type": "session.close", "sessionid": "w"}, "unknown session.close fields: sessionid"),
])
def test_an_unknown_field_is_refused_naming_it(msg, error):
    with pytest.raises(wire.ProtocolError) as err:
        parse(msg)
    assert (err.value.code, err.value.message, err.value.message_type) == ("bad_request", error, msg["type"])
    assert err.value.event_id is None


def test_an_error_names_the_integer_event_id_the_message_carries():
    with pytest.raises(wire.ProtocolError) as err:
        parse({"type": "credit", "chunks": 1, "event_id": 5})
    assert (err.value.message, err.value.event_id) == ("unknown credit fields: event_id", 5)


@pytest.mark.parametrize("text, code, message", [
    ("[1]", "bad_request", "a message must be a JSON object"),
    ('{"type": 3}', "bad_request", "a message needs a string 'type'"),
    ('{"type": "nope", "event_id": 3}', "unknown_type", "unknown message type 'nope'"),
])
def test_a_frame_that_is_no_known_message_names_no_type_and_no_event(text, code, message):
    with pytest.raises(wire.ProtocolError) as err:
        wire.parse_client(text)
    assert (err.value.code, err.value.message) == (code, message)
    assert (err.value.message_type, err.value.event_id) == (None, None)


def test_an_empty_model_is_refused_and_a_missing_one_is_the_default():
    with pytest.raises(wire.ProtocolError, match="model must be a non-empty string"):
        parse({"type": "session.create", "session_id": "w", "model": ""}, default_model="m")
    assert parse({"type": "session.create", "session_id": "w"}, default_model="m").model == "m"
    assert parse({"type": "session.create", "session_id": "w", "model": None}, default_model="m").model == "m"


def test_server_messages_are_compact_ascii_json():
    assert wire.encode(wire.error("stale_event", "old é", event_id=3)) == \
        '{"type":"error","code":"stale_event","message":"old \\u00e9","event_id":3}'
    assert wire.encode(wire.error("session_failed", "tick failed", pending_event_ids=[4, 5])) == \
        '{"type":"error","code":"session_failed","message":"tick failed","pending_event_ids":[4,5]}'
    with pytest.raises(ValueError, match="unknown error code 'internal_error'"):
        wire.error("internal_error", "no such code in world.v1")
