"""world.v1 ``format: "h264"``: its create fields, the ``keyframe`` message and ``session.created``'s ``codec``."""

import pytest

from protocols import world_v1 as wire


def parse(msg: dict) -> wire.ClientMessage:
    return wire.parse_client(wire.encode(msg), default_model="tiny")


def refusal(msg: dict) -> wire.ProtocolError:
    with pytest.raises(wire.ProtocolError) as info:
        parse(msg)
    return info.value


def test_h264_create_takes_its_defaults_and_builds_back():
    req = parse({"type": "session.create", "session_id": "s", "format": "h264"})
    assert (req.format, req.bitrate_kbps, req.profile) == ("h264", 2500, "baseline")
    assert wire.CreateRequest("s", format="h264", bitrate_kbps=800, profile="main").to_wire() == {
        "type": "session.create", "session_id": "s", "format": "h264", "bitrate_kbps": 800, "profile": "main"}
    given = parse({"type": "session.create", "session_id": "s", "format": "h264", "bitrate_kbps": 20000,
                   "profile": "main"})
    assert (given.bitrate_kbps, given.profile) == (20000, "main")
    assert parse({"type": "session.create", "session_id": "s", "format": "h264",
                  "bitrate_kbps": 100}).bitrate_kbps == 100


def test_other_formats_have_no_h264_fields():
    req = parse({"type": "session.create", "session_id": "s"})
    assert (req.format, req.bitrate_kbps, req.profile) == ("jpeg", None, None)
    assert "bitrate_kbps" not in req.to_wire()


@pytest.mark.parametrize("fields, message", [
    ({"bitrate_kbps": 99}, "bitrate_kbps must be an integer in [100, 20000], got 99"),
    ({"bitrate_kbps": 20001}, "bitrate_kbps must be an integer in [100, 20000], got 20001"),
    ({"bitrate_kbps": 2500.0}, "bitrate_kbps must be an integer in [100, 20000], got 2500.0"),
    ({"bitrate_kbps": True}, "bitrate_kbps must be an integer in [100, 20000], got True"),
    ({"bitrate_kbps": "2500"}, "bitrate_kbps must be an integer in [100, 20000], got '2500'"),
    ({"profile": "high"}, "profile must be one of baseline, main, got 'high'"),
    ({"profile": 1}, "profile must be one of baseline, main, got 1"),
])
def test_bad_h264_fields_are_a_bad_request_naming_the_field(fields, message):
    exc = refusal({"type": "session.create", "session_id": "s", "format": "h264", **fields})
    assert (exc.code, exc.message, exc.message_type) == ("bad_request", message, "session.create")


@pytest.mark.parametrize("fmt", ["jpeg", "png", "rgb8"])
def test_h264_fields_with_another_format_are_a_bad_request(fmt):
    exc = refusal({"type": "session.create", "session_id": "s", "format": fmt, "bitrate_kbps": 2500,
                   "profile": "main"})
    assert (exc.code, exc.message) == ("bad_request", f"bitrate_kbps, profile go with format h264 only, not {fmt}")
    exc = refusal({"type": "session.create", "session_id": "s", "profile": "main"})
    assert exc.message == "profile go with format h264 only, not jpeg"


def test_an_unknown_format_is_a_bad_request():
    exc = refusal({"type": "session.create", "session_id": "s", "format": "h265"})
    assert (exc.code, exc.message) == ("bad_request", "format must be one of jpeg, png, rgb8, h264")


def test_keyframe_message():
    assert parse({"type": "keyframe"}) == wire.Keyframe()
    assert wire.encode(wire.Keyframe()) == '{"type":"keyframe"}'
    exc = refusal({"type": "keyframe", "now": True})
    assert (exc.code, exc.message) == ("bad_request", "unknown keyframe fields: now")


def test_created_names_the_codec_only_when_given():
    base = dict(height=480, width=832, frames_per_chunk=4, fps=16.0, credits=4)
    assert "codec" not in wire.created("s", "m", format="jpeg", **base)
    msg = wire.created("s", "m", format="h264", codec="avc1.42C01F", **base)
    assert (msg["format"], msg["codec"]) == ("h264", "avc1.42C01F")


def test_format_unavailable_is_a_code():
    assert wire.error(wire.FORMAT_UNAVAILABLE, "no encoder")["code"] == "format_unavailable"
