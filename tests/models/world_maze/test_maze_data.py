"""Training clips: the still-camera augmentation is exact simulator truth."""

import torch

from models.maze.sim import MazeSim
from models.world.maze.training.data import ClipStream, hold_still, render_trajectories


def test_hold_still_repeats_frame_k_with_no_key_and_leaves_other_clips_alone():
    frames = torch.arange(3 * 6, dtype=torch.uint8).view(3, 6, 1, 1, 1).expand(3, 6, 2, 2, 3).clone()
    acts = torch.ones(3, 6, 8)
    gen = torch.Generator().manual_seed(0)
    f, a = hold_still(frames, acts, share=1.0, gen=gen)
    for b in range(3):
        ids = f[b, :, 0, 0, 0].tolist()
        k = max(t for t in range(6) if ids[t] == 6 * b + t)    # the last frame still in place
        assert 1 <= k <= 4
        assert ids == [6 * b + t for t in range(k + 1)] + [6 * b + k] * (5 - k)
        assert a[b, : k + 1].eq(1).all() and a[b, k + 1:].eq(0).all()
    f0, a0 = hold_still(frames, acts, share=0.0, gen=gen)
    assert torch.equal(f0, frames) and torch.equal(a0, acts)


def test_still_clips_are_what_the_simulator_renders_for_their_actions():
    seeds = [11, 12, 13]
    frames, acts = render_trajectories(seeds, 15, policy_seed=5, device="cpu")
    f, a = hold_still(frames, acts, share=1.0, gen=torch.Generator().manual_seed(1))
    assert not torch.equal(f, frames)
    sim = MazeSim(seeds, "cpu")
    replay = [sim.render()]
    for t in range(1, 16):
        sim.step(a[:, t])
        replay.append(sim.render())
    assert torch.equal(torch.stack(replay, 1), f)


def test_clip_stream_applies_its_still_share():
    stream = ClipStream("cpu", envs=4, traj_len=20, rounds=1, p_still=1.0)
    stream.fill()
    f, a = stream.sample(8, torch.Generator().manual_seed(2))
    assert f.shape == (8, 16, 64, 64, 3) and a.shape == (8, 16, 8)
    assert torch.equal(f[:, -1], f[:, -2]) and a[:, -1].eq(0).all()
