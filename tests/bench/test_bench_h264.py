"""bench/world/bench_h264.py on CPU: a short run at a small size writes every figure the question reads."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("av", reason="the video extra (PyAV) is not installed")

from bench.world import bench_h264  # noqa: E402
from realtime.video import PRESET  # noqa: E402


def test_the_walk_loops_through_its_script():
    period = sum(n for _, n in bench_h264.SCRIPT)
    assert bench_h264.keys_at(0) == [1.0, 0, 0, 0, 0, 0, 0, 0]          # w
    assert bench_h264.keys_at(24) == [1.0, 0, 0, 0, 0, 0, 0, 1.0]        # w + l
    assert bench_h264.keys_at(period) == bench_h264.keys_at(0)


def test_quality_measures():
    a = np.zeros((32, 32, 3), np.uint8)
    b = a.copy()
    b[0, 0, 0] = 255
    assert bench_h264.psnr(a, a) == float("inf")
    assert bench_h264.psnr(a, b) == pytest.approx(10 * np.log10(32 * 32 * 3))
    assert bench_h264.ssim(a, a) == pytest.approx(1.0)
    assert bench_h264.ssim(a, np.full_like(a, 128)) < 0.01


def test_a_short_run_writes_the_result(tmp_path):
    import torch

    threads = torch.get_num_threads()
    out = tmp_path / "h264.json"
    result = bench_h264.main(["--seconds", "0.5", "--height", "96", "--width", "160", "--presets", "ultrafast",
                              "--sessions", "2", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["frames"] == 8 and (result["height"], result["width"]) == (96, 160)
    assert list(result["h264"]) == ["ultrafast", PRESET]
    h = result["h264"][PRESET]
    assert (h["idr_frames"], h["codec"], result["h264_main"]["codec"]) == (1, "avc1.42C01F", "avc1.4D401F")
    assert h["bytes_per_frame_mean"] < result["jpeg"]["bytes_per_frame_mean"]
    assert h["psnr_db_mean"] > 30 and 0.9 < h["ssim_mean"] <= 1
    assert h["psnr_db_mean"] <= result["yuv420_round_trip"]["psnr_db_mean"] + 0.5
    assert result["sessions"]["sessions"] == 2 and result["sessions"]["frames_per_s_per_session_min"] > 0
    assert set(result["goals"]) == {"bytes_per_frame_h264_over_jpeg", "bytes_within_goal", "psnr_at_least_jpeg",
                                    "encode_ms_within_goal", "encode_cpu_ms_within_goal", "sessions_within_goal"}
    assert result["versions"]["av"] and result["hardware"]["cores"] >= 1
    assert torch.get_num_threads() == threads  # the one-core timing leaves torch's threads as they were
