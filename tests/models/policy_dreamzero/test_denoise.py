"""Sampling over K/V: CFG on video only, and K/V built in two calls equal to one masked pass."""

from __future__ import annotations

import pytest
import torch

from models.policy.dreamzero.denoise import Branch, denoise_chunk, write_frames
from models.policy.dreamzero.mask import block_causal_mask
from models.policy.dreamzero.model import action_rope_angles
from models.policy.dreamzero.scheduler import make_scheduler

H = W = 4      # latent 4x4: 4 tokens a frame at patch 2x2


def _inputs(cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "text": torch.randn(1, cfg.text_len, cfg.text_dim, generator=g),
        "negative": torch.randn(1, cfg.text_len, cfg.text_dim, generator=g),
        "image": torch.randn(1, 5, cfg.image_dim, generator=g),
        "frames": torch.randn(1, cfg.out_dim, 3, H, W, generator=g),
        "y": torch.randn(1, cfg.in_dim - cfg.out_dim, 5, H, W, generator=g),
        "noise": torch.randn(1, cfg.out_dim, 2, H, W, generator=g),
        "actions": torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=g),
        "state": torch.randn(1, 1, cfg.max_state_dim, generator=g),
    }


@torch.no_grad()
def _branches(dit, x, negative):
    cond = Branch(None, dit.encode_context(x["text"], x["image"]))
    neg = Branch(None, dit.encode_context(negative, x["image"]))
    # The first frame's t=0 pass fills both branches' caches (start frame 0).
    return write_frames(dit, [cond, neg], x["frames"][:, :, :1], x["y"][:, :, :1], 0)


@torch.no_grad()
def test_cfg_guides_video_only(tiny):
    dit, cfg = tiny.dit, tiny.config
    x = _inputs(cfg)
    cond, neg = _branches(dit, x, x["negative"])
    y = x["y"][:, :, 1:3]
    video, actions = denoise_chunk(dit, [cond, neg], x["noise"], x["actions"], x["state"], y, 1, steps=1)

    # By hand: each branch alone, then one step to sigma 0 (x0 = x - sigma0 * flow).
    sigma0 = make_scheduler(1).sigmas[0].item()
    t = torch.tensor([make_scheduler(1).timesteps[0].item()], dtype=torch.float32)
    outs = [dit(x["noise"], y, t, 1, b.cross, b.kv, actions=x["actions"], action_timestep=t, state=x["state"])
            for b in (cond, neg)]
    flow = outs[1].video + 5.0 * (outs[0].video - outs[1].video)
    assert torch.allclose(video, x["noise"] - sigma0 * flow, atol=1e-5)
    assert torch.allclose(actions, x["actions"] - sigma0 * outs[0].actions, atol=1e-5)
    assert not torch.allclose(outs[0].actions, outs[1].actions, atol=1e-3)   # the branches differ

    # Another negative prompt moves the video and leaves the actions as they were.
    cond2, neg2 = _branches(dit, x, torch.zeros_like(x["negative"]))
    video2, actions2 = denoise_chunk(dit, [cond2, neg2], x["noise"], x["actions"], x["state"], y, 1, steps=1)
    assert torch.allclose(actions2, actions, atol=1e-6)
    assert not torch.allclose(video2, video, atol=1e-3)


@torch.no_grad()
def test_sixteen_steps_and_dit_cache_run(tiny):
    dit, cfg = tiny.dit, tiny.config
    x = _inputs(cfg, seed=1)
    branches = _branches(dit, x, x["negative"])
    y = x["y"][:, :, 1:3]
    full = denoise_chunk(dit, branches, x["noise"], x["actions"], x["state"], y, 1)
    cached = denoise_chunk(dit, branches, x["noise"], x["actions"], x["state"], y, 1,
                           dit_steps=(0, 1, 2, 6, 10, 13, 14, 15))
    for a, b in zip(full, cached):
        assert a.shape == b.shape and torch.isfinite(a).all() and not torch.allclose(a, b)
    one = denoise_chunk(dit, branches[:1], x["noise"], x["actions"], x["state"], y, 1)
    assert not torch.allclose(one[0], full[0])      # no guidance without the negative branch


@torch.no_grad()
def test_kv_in_two_calls_equals_one_masked_pass(tiny):
    dit, cfg = tiny.dit, tiny.config
    x = _inputs(cfg, seed=2)
    cross = dit.encode_context(x["text"], x["image"])
    frames, y = x["frames"], x["y"][:, :, :3]
    zero = torch.zeros(1)
    first = dit(frames[:, :, :1], y[:, :, :1], zero, 0, cross)                    # frame 0
    second = dit(frames[:, :, 1:3], y[:, :, 1:3], zero, 1, cross, first.kv)       # frames 1-2 over it
    mask = block_causal_mask(1, tokens_per_frame=4, frames_per_block=2, actions_per_block=0, states_per_block=0)
    whole = dit(frames, y, zero, 0, cross, mask=mask)
    assert len(second.kv) == cfg.num_layers
    for (k2, v2), (k1, v1) in zip(second.kv, whole.kv):
        assert k2.shape == (1, 12, cfg.num_heads, cfg.head_dim)
        assert torch.allclose(k2, k1, atol=1e-6) and torch.allclose(v2, v1, atol=1e-6)
    assert torch.allclose(torch.cat([first.video, second.video], 2), whole.video, atol=1e-5)
    # Without the mask frame 0 would see frames 1-2: the K/V of later layers differ.
    unmasked = dit(frames, y, zero, 0, cross, mask=torch.ones_like(mask))
    assert not torch.allclose(unmasked.kv[-1][0], whole.kv[-1][0], atol=1e-4)


def test_kv_window_keeps_the_last_frames(tiny):
    # local_attn_size = 2 * 2 + 1 = 5 frames at TINY; a sixth frame pushes out the first.
    dit, cfg = tiny.dit, tiny.config
    x = _inputs(cfg, seed=3)
    cross = dit.encode_context(x["text"], x["image"])
    with torch.no_grad():
        kv = dit(x["frames"], x["y"][:, :, :3], torch.zeros(1), 0, cross).kv
        out = dit(x["frames"], x["y"][:, :, 2:5], torch.zeros(1), 3, cross, kv).kv
    assert out[0][0].shape[1] == 5 * 4
    assert torch.equal(out[0][0][:, :8], kv[0][0][:, 4:])


def test_action_rope_positions():
    a = action_rope_angles(4, torch.tensor([0, 1, 24]))
    want = torch.tensor([[0.0, 0.0], [1.0, 0.01], [24.0, 0.24]], dtype=torch.float64)
    assert torch.allclose(a, want)


def test_refuses_bad_shapes(tiny):
    dit = tiny.dit
    with pytest.raises(ValueError, match="actions, action_timestep and state come together"):
        dit(torch.zeros(1, 16, 2, H, W), torch.zeros(1, 20, 2, H, W), torch.zeros(1), 1,
            [None] * 2, actions=torch.zeros(1, 3, 5))


@torch.no_grad()
def test_a_chunk_is_the_training_mask_with_the_state_row_open(tiny):
    # Serving: the first frame's K/V from a t=0 pass, then one chunk (2 noisy frames, actions,
    # state) over that cache. Training: one masked pass over [first | block | actions | state]
    # with t=0 on the first frame. Video and action queries see the same keys either way; the
    # state token sees only itself in training but the whole chunk when serving (upstream), so
    # the two agree exactly when the mask's state row is opened, and not with the training mask.
    dit, cfg = tiny.dit, tiny.config
    x = _inputs(cfg, seed=4)
    cross = dit.encode_context(x["text"], x["image"])
    t = torch.tensor([700.0])
    first = dit(x["frames"][:, :, :1], x["y"][:, :, :1], torch.zeros(1), 0, cross)
    chunk = dit(x["noise"], x["y"][:, :, 1:3], t, 1, cross, first.kv, actions=x["actions"],
                action_timestep=t, state=x["state"])
    seq = torch.cat([x["frames"][:, :, :1], x["noise"]], 2)
    per_frame = torch.tensor([[0.0, 700.0, 700.0]])
    mask = block_causal_mask(1, tokens_per_frame=4, frames_per_block=2,
                             actions_per_block=cfg.num_action_per_block, states_per_block=1)
    opened = mask.clone()
    opened[-1, :] = True
    whole = dit(seq, x["y"][:, :, :3], per_frame, 0, cross, actions=x["actions"], action_timestep=t,
                state=x["state"], mask=opened)
    assert torch.allclose(whole.video[:, :, 1:], chunk.video, atol=1e-5)
    assert torch.allclose(whole.actions, chunk.actions, atol=1e-5)
    trained = dit(seq, x["y"][:, :, :3], per_frame, 0, cross, actions=x["actions"], action_timestep=t,
                  state=x["state"], mask=mask)
    # Two tiny layers leave the state's reach small (its K/V change from layer 2 on), but there.
    assert (trained.actions - chunk.actions).abs().max() > 1e-5
    assert (trained.video[:, :, 1:] - chunk.video).abs().max() > 1e-5
