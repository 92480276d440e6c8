import os

import pytest

from bench.maze.bench_serve_cpu import _steps, pct, split_variant, summarise
from bench.report import proc_stat


def test_steps_reads_the_variants_steps():
    assert _steps([]) is None
    assert _steps(["--steps", "1"]) == 1
    assert _steps(["--max-batch", "8", "--steps", "3"]) == 3


def test_pct_picks_the_nearest_rank():
    assert pct([], 50) is None
    assert pct([4.0, 1.0, 3.0, 2.0, 5.0], 50) == 3.0
    assert pct([4.0, 1.0, 3.0, 2.0, 5.0], 99) == 5.0
    assert pct([4.0, 1.0, 3.0, 2.0, 5.0], 0) == 1.0


def test_cpu_seconds_of_this_process_grows_with_work():
    before = proc_stat(os.getpid())[0]
    x = 0
    while proc_stat(os.getpid())[0] - before < 0.02:
        x += 1
    assert proc_stat(os.getpid())[0] - before >= 0.02


def test_summarise_sets_each_served_row_beside_its_variants_bare_rows():
    def bare(phase, variant, n, fps, cpu):
        return {"phase": phase, "variant": variant, "sessions": n, "frames_per_s_per_session": fps,
                "cpu_ms_per_frame_p50": cpu}

    rows = [bare("bare", "defaults", 1, 10.0, 100.0), bare("bare", "--steps 1", 1, 16.0, 60.0),
            {"phase": "served", "variant": "defaults", "sessions": 1, "frames_per_s_per_session_min": 9.0,
             "frames_per_s_per_session_mean": 9.0, "server_cpu_ms_per_frame": 110.0, "load_avg_1m": [1.0, 1.5]},
            bare("bare_after", "defaults", 1, 8.0, 120.0)]
    out = summarise(rows)
    assert list(out) == ["defaults"]
    row = out["defaults"]["1"]
    assert row["bare_frames_per_s_per_session"] == [10.0, 8.0]
    assert row["served_over_bare_mean"] == pytest.approx(1.0)
    assert row["bare_cpu_ms_per_frame"] == pytest.approx(110.0)
    assert row["served_cpu_ms_per_frame"] == 110.0


def test_split_variant_takes_leading_environment_words():
    assert split_variant("") == ({}, [])
    assert split_variant("--steps 1") == ({}, ["--steps", "1"])
    assert split_variant("OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=10 --steps 1") == (
        {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "10"}, ["--steps", "1"])
