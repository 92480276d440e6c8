"""The maze policy package: weights, adapter, factory, episodes, evaluation, training smoke run."""

import json
import math
from types import MappingProxyType, SimpleNamespace

import numpy as np
import pytest
import torch

from models.factory import BuildOptions, build_policy
from models.policy.base import PolicyWork
from models.policy.maze import build
from models.policy.maze.adapter import DEFAULT_WEIGHTS, MazePolicy
from models.policy.maze.episodes import Episodes
from models.policy.maze.model import (FILM_CHANNELS, HORIZON, PANORAMA_BINS, SKY_ROWS, STATE_DIM, STATE_LAYOUTS, VISIT_SATURATE,
                                      VISIT_WINDOW, MazeFlowModel, bearing_bin, column_bearings, config, egocentric,
                                      layout_of, load_policy, panorama_update, policy_state, save_policy,
                                      visit_memory)
from models.policy.maze.training.evaluate import drive_planner, drive_policy, evaluate
from models.policy.maze.training.train import PromptTable, beta_at, main as train_main
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
    assert meta["state_layout"] == "map" and policy.state_layout == "map" and STATE_DIM == 4244
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
    via_spec = build_policy(f"maze-policy={tiny_weights}", BuildOptions(max_batch=5))
    assert isinstance(via_spec, MazePolicy) and via_spec.max_batch == 5
    with pytest.raises(FileNotFoundError, match="maze policy weights not found"):
        MazePolicy(tiny_weights.parent / "missing.safetensors")


def test_shipped_weights_are_a_few_megabytes_and_load():
    assert DEFAULT_WEIGHTS.stat().st_size < 5 * 2**20
    policy = MazePolicy()
    # The keys layout reads the state through one linear map, the memory layout through an MLP, the
    # map layout through the value-iteration planner; prompt_film adds the prompt's scale and shift
    # of the stem's first maps. Run 7 (map, FiLM) is shipped.
    assert policy.metadata.state_dim == STATE_LAYOUTS[policy.state_layout]
    params = {"keys": 1_857_256, "memory": 1_941_096, "map": 2_002_256}[policy.state_layout]
    params += (128 + 1) * 2 * FILM_CHANNELS if policy.model.prompt_film else 0
    assert sum(p.numel() for p in policy.model.parameters()) == params
    assert (policy.state_layout, policy.model.prompt_film) == ("map", True)
    assert policy.describe()["weights"] == "maze_policy.safetensors"


def test_episodes_count_frames_stop_at_the_budget_and_freeze():
    ep = Episodes([3, 4], "marker", budget=6, layout="keys")
    image, state = ep.observe()
    assert image.shape == (2, 64, 64, 3) and state.shape == (2, 35)
    assert torch.equal(state[:, 3:], torch.zeros(2, 35 - 3))
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


def test_memory_state_counts_visits_and_keeps_the_sky_it_saw():
    ep = Episodes([3, 4], "marker", budget=40, layout="memory")
    image, state = ep.observe()
    assert state.shape == (2, STATE_LAYOUTS["memory"]) and torch.equal(image, ep.sim.render())
    odo, window = state[:, 35:39], state[:, 39:39 + VISIT_WINDOW ** 2].view(2, VISIT_WINDOW, VISIT_WINDOW)
    assert torch.equal(odo, torch.zeros(2, 4))            # at the start, in a cell's centre
    centre = VISIT_WINDOW // 2
    assert window[:, centre, centre].tolist() == [1 / VISIT_SATURATE] * 2 and float(window.sum()) == 2 / VISIT_SATURATE
    pano = state[:, 39 + VISIT_WINDOW ** 2:].view(2, PANORAMA_BINS, 6)
    assert torch.equal(pano, egocentric(ep.panorama, ep.sim.yaw)) and int((pano.abs().sum(-1) > 0).sum(1).min()) >= 3  # ~66 of 360 degrees
    spin = torch.zeros(2, 8)
    spin[:, 7] = 1                                          # L: turn right, 6 degrees a frame
    for _ in range(30):
        ep.step(spin)
    assert bool((ep.panorama.abs().sum(-1) > 0).sum(1).min() >= 11)  # 180 degrees more seen
    assert torch.equal(ep.visits.sum((1, 2)), torch.full((2,), 31.0))  # turning in place: one cell, 31 frames
    with pytest.raises(RuntimeError, match="frame 0"):
        ep.see_first(image)
    # The dream's frame 0 (the world model's, without beacons) replaces the simulator's in the memory.
    dream = Episodes([3], "marker", layout="memory")
    dream.see_first(torch.zeros(1, 64, 64, 3, dtype=torch.uint8))
    assert float(dream.panorama.abs().sum()) == 0.0
    dream.step(torch.zeros(1, 8), camera=torch.full((1, 64, 64, 3), 255, dtype=torch.uint8))
    assert int((dream.panorama == 1.0).all(-1).sum()) >= 3 and float(dream.panorama.sum()) == float((dream.panorama == 1.0).sum())


def test_visit_window_and_panorama_exact_values():
    visits = torch.zeros(1, 15, 15)
    visits[0, 5, 7] = 32     # row y = 5, column x = 7
    visits[0, 1, 1] = 4
    mem = visit_memory(torch.tensor([[7.25, 5.5]]), torch.tensor([[1.5, 1.5]]), visits)
    assert mem[0, :4].tolist() == pytest.approx([5.75 / 15, 4.0 / 15, -0.25, 0.0])
    window = mem[0, 4:].view(VISIT_WINDOW, VISIT_WINDOW)
    r = VISIT_WINDOW // 2
    assert window[r, r] == 1.0 and float(window.sum()) == 1.0   # (1, 1) is 6 cells away: outside the window
    mem = visit_memory(torch.tensor([[1.5, 1.5]]), torch.tensor([[1.5, 1.5]]), visits)
    window = mem[0, 4:].view(VISIT_WINDOW, VISIT_WINDOW)
    assert window[r, r] == 4 / VISIT_SATURATE and float(window[:r - 1].sum()) == 0.0  # beyond the edge reads 0
    # Panorama: looking along +x (yaw 0) the columns span -33..+33 degrees: bins 15, 0, 1 of 16
    # (bin k centred on k * 22.5 degrees).
    bins = bearing_bin(column_bearings(torch.zeros(1)))
    assert sorted(set(bins[0].tolist())) == [0, 1, 15]
    image = torch.zeros(2, 64, 64, 3, dtype=torch.uint8)
    image[:, :SKY_ROWS, 32:, 0] = 255    # the right half's sky is red: bearings 0..33 degrees
    image[:, SKY_ROWS:, :, 2] = 255      # below the sky rows: not looked at
    pano = panorama_update(torch.full((2, PANORAMA_BINS, 6), 0.5), image, torch.zeros(2), torch.tensor([True, False]))
    assert pano[0, 1].tolist() == [1.0, 0, 0, 1.0, 0, 0] and pano[0, 15].tolist() == [0.0] * 6
    assert pano[0, 0, 0] == pytest.approx(0.5) and pano[0, 0, 3] == 1.0 and pano[0, 5].tolist() == [0.5] * 6
    # Heading-up: at yaw 45 degrees (bin 2) row 0 is world bin 2, row 14 world bin 0.
    ego = egocentric(pano, torch.full((2,), math.radians(45.0)))
    assert torch.equal(ego[0, 0], pano[0, 2]) and torch.equal(ego[0, 14], pano[0, 0]) and torch.equal(ego[0, 15], pano[0, 1])
    assert torch.equal(pano[1], torch.full((PANORAMA_BINS, 6), 0.5))    # not live: unchanged


def test_layouts_are_checked_where_they_meet(tiny_weights, tmp_path):
    assert layout_of(35) == "keys" and layout_of(216) == "memory"
    with pytest.raises(ValueError, match="no maze state layout"):
        layout_of(36)
    with pytest.raises(ValueError, match="state layout must be one of"):
        Episodes([3], "wall", layout="atlas")
    keys_weights = tmp_path / "keys.safetensors"
    save_policy(MazeFlowModel(config("keys", d_model=32, num_heads=2, num_layers=1)), keys_weights)
    assert load_policy(keys_weights).state_layout == "keys" and load_policy(tiny_weights).state_layout == "map"
    with pytest.raises(ValueError, match="episodes build the 'keys' state, the policy reads 'map'"):
        drive_policy(Episodes([3], "wall", layout="keys"), MazePolicy(tiny_weights))


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
    assert beta_at(0.45, 0.2, 0.1, end=0.7) == pytest.approx(0.55) and beta_at(0.9, 0.2, 0.1, end=0.7) == 0.1
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
    assert load_policy(tmp_path / "maze_policy.safetensors").state_layout == "map"
    keys = tmp_path / "keys"
    assert train_main([*args[:-1], str(keys), "--max-steps", "1", "--state", "keys"]) == 0
    assert load_policy(keys / "maze_policy.safetensors").state_layout == "keys"
    aux = tmp_path / "aux"  # the target head trains beside the policy and is not saved with it
    assert train_main([*args[:-1], str(aux), "--max-steps", "2", "--state", "keys", "--prompt-film",
                       "--target-aux", "0.5"]) == 0
    log = json.loads((aux / "train_log.json").read_text())
    assert log["target_aux"] == 0.5
    policy = load_policy(aux / "maze_policy.safetensors")
    assert policy.prompt_film and not hasattr(policy, "target_head")
    mem = tmp_path / "mem"  # the memory state read in the light of the prompt
    assert train_main([*args[:-1], str(mem), "--max-steps", "1", "--state", "memory", "--prompt-state",
                       "--target-aux", "0.5"]) == 0
    policy = load_policy(mem / "maze_policy.safetensors")
    assert policy.prompt_state and policy.state_layout == "memory"
    with pytest.raises(ValueError, match="prompt_state reads the memory layout"):
        MazeFlowModel(config("keys"), prompt_state=True)


def test_target_of_is_the_bearing_and_distance_of_the_named_goal():
    from models.policy.maze.episodes import Episodes
    from models.policy.maze.training.train import target_of

    ep = Episodes([0, 1], "marker")
    sim = ep.sim
    centre = sim.goal_cells[sim._b, sim.goal_target].float() + 0.5
    sim.yaw = torch.atan2(centre[:, 1] - sim.pos[:, 1], centre[:, 0] - sim.pos[:, 0])  # face the target
    got = target_of(ep)
    torch.testing.assert_close(got[:, :2], torch.tensor([[1.0, 0.0], [1.0, 0.0]]), atol=1e-5, rtol=0)
    assert torch.allclose(got[:, 2], ((centre - sim.pos).norm(dim=1) / 8).clamp(max=1.0))
    sim.yaw = sim.yaw - math.pi / 2  # turned left by 90 degrees: the target is to the right (+sin)
    torch.testing.assert_close(target_of(ep)[:, :2], torch.tensor([[0.0, 1.0], [0.0, 1.0]]), atol=1e-5, rtol=0)


def test_robot_reads_the_state_layout_from_the_metadata():
    from models.policy.maze.robot import state_layout

    assert state_layout({"state_dim": 35}) == "keys"          # servers from before the key
    assert state_layout({"state_dim": 216, "state_layout": "memory"}) == "memory"
    with pytest.raises(RuntimeError, match="reads a 35-float state in layout 'memory'"):
        state_layout({"state_dim": 35, "state_layout": "memory"})


def test_training_rounds_are_the_same_made_inline_or_in_workers():
    from models.maze.planner import Planner, goal_seeds, goal_sim
    from models.policy.maze.training.train import CHUNK, TRAIN_SEED0, Rounds

    inline, pooled = Rounds(CHUNK + 4, 0), Rounds(CHUNK + 4, 1)
    try:
        a, b = inline.get(1), pooled.get(1)
    finally:
        pooled.close()
    assert a == b and len(a[0]) == CHUNK + 4 == len(set(a[0]))
    base = TRAIN_SEED0 + 2 * (CHUNK + 4)                    # round 1; its second chunk 2 * CHUNK later
    assert a[0][:CHUNK] == goal_seeds(base, CHUNK) and a[0][CHUNK:] == goal_seeds(base + 2 * CHUNK, 4)
    assert [g.kind for g in a[1][:4]] == ["wall", "marker", "wall", "marker"]
    seeds, goals, fields = a
    sim = goal_sim(seeds[-4:], [g.kind for g in goals[-4:]])
    assert sim.goals == goals[-4:] and torch.equal(Planner(sim, fields[-4:]).dist, Planner(sim).dist)


def _encode(model: MazeFlowModel, prompt: str) -> torch.Tensor:
    from models.policy.flow import prompt_buckets

    torch.manual_seed(3)
    images = torch.randint(0, 256, (2, 1, 64, 64, 3), dtype=torch.uint8)
    state = torch.randn(2, model.cfg.state_dim)
    one = prompt_buckets(prompt)
    ids = torch.from_numpy(np.concatenate([one, one])).long()
    offsets = torch.tensor([0, len(one)])
    with torch.no_grad():
        return torch.cat([k for k, _ in model.encode(images, state, ids, offsets)])


def test_prompt_film_starts_as_the_unconditioned_stem_and_round_trips(tmp_path):
    torch.manual_seed(0)
    plain = MazeFlowModel(TINY)
    film = MazeFlowModel(TINY, prompt_film=True)
    film.load_state_dict({**film.state_dict(), **plain.state_dict()})
    assert torch.equal(_encode(film, "go to the red wall"), _encode(plain, "go to the red wall"))
    # Trained, the prompt reaches the image features: the same frame encodes differently per colour.
    torch.nn.init.normal_(film.film.weight, std=0.5)
    red, blue = _encode(film, "go to the red wall"), _encode(film, "go to the blue wall")
    assert not torch.allclose(red, blue)
    save_policy(film, tmp_path / "film.safetensors")
    back = load_policy(tmp_path / "film.safetensors")
    assert back.prompt_film and not load_policy_plain(tmp_path, plain).prompt_film
    assert torch.allclose(_encode(back, "go to the red wall"), _encode(film.half().float(), "go to the red wall"),
                          atol=1e-5)


def load_policy_plain(tmp_path, model: MazeFlowModel) -> MazeFlowModel:
    save_policy(model, tmp_path / "plain.safetensors")
    return load_policy(tmp_path / "plain.safetensors")
