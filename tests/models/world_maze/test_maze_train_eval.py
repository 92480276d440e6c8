"""Training runs and resumes (tiny, CPU); the evaluation gates on the shipped checkpoint, small sample."""

import json

import pytest
import torch

from models.world.maze.rollout import SamplerConfig
from models.world.maze.training import train
from models.world.maze.training.evaluate import EvalConfig, Evaluator
from models.world.maze.weights import load_model, read_metadata


def test_tiny_training_run_writes_and_resumes(tmp_path):
    out = tmp_path / "run"
    args = ["--minutes", "1", "--out", str(out), "--tiny", "--max-steps", "2", "--eval-every", "1000",
            "--own-context", "1.0", "--policy", "balanced", "--p-still", "0.5", "--no-compile"]  # eager on CUDA too
    assert train.main(args) == 0
    log = json.loads((out / "train_log.json").read_text())
    assert (log["steps_total"], log["final"], log["flex"]) == (2, True, False)
    assert (log["args"]["own_context"], log["args"]["policy"], log["args"]["p_still"]) == (1.0, "balanced", 0.5)
    assert read_metadata(out / "maze.safetensors")["steps"] == 2
    assert (out / "ckpt.pt").exists() and (out / "model.safetensors").exists()
    # Resume from the small export (what comes back from a GPU machine).
    out2 = tmp_path / "run2"
    assert train.main(["--minutes", "1", "--out", str(out2), "--tiny", "--max-steps", "1",
                       "--eval-every", "1000", "--resume", str(out), "--no-compile"]) == 0
    assert json.loads((out2 / "train_log.json").read_text())["steps_total"] == 3


@pytest.mark.slow
def test_shipped_model_passes_the_gates_on_a_small_sample():
    """The issue's gates that a handful of mazes can check, at the CPU serving config."""
    torch.set_num_threads(2)
    cfg = EvalConfig(mazes=3, traj_len=12, context=6, horizons=(1, 4), hold=4, nokey_mazes=2, nokey_frames=10,
                     wall_mazes=3, wall_frames=4, id_steps=0, window=4, sampler=SamplerConfig(steps=2), batch=3)
    res = Evaluator(load_model(), cfg, torch.device("cpu")).run()
    one, r4 = res["one_step"], res["rollout"]["4"]
    assert one["frames_changed"] > 20
    assert one["model_db"] >= one["copy_db"] + 1.5, one
    assert one["model_db"] > one["mean_image_db"] + 5, one
    assert r4["model_db"] >= r4["copy_db"], r4
    assert res["no_key"]["min_over_frames_of_mean_db"] >= 35.0, res["no_key"]
    assert res["wall"]["mazes"] >= 1 and res["wall"]["mean_db_vs_frozen_truth"] >= 30.0, res["wall"]
    assert res["action_following"]["turn_j_vs_l"]["closer_to_own"] >= 0.8, res["action_following"]
