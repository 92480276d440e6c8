"""bench/multi_gpu.sh's drivers at rehearsal size: the replicas step with 2 CPU replicas and 4
sessions behind real nginx (one killed mid-run), and the pure parts of the others. The whole
rehearsal's JSON is bench/results/multi_gpu_cpu_rehearsal.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.deploy.gpu_replicas import frames_per_s
from bench.parallel.lingbot_sp import ratios
from bench.parallel.record import merge
from deploy.nginx import find_nginx

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(find_nginx() is None, reason="nginx not installed (as root, `make nginx`)")
def test_replicas_step_on_cpu_records_throughput_contiguity_and_the_kill(tmp_path):
    out = tmp_path / "multi_gpu_replicas.json"
    subprocess.run([sys.executable, "-m", "bench.deploy.gpu_replicas", "--cpu", "--sessions", "4", "--warmup", "1",
                    "--seconds", "2", "--after-kill", "1.5", "--fresh", "2", "--out", str(out)],
                   cwd=REPO, check=True, timeout=55, capture_output=True)
    report = json.loads(out.read_text())
    assert (report["step"], report["device"], report["rehearsal"]) == ("replicas", "cpu", True)
    assert report["command"].startswith("python3 -m bench.deploy.gpu_replicas --cpu --sessions 4")
    assert report["machine"]["cpu_count"] >= 1 and report["machine"]["gpus"] == []
    one, two = report["one_replica"], report["two_replicas"]
    assert one["sessions_created"] == two["sessions_created"] == 4
    assert len(one["sessions_per_replica"]) == 1 and sum(two["sessions_per_replica"].values()) == 4
    assert one["frames_per_s_total"] > 0 and two["frames_per_s_total"] > 0
    assert report["two_over_one"] == round(two["frames_per_s_total"] / one["frames_per_s_total"], 3)
    assert report["all_chunks_contiguous"] is True
    assert (report["goal_applies"], report["within_goal"]) == (False, None)
    kill = two["kill"]
    assert kill["victim_sessions"] + kill["other_sessions"] == 4
    assert kill["victim_sessions"] >= 1   # the busier of the two replicas is the one killed
    assert kill["victim_close_codes"] == {"1006": kill["victim_sessions"]}
    assert kill["victim_sessions_closed_as_documented"] is True
    # Two fresh ids and every lost id again, all on the replica still alive, from chunk 0.
    assert kill["new_sessions"] == 2 + kill["victim_sessions"]
    assert kill["new_sessions_on_live_replica"] is True
    assert kill["survivor_alive_at_end"] is True
    if kill["other_sessions"]:
        assert kill["others_kept_streaming"] is True and kill["others_chunks_after_kill_min"] >= 1


def test_frames_per_s_counts_the_window_only():
    records = [{"times": [0.5, 1.0, 1.5, 3.0], "frames": [1, 2, 3, 4]}, {"times": [2.9], "frames": [5]}]
    assert frames_per_s(records, start=1.0, seconds=2.0) == (2 + 3 + 5) / 2.0


def test_ratios_divide_by_one_rank_and_judge_only_where_goals_apply():
    rows = {1: {"chunk_tick_ms_median": 400.0, "ttff_ms_median": 500.0},
            2: {"chunk_tick_ms_median": 200.0, "ttff_ms_median": 300.0},
            4: {"chunk_tick_ms_median": 100.0, "ttff_ms_median": 140.0}}
    assert ratios(rows, True) == {
        "2": {"chunk_over_1": 0.5, "ttff_over_1": 0.6, "goal": "<= 0.55x one rank", "within_goal": False},
        "4": {"chunk_over_1": 0.25, "ttff_over_1": 0.28, "goal": "<= 0.3x one rank", "within_goal": True}}
    assert ratios(rows, False)["4"]["within_goal"] is None
    assert ratios({2: rows[2]}, True) == {"missing": "no one-rank figures to divide by"}


def test_merge_keeps_each_step_under_its_name(tmp_path):
    for step in ("replicas", "lingbot-sp"):
        (tmp_path / f"{step}.json").write_text(json.dumps({"step": step, "machine": {"cpu": "x"}, "n": 1}))
    merged = merge([tmp_path / "replicas.json", tmp_path / "lingbot-sp.json"], "a rehearsal", "bash s.sh")
    assert sorted(merged["steps"]) == ["lingbot-sp", "replicas"]
    assert (merged["note"], merged["script"], merged["machine"]) == ("a rehearsal", "bash s.sh", {"cpu": "x"})
