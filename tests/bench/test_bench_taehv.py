"""bench/world/bench_taehv.py at its tiny CPU size: the figures it writes are there and consistent."""

from __future__ import annotations

import json

from bench.world.bench_taehv import main


def test_tiny_cpu_run_writes_every_figure(tmp_path):
    out = tmp_path / "taehv.json"
    result = main(["--device", "cpu", "--tiny", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["errors"] == {} and set(result["variants"]) == {"eager", "channels_last"}
    assert result["decoder_params"] == 9_844_611 and result["dtype"] == "float32"
    # 16 x 16 pixels: latent 2 x 2; float32 MemBlock inputs 3 x (256 x 4 + 128 x 16 + 64 x 64) values.
    assert result["latent"] == [2, 2]
    assert result["state_bytes_per_session"] == 4 * 3 * (256 * 4 + 128 * 16 + 64 * 64) == 86_016
    for row in result["variants"].values():
        assert row["output_frames_per_block"] == [9, 12]
        assert row["state_bytes"] == result["state_bytes_per_session"]
        assert row["max_abs_diff_frames_vs_decode"] < 1e-4
        assert row["decode"]["steady_chunk_ms"] > 0 and len(row["decode"]["all_steady_ms"]) == 1
        assert 0 < row["frames"]["steady_first_frame_ms"] <= row["frames"]["steady_chunk_ms"]
