"""bench/world/bench_matrix_game.py end to end on the tiny sizes on CPU: every section runs
(bare batched vs one at a time, served players over a real server, key press to first frame,
KV bytes and capacity) and writes real numbers; a spent time budget skips every section."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from tests.bench.conftest import real


@pytest.fixture
def run_bench(run_tiny):
    return partial(run_tiny, "bench.world.bench_matrix_game")


def test_every_section_runs_on_the_tiny_sizes_and_writes_real_numbers(run_bench):
    r = run_bench("--sessions", "1,2", "--served-sessions", "1,2", "--warmup-ticks", "1", "--ticks", "2",
                  "--ttff-presses", "1")
    assert r["errors"] == {} and r["skipped"] == {}
    assert r["command"].startswith("python3 -m bench.world.bench_matrix_game --tiny --device cpu")
    assert r["env"]["cpu"] and r["env"]["versions"]["torch"] == torch.__version__
    m = r["model"]
    assert (m["height"], m["width"], m["frames_per_chunk"], m["passes_per_block"]) == (32, 64, 12, 4)
    assert m["pool_sessions"] == 2 and m["decoder"] == "wan"

    bare = r["bare"]
    assert [row["sessions"] for row in bare["rows"]] == [1, 2] and real(bare["flops"]["per_block"])
    for row in bare["rows"]:
        n = row["sessions"]
        for mode, forwards in (("batched", 1), ("one_at_a_time", n)):
            b = row[mode]
            assert b["forwards_per_round"] == forwards and len(b["round_ms"]) == 2
            for key in ("round_ms_median", "round_ms_p99", "tick_ms_p99", "fps_per_session", "fps_total",
                        "transformer_ms_per_session_block", "decode_ms_per_session_block", "transformer_tflop_per_s"):
                assert real(b[key]) and b[key] > 0, (n, mode, key, b[key])
            assert b["fps_total"] == pytest.approx(n * b["fps_per_session"], rel=1e-3)
        assert real(row["batched_over_one_at_a_time"]) and real(row["transformer_speedup"])

    served = r["served"]
    assert [row["sessions"] for row in served["rows"]] == [1, 2]
    for row in served["rows"]:
        assert len(row["fps_per_session"]) == row["sessions"] and row["frames_per_chunk"] == [12]
        assert all(real(x) and x > 0 for x in row["fps_per_session"])
        for key in ("chunk_period_ms_median", "chunk_period_ms_p99", "fps_slowest_session", "server_tick_ms_p99",
                    "served_over_bare"):
            assert real(row[key]) and row[key] > 0, (key, row[key])
    assert real(r["ttff"]["ttff_ms_median"]) and r["ttff"]["ttff_ms_median"] > 0

    kv = r["kv"]
    assert kv["steady_session"]["equal_to_the_byte"] and kv["steady_session"]["held_blocks"] == 3
    full = kv["full_size_formula"]
    # 880 tokens per latent frame x 30 layers x K and V x 1536 x 2 bytes; the CLIP slot 257 tokens.
    assert (full["page_bytes"], full["cross_bytes"]) == (880 * 30 * 2 * 1536 * 2, 257 * 30 * 2 * 1536 * 2)
    assert real(full["session_bytes"]) and full["80_gib"]["sessions"] >= 1
    assert full["141_gib"]["sessions"] > full["80_gib"]["sessions"]
    assert real(r["summary"]["alone_fps"]) and r["summary"]["most_players_at_25_fps_served"] in (0, 1, 2)


def test_a_spent_budget_skips_every_section_and_still_writes_the_run(run_bench):
    r = run_bench("--budget-s", "0", "--only", "bare", "kv", "ttff")
    assert r["errors"] == {}
    assert set(r["skipped"]) == {"bare", "kv", "ttff"}
    assert "bare" not in r and "kv" not in r and "ttff" not in r
    assert r["model"]["pool_sessions"] == 2 and real(r["elapsed_s"])
