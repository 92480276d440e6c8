"""The world protocol's error codes: spelled once (``protocols.world_v1``, the shared ones in
``protocols.errors``) and used by the wire, the session layer and the docs."""

import json
import re
from pathlib import Path

from protocols import world_v1
from sessions import ErrorCode, SessionError

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocols.md"


def test_the_session_layer_raises_the_wire_codes():
    assert {c.value for c in ErrorCode} == world_v1.ERROR_CODES
    assert len(ErrorCode) == len(world_v1.ERROR_CODES) == 17
    err = SessionError("stale_event", "old", event_id=3)
    assert err.code is ErrorCode.STALE_EVENT
    # A session error and a protocol error with the same code give the same frame bytes.
    assert world_v1.encode(err.to_wire()) == world_v1.encode(world_v1.error("stale_event", "old", event_id=3))
    assert json.loads(world_v1.encode(err.to_wire()))["code"] == "stale_event"


def test_each_enum_member_is_the_protocol_constant_of_its_name():
    for code in ErrorCode:
        value = getattr(world_v1, code.name)
        assert type(value) is str and value == code.value


def test_every_world_wire_code_is_documented():
    section = DOC.read_text().split("### Error codes", 1)[1].split("\n\n", 2)[1]
    documented = re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M)
    assert sorted(documented) == sorted(world_v1.ERROR_CODES)
