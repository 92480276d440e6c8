"""The fuzz benchmark's live half at CI size (``bench/fuzz/run_fuzz.py`` runs 10,000+ cases each):
a real server process, one probe per protocol, every answer a documented message, error code or
close code, and no traceback in the server's log."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest

pytest.importorskip("hypothesis")  # the dev extra; skipped where it is not installed

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402

from bench.fuzz import cases  # noqa: E402
from bench.fuzz.live import OpenPIProbe, TTSProbe, WorldProbe  # noqa: E402
from deploy.server_process import ServerProcess  # noqa: E402

# No shrinking against a live server: the failing frame is in the assertion message.
CI = settings(max_examples=150, deadline=None, database=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(tts=True) as proc:
        yield proc
        assert proc.alive and proc.healthy()
        assert proc.problems() == []


def test_world_v1_live(server):
    probe = WorldProbe(server.addr, reconnect_every=30)

    @CI
    @given(cases.world_frames())
    def one(frame):
        probe.case(frame)  # raises Crash on anything undocumented; silence is fine (text mid-sentence)

    one()
    probe.close()
    assert server.problems() == []


def test_tts_v1_live(server):
    models = httpx.get(f"http://{server.addr}/v1/models").json()["data"]
    if not any(m["kind"] == "tts" and m["available"] for m in models):
        pytest.skip("the tts extra is not installed")
    probe = TTSProbe(server.addr, reconnect_every=30)

    @CI
    @given(cases.tts_frames())
    def one(frame):
        probe.case(frame)  # raises Crash on anything undocumented; silence is fine (text mid-sentence)

    one()
    probe.close()
    assert server.problems() == []


def test_openpi_live(server):
    probe = OpenPIProbe(server.addr)
    probe._connect()
    valid = cases.policy_metadata_template(probe.metadata)

    @CI
    @given(cases.openpi_frames(valid))
    def one(frame):
        probe.case(frame)  # raises Crash on anything undocumented; silence is fine (text mid-sentence)

    one()
    probe.close()
    assert server.problems() == []
