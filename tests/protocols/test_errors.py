"""protocols/errors.py: a code more than one protocol sends is spelled once, and each
protocol module hands its clients that spelling."""

import re
from pathlib import Path

from protocols import errors, openpi, tts_v1, world_v1

DOCS = Path(__file__).resolve().parents[2] / "docs"
SHARED = {"BAD_REQUEST": "bad_request", "UNKNOWN_TYPE": "unknown_type", "INTERNAL": "internal",
          "MESSAGE_TOO_LARGE": "message_too_large", "CLOSED_BY_ADMIN": "closed_by_admin",
          "IDLE_TIMEOUT": "idle_timeout", "TOO_MANY_SESSIONS": "too_many_sessions", "LOADING": "loading"}


def test_the_shared_codes():
    assert {name: value for name, value in vars(errors).items() if name.isupper()} == SHARED


def test_world_and_tts_spell_every_code_they_both_have_from_errors():
    for name, value in SHARED.items():
        assert getattr(world_v1, name) == getattr(tts_v1, name) == value
    assert world_v1.ERROR_CODES & tts_v1.ERROR_CODES == set(SHARED.values())
    assert "internal_error" not in tts_v1.ERROR_CODES


def test_openpi_text_frames_start_with_the_shared_codes():
    assert openpi.ERROR_CODES == {errors.IDLE_TIMEOUT, errors.TOO_MANY_SESSIONS, errors.CLOSED_BY_ADMIN,
                                  errors.LOADING}
    assert (openpi.IDLE_TIMEOUT, openpi.TOO_MANY_SESSIONS, openpi.CLOSED_BY_ADMIN, openpi.LOADING) == \
        ("idle_timeout", "too_many_sessions", "closed_by_admin", "loading")
    doc = (DOCS / "protocols_openpi.md").read_text()
    assert sorted(set(re.findall(r"`([a-z_]+): \.\.\.`", doc))) == sorted(openpi.ERROR_CODES)
