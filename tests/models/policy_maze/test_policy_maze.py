"""The maze policy package: weights, adapter, factory, episodes, evaluation, training smoke run."""

import json
from types import MappingProxyType, SimpleNamespace

import numpy as np
import pytest
import torch

from models.policy import build_policy
from models.policy.base import PolicyWork
from models.policy.maze import build
from models.policy.maze.adapter import DEFAULT_WEIGHTS, MazePolicy
from models.policy.maze.episodes import Episodes
from models.policy.maze.evaluate import drive_planner, evaluate
from models.policy.maze.model import HORIZON, STATE_DIM, MazeFlowModel, config, load_policy, policy_state, save_policy
from models.policy.maze.train import PromptTable, beta_at, main as train_main
from protocols.openpi import Observation, SamplingParams

TINY = config(d_model=32, num_heads=2, num_layers=1, num_inference_steps=3)


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("maze_policy") / "tiny.safetensors"
    save_policy(MazeFlowModel(TINY), path, {"steps": 0})
    return path


def _work(i: int, seed: int | None = 7) -> PolicyWork:
    rng = np.random.default_rng(i)
    obs = Observation(MappingProxyType({"image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)}),
                      rng.standard_normal(STATE_DIM).astype(np.float32), "go to the red wall", MappingProxyType({}))
    return PolicyWork(f"s{i}", f"r{i}", obs, SamplingParams(seed=seed))


def test_weights_round_trip_in_fp16(tiny_weights):
    model = load_policy(tiny_weights)
    assert (model.cfg.d_model, model.cfg.num_layers, model.cfg.num_inference_steps) == (32, 1, 3)
    torch.manual_seed(0)
    fresh = MazeFlowModel(TINY)
    for k, v in fresh.state_dict().items():
        assert torch.equal(model.state_dict()[k], v.half().float()), k


def test_adapter_advertises_the_maze_and_returns_key_bits(tiny_weights):
    policy = MazePolicy(tiny_weights, max_batch=4)
    meta = policy.metadata.to_wire()
    assert (meta["action_horizon"], meta["action_dim"], meta["image_keys"], meta["image_resolution"],
            meta["state_dim"]) == (HORIZON, 8, ["image"], [64, 64], STATE_DIM)
    assert meta["action_keys"] == "wasdijkl" and meta["execute_horizon"] == 4
    assert "go to the red wall" in meta["prompts"] and "find the blue marker" in meta["prompts"]
    out = policy.run_batch([_work(0), _work(1)])
    assert out[0].actions.shape == (HORIZON, 8)
    assert set(np.unique(np.concatenate([o.actions for o in out]))) <= {0.0, 1.0}
    # Seeded: the same answer alone or in a batch.
    assert np.array_equal(policy.run_batch([_work(1)])[0].actions, out[1].actions)


def test_factory_entry_and_build_policy_spec(tiny_weights):
    opts = SimpleNamespace(device="cpu", max_batch=3, frames_per_chunk=1, steps=2, gpu_memory_fraction=0.5)
    policy = build(str(tiny_weights), opts)
    assert isinstance(policy, MazePolicy) and policy.max_batch == 3 and policy.cfg.num_inference_steps == 2
    assert build(str(tiny_weights), SimpleNamespace(device="cpu", max_batch=None, steps=0)).cfg.num_inference_steps == 3
    via_spec = build_policy(f"maze-policy={tiny_weights}", max_batch=5)
    assert isinstance(via_spec, MazePolicy) and via_spec.max_batch == 5
    with pytest.raises(FileNotFoundError, match="maze policy weights not found"):
        MazePolicy(tiny_weights.parent / "missing.safetensors")


def test_shipped_weights_are_a_few_megabytes_and_load():
    assert DEFAULT_WEIGHTS.stat().st_size < 5 * 2**20
    policy = MazePolicy()
    assert sum(p.numel() for p in policy.model.parameters()) == 1_857_256
    assert policy.describe()["weights"] == "maze_policy.safetensors"


def test_episodes_count_frames_stop_at_the_budget_and_freeze():
    ep = Episodes([3, 4], "marker", budget=6)
    image, state = ep.observe()
    assert image.shape == (2, 64, 64, 3) and state.shape == (2, STATE_DIM)
    assert torch.equal(state[:, 3:], torch.zeros(2, STATE_DIM - 3))
    w = torch.zeros(2, 4, 8)
    w[..., 0] = 1
    ep.execute(w)
    assert ep.frames.tolist() == [4, 4] and not ep.all_done
    assert torch.equal(ep.history[:, -1], w[:, 0])
    ep.execute(w)
    assert ep.frames.tolist() == [6, 6] and ep.all_done and not bool(ep.success.any())
    pos = ep.sim.pos.clone()
    ep.execute(w)
    assert torch.equal(ep.sim.pos, pos) and ep.frames.tolist() == [6, 6]
    st = policy_state(torch.tensor([0.0]), torch.tensor([12]), torch.ones(1, 4, 8))
    assert st[0, :3].tolist() == [1.0, 0.0, 1.0] and float(st[0, 3:].sum()) == 32


def test_planner_episodes_succeed_and_stop():
    ep = Episodes([0, 1, 2], "wall")
    drive_planner(ep)
    assert ep.success.all() and ep.frames.max() < 200


def test_evaluation_reports_the_three_drivers(tiny_weights):
    policy = MazePolicy(tiny_weights, max_batch=8)
    res = evaluate(policy, mazes=2, device="cpu", budget=12, log=lambda _: None)
    for kind in ("wall", "marker"):
        row = res["per_kind"][kind]
        assert set(row) == {"planner", "random", "policy", "policy_calls", "policy_vs_planner"}
        assert row["policy_calls"] == 2 * 3  # 12 frames, 4 a call, 2 mazes
        assert row["planner"]["episodes"] == 2 and 0.0 <= row["policy_vs_planner"] <= 1.0
    assert res["seeds"] == [0, 1] and res["budget_frames"] == 12


def test_dagger_schedule_and_prompt_table():
    assert beta_at(0.1, 0.25, 0.2) == 1.0 and beta_at(0.8, 0.25, 0.2) == pytest.approx(0.2)
    assert beta_at(0.525, 0.25, 0.2) == pytest.approx(0.6)
    table = PromptTable(torch.device("cpu"))
    assert len(table.texts) == 24
    ids, offs = table.batch(torch.tensor([0, 5]))
    assert offs.tolist() == [0, int(table.lengths[0])] and len(ids) == int(table.lengths[[0, 5]].sum())


def test_training_smoke_run_and_resume(tmp_path):
    args = ["--tiny", "--device", "cpu", "--envs", "4", "--bs", "8", "--buffer", "256", "--updates", "1",
            "--minutes", "5", "--out", str(tmp_path)]
    assert train_main([*args, "--max-steps", "2"]) == 0
    assert json.loads((tmp_path / "train_log.json").read_text())["steps"] == 2
    assert train_main([*args, "--max-steps", "3", "--resume", str(tmp_path / "ckpt.pt")]) == 0
    assert json.loads((tmp_path / "train_log.json").read_text())["steps"] == 3
    assert load_policy(tmp_path / "maze_policy.safetensors").cfg.d_model == 32
