"""The world protocol's error codes: one list for the wire, the session layer and the docs.

protocols/ and sessions/ may not import each other (DESIGN.md layering), so each keeps
its own copy; this test is where they meet.
"""

import re
from pathlib import Path

from protocols import world_v1
from sessions.errors import ErrorCode

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocols.md"


def test_every_session_error_code_is_a_world_wire_code():
    assert sorted(c.value for c in ErrorCode) == sorted(world_v1.ERROR_CODES)
    assert len(set(world_v1.ERROR_CODES)) == len(world_v1.ERROR_CODES)


def test_every_world_wire_code_is_documented():
    section = DOC.read_text().split("### Error codes", 1)[1].split("\n\n", 2)[1]
    documented = re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M)
    assert sorted(documented) == sorted(world_v1.ERROR_CODES)
