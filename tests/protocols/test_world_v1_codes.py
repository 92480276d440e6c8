"""The world protocol's error codes: one definition (``protocols.world_v1.ErrorCode``)
used by the wire, the session layer and the docs."""

import json
import re
from pathlib import Path

from protocols import world_v1
from sessions import ErrorCode, SessionError

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocols.md"


def test_the_session_layer_raises_the_wire_codes():
    assert ErrorCode is world_v1.ErrorCode
    assert world_v1.ERROR_CODES == tuple(c.value for c in world_v1.ErrorCode)
    assert len(set(world_v1.ERROR_CODES)) == len(world_v1.ERROR_CODES)
    err = SessionError("stale_event", "old", event_id=3)
    assert err.code is world_v1.ErrorCode.STALE_EVENT
    # A session error and a protocol error with the same code give the same frame bytes.
    assert world_v1.dumps(err.to_wire()) == world_v1.dumps(world_v1.error("stale_event", "old", event_id=3))
    assert json.loads(world_v1.dumps(err.to_wire()))["code"] == "stale_event"


def test_plain_string_names_are_the_enum_values():
    for name in ("BAD_REQUEST", "UNKNOWN_TYPE", "SESSION_FAILED", "SESSION_EVICTED", "MESSAGE_TOO_LARGE",
                 "INTERNAL"):
        value = getattr(world_v1, name)
        assert type(value) is str and value == world_v1.ErrorCode[name].value


def test_every_world_wire_code_is_documented():
    section = DOC.read_text().split("### Error codes", 1)[1].split("\n\n", 2)[1]
    documented = re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M)
    assert sorted(documented) == sorted(world_v1.ERROR_CODES)
