"""bench/policy/bench_dreamzero.py end to end on the tiny checkpoint on CPU: every section runs
(the FLOP count and roofline, one robot bare per schedule, memory per session against the
capacity formula, one robot and two robots through a real server and the real openpi-client)
and writes real numbers; a spent time budget skips every section."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from tests.bench.conftest import real


@pytest.fixture
def run_bench(run_tiny):
    return partial(run_tiny, "bench.policy.bench_dreamzero")


def test_every_section_runs_on_the_tiny_checkpoint_and_writes_real_numbers(run_bench):
    r = run_bench("--robots", "2", "--calls", "2", "--robot-calls", "2")
    assert r["errors"] == {} and r["skipped"] == {}
    assert r["command"].startswith("python3 -m bench.policy.bench_dreamzero --tiny --device cpu")
    assert r["env"]["cpu"] and r["env"]["versions"]["torch"] == torch.__version__
    assert r["model"]["resident_sessions"] == 2 and r["model"]["tokens_per_chunk"] == 2 * 4 + 25

    ar = r["arithmetic"]
    assert real(ar["matmul_tflop_per_s"]) and ar["matmul_tflop_per_s"] > 0
    full = ar["droid_full_size"]
    # DROID: 2 frames x 880 tokens + 24 actions + 1 state a row; 40 layers of 4 x 5120^2 (self q k v o)
    # + 2 x 5120^2 (cross q o) + 2 x 5120 x 13824 (FFN) = 11.96 B multiply-adds a token in the blocks.
    assert full["tokens_per_chunk_row"] == 1785 and full["counts_per_token"]["blocks"] == 40 * (
        6 * 5120 * 5120 + 2 * 5120 * 13824)
    assert 90 <= full["roofline"]["denoise_step_tflop"] <= 115       # the 90-115 TFLOP a step
    # The figures models/policy/dreamzero/MODEL_CARD.md quotes ("Speed").
    assert full["linear_params_per_token"] == 12_138_577_920
    assert (full["roofline"]["denoise_step_tflop"], full["roofline"]["exact"]["chunk_tflop"],
            full["roofline"]["step_cache"]["chunk_tflop"]) == (104.4, 1759.0, 923.8)
    for g in (full, ar["served_geometry"]):
        assert g["exact"]["per_chunk_mean"] > g["step_cache"]["per_chunk_mean"] > 0
        assert [c["restart"] for c in g["exact"]["calls"]][0] is True
        for schedule in ("exact", "step_cache"):
            assert real(g["roofline"][schedule]["roofline_chunk_s"]) and g["roofline"][schedule]["roofline_chunk_s"] > 0

    b = r["bare"]
    assert real(b["cold_first_call_ms"])
    for schedule, forwards in (("exact", 17), ("step_cache", 9)):
        s = b[schedule]
        assert len(s["rows"]) == 2 and s["rows"][0]["restart"] and s["actions_finite"]
        assert [row["dit_forwards"] for row in s["rows"]] == [forwards] * 2    # the t = 0 pass + the steps
        for key in ("first_call_ms", "steady_ms_mean", "steady_ms_p99", "dit_ms_mean", "dit_tflop_per_s",
                    "dit_fraction_of_roofline", "roofline_chunk_ms_mean"):
            assert real(s[key]) and s[key] > 0, (schedule, key, s[key])

    m = r["memory"]
    steady = m["steady_session"]
    assert steady["equal_to_the_byte"] and steady["held_blocks_both_branches"] == 2 * 3  # sink 1 + window 2
    assert m["swap_round_trip"]["swapped_back"] and real(m["swap_round_trip"]["out_ms"])
    f = m["full_size_formula"]
    assert f["session_bytes"] == 11_355_008_000 and f["page_bytes"] == 720_896_000
    assert f["umt5_xxl"]["141_gib"]["sessions"] > f["umt5_xxl"]["80_gib"]["sessions"] >= 1

    s = r["served"]
    assert s["server_metadata"]["policy"] == "dreamzero" and s["server_metadata"]["needs_session_id"] is True
    assert len(s["latency_ms"]) == 2
    for key in ("first_call_ms", "steady_ms_mean", "served_over_bare"):
        assert real(s[key]) and s[key] > 0, (key, s[key])

    rob = r["robots"]
    assert rob["robots"] == 2 and len(rob["per_robot"]) == 2
    for key in ("aggregate_chunks_per_s", "roofline_chunks_per_s", "aggregate_over_roofline", "slowest_robot_p99_ms",
                "robots_per_dit_forward_mean"):
        assert real(rob[key]) and rob[key] > 0, (key, rob[key])
    # Fixed noise: a robot's chunks do not depend on who shares its batch (float32 on CPU).
    assert rob["max_abs_diff_vs_alone"] < 1e-4 and rob["bare"]["batched"]["max_abs_diff_vs_alone"] < 1e-4
    assert real(rob["bare"]["batched"]["chunks_per_s"])
    assert r["summary"]["session_bytes_equal_to_formula"] is True


def test_a_spent_budget_skips_every_section_and_still_writes_the_run(run_bench):
    r = run_bench("--budget-s", "0", "--only", "arithmetic", "bare", "memory")
    assert r["errors"] == {}
    assert set(r["skipped"]) == {"arithmetic", "bare", "memory"}
    assert "bare" not in r and "memory" not in r
    assert r["model"]["resident_sessions"] == 4 and real(r["elapsed_s"])   # --robots 4 by default
