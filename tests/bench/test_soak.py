"""The soak benchmark's short variant: 8 worlds, 8 robots, 4 voices for 20 s against a
real ``realtime serve`` process; zero failed requests, contiguous chunks, no event
lost, every KV block returned, a clean log (bench/soak/run_soak.py)."""

from __future__ import annotations

import json

import pytest

from bench.soak.run_soak import main


@pytest.mark.slow
def test_soak_20_seconds(tmp_path):
    pytest.importorskip("models.tts.piper.adapter")
    out = tmp_path / "soak.json"
    code = main(["--seconds", "20", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["failures"] == [] and result["chunk_gaps"] == [] and result["lost_events"] == []
    assert result["kv_blocks_used_at_end"] == 0 and result["log_problems"] == []
    assert min(result["counts"].values()) > 0
    assert code == 0
