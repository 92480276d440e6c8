"""bench/world/bench_page_latency.py: its figures, and a --quick run through the real server and Chromium."""

from __future__ import annotations

import json
import os

import pytest

from bench.maze.page_pace import CHROMIUM
from bench.world import bench_page_latency as bench


def test_blocks_alternate_abba_until_each_format_has_its_presses():
    assert bench.block_order(20, 5) == ["jpeg", "h264", "h264", "jpeg"] * 2
    assert bench.block_order(2, 1) == ["jpeg", "h264", "h264", "jpeg"]
    assert bench.block_order(3, 2) == ["jpeg", "h264", "h264", "jpeg"]


def test_percentile_interpolates_between_ranks():
    assert bench.percentile([10.0, 20.0, 30.0, 40.0], 50) == 25.0
    assert bench.percentile([10.0, 20.0, 30.0, 40.0], 90) == pytest.approx(37.0)
    assert bench.percentile([5.0], 90) == 5.0


def press(latency, rtt=20.0, queued=4, applied=True):
    return {"latency_ms": latency, "rtt_ms": rtt, "queued_at_key": queued, "painted_chunk_applied_the_event": applied}


def test_summary_counts_missed_presses_apart():
    s = bench.summary([press(100.0), press(300.0, applied=False), press(200.0), {"latency_ms": None}])
    assert (s["n"], s["missed"], s["median_ms"], s["max_ms"], s["min_ms"]) == (3, 1, 200.0, 300.0, 100.0)
    assert s["p90_ms"] == pytest.approx(280.0)
    assert (s["rtt_median_ms"], s["after_arrival_median_ms"], s["queued_at_key_median"]) == (20.0, 180.0, 4)
    assert s["painted_chunk_applied_the_event"] == 2
    assert bench.summary([{"latency_ms": None}]) == {"n": 0, "missed": 1}


def test_the_goal_is_h264s_median_within_one_frame_of_jpegs():
    met = bench.goal({"jpeg": {"median_ms": 280.0}, "h264": {"median_ms": 340.0}}, 15.0)
    assert met["h264_minus_jpeg_median_ms"] == 60.0 and met["h264_minus_jpeg_median_frames"] == pytest.approx(0.9)
    assert met["within_one_frame"] is True
    assert bench.goal({"jpeg": {"median_ms": 280.0}, "h264": {"median_ms": 350.0}}, 15.0)["within_one_frame"] is False
    assert bench.goal({"jpeg": {"median_ms": 280.0}, "h264": {"n": 0}}, 15.0)["within_one_frame"] is False


@pytest.mark.timeout(300)
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} missing: apt-get install chromium")
def test_a_quick_run_writes_the_result(tmp_path):
    pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    pytest.importorskip("av", reason="PyAV is not installed: the server cannot encode H.264")
    out = tmp_path / "page_latency.json"
    result = bench.main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert (result["world"], result["height"], result["width"], result["fps"]) == ("maze-sim", 64, 64, 15.0)
    assert result["h264_codec"] == "avc1.42C01F"
    assert [b["format"] for b in result["blocks"]] == ["jpeg", "h264", "h264", "jpeg"]
    for fmt in bench.FORMATS:
        s = result["formats"][fmt]
        assert (s["n"], s["missed"]) == (2, 0)
        # A key press reaches the canvas through the server's queue of chunks: more than a frame, well under 10 s.
        assert 1000 / 15 < s["median_ms"] <= s["p90_ms"] <= s["max_ms"] < 10_000
        assert s["painted_chunk_applied_the_event"] == 2
        assert s["still_noise_share_max"] < bench.SHARE
    # L and J by turns across the blocks: the view swings back and forth.
    assert [p["key"] for p in result["presses"]["jpeg"]] == ["l", "j"]
    assert [p["key"] for p in result["presses"]["h264"]] == ["j", "l"]
    assert set(result["goal"]) == {"frame_interval_ms", "h264_minus_jpeg_median_ms", "h264_minus_jpeg_median_frames",
                                   "within_one_frame"}
    assert set(result["versions"]) == {"python", "torch", "av", "playwright", "chromium"}
    assert result["versions"]["chromium"] and result["hardware"]["cores"] >= 1
    assert result["console_errors"] == []
