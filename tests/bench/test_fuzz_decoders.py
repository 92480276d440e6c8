"""The fuzz benchmark's decoder half at CI size (``bench/fuzz/run_fuzz.py`` runs 10,000+ cases
each): every case through each protocol's decoder gets a documented error or a valid message,
never another exception."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("hypothesis")  # the dev extra; skipped where it is not installed

from hypothesis import HealthCheck, given, settings  # noqa: E402

from bench.fuzz import cases  # noqa: E402
from bench.fuzz.decoders import decode_openpi, decode_tts, decode_world  # noqa: E402
from protocols import openpi  # noqa: E402

CI = settings(max_examples=300, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
META = openpi.PolicyMetadata(action_horizon=4, action_dim=2, image_keys=("cam_high", "cam_wrist"),
                             image_resolution=(8, 8), state_dim=3)
VALID_OBS = cases.policy_metadata_template(META.to_wire())


@CI
@given(cases.world_frames())
def test_world_v1_decoder(frame):
    assert decode_world(frame).split(":")[0] in ("ok", "error", "close")


@CI
@given(cases.tts_frames(with_close=True))
def test_tts_v1_decoder(frame):
    assert decode_tts(frame).split(":")[0] in ("ok", "error")


@CI
@given(cases.openpi_frames(VALID_OBS))
def test_openpi_decoder(frame):
    assert decode_openpi(frame, META).split(":")[0] in ("ok", "close")


def test_the_valid_templates_decode():
    assert decode_openpi(cases.Frame(openpi.pack(VALID_OBS), "valid"), META) == "ok:InferRequest"
    assert [decode_world(cases.Frame(json.dumps(t), "v")) for t in cases.WORLD_TEMPLATES] == [
        "ok:session.create", "ok:event", "ok:event", "ok:credit", "ok:session.reset", "ok:session.close"]
    assert [decode_tts(cases.Frame(json.dumps(t), "v")) for t in cases.TTS_TEMPLATES] == [
        "ok:session.update", "ok:input.text", "ok:input.text",
        "ok:input.done", "ok:response.cancel"]
