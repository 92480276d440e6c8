"""One block of several sessions: batched rows equal each session alone, actions steer it,
and the schedule is the published one."""

from __future__ import annotations

import pytest
import torch

from models.world.matrix_game.checkpoint import load_variant, variant_folder
from models.world.matrix_game.denoise import denoise_block, distilled_timesteps, sigma_of
from tests.models.world_matrix_game.conftest import H, W, fresh_kv, row

STEPS = (1000, 666, 333)


def test_distilled_timesteps_are_the_warped_table():
    t = distilled_timesteps(STEPS)
    assert t[0].item() == 1000.0
    # 1000 * sigma(u) with sigma(u) = 5u / (1 + 4u), u = 1 - j/1000 at j = 334, 667
    for got, j in zip(t[1:].tolist(), (334, 667)):
        u = 1 - j / 1000
        assert got == pytest.approx(1000 * 5 * u / (1 + 4 * u), abs=1e-3)
    assert distilled_timesteps((1000, 750, 500, 250)).tolist() == pytest.approx([1000.0, 937.5, 833.3333, 625.0])
    assert sigma_of(t).tolist() == pytest.approx((t / 1000).tolist())


class Session:
    """A session's inputs, made from a seed: the first image, per-video-frame actions, noise."""

    def __init__(self, model, seed: int, keys: int, mouse: bool, blocks: int = 4, steps=STEPS):
        g = torch.Generator().manual_seed(seed)
        n = 1 + 4 * (3 * blocks - 1)
        self.cross = model.project_image(torch.randn(257, 1280, generator=g))
        self.cond = torch.randn(blocks, 20, 3, H, W, generator=g)
        self.keys = (torch.rand(n, keys, generator=g) > 0.5).float()
        self.mouse = 0.1 * torch.randn(n, 2, generator=g) if mouse else None
        self.steps = steps
        self.noise = torch.randn(blocks, len(steps), 16, 3, H, W, generator=g)
        self.kv = fresh_kv(model)
        self.at = 0

    def input(self, model):
        return row(model, 3 * self.at, self.kv, self.cross, self.keys, self.mouse)

    def step(self, model):
        res = denoise_block(model, self.cond[self.at][None], [self.input(model)],
                            self.noise[self.at][:, None], self.steps)
        self.kv, self.at = res.caches[0], self.at + 1
        return res.latents[0]


def _same_kv(a, b):
    assert a.frames == b.frames and a.action_frames == b.action_frames
    for la, lb in zip(a.layers, b.layers):
        for x, y in zip((la.k, la.v, la.mouse_k, la.mouse_v, la.key_k, la.key_v),
                        (lb.k, lb.v, lb.mouse_k, lb.mouse_v, lb.key_k, lb.key_v)):
            assert (x is None) == (y is None)
            if x is not None:
                torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)   # float32 rounding of a batched GEMM


@pytest.mark.parametrize("variant,keys,mouse", [("universal", 4, True), ("templerun", 7, False)])
def test_three_sessions_at_different_positions_batched_equal_each_alone(tiny_root, variant, keys, mouse):
    model, v = load_variant(variant_folder(tiny_root, variant))
    sessions = [Session(model, seed, keys, mouse, steps=v.steps) for seed in (1, 2, 3)]
    with torch.no_grad():
        for s, warm in zip(sessions, (0, 1, 3)):      # positions 0, 3 and 9 (the window has rolled)
            for _ in range(warm):
                s.step(model)
        alone = []
        for s in sessions:
            res = denoise_block(model, s.cond[s.at][None], [s.input(model)], s.noise[s.at][:, None], v.steps)
            alone.append(res)
        batched = denoise_block(model, torch.stack([s.cond[s.at] for s in sessions]),
                                [s.input(model) for s in sessions],
                                torch.stack([s.noise[s.at] for s in sessions], 1), v.steps)
    assert [c.frames for c in batched.caches] == [(0, 1, 2), (0, 1, 2, 3, 4, 5), (6, 7, 8, 9, 10, 11)]
    for r, a in enumerate(alone):
        torch.testing.assert_close(batched.latents[r], a.latents[0], rtol=1e-5, atol=1e-5)
        _same_kv(batched.caches[r], a.caches[0])


def test_keyboard_and_mouse_steer_the_block_and_no_input_is_the_no_action_reference(tiny_root):
    model, _ = load_variant(variant_folder(tiny_root, "universal"))
    s = Session(model, 5, 4, True)
    s.keys.zero_()
    s.mouse.zero_()
    with torch.no_grad():
        s.step(model)
        kv, at = s.kv, s.at

        def block(keys, mouse):
            inp = row(model, 3 * at, kv, s.cross, keys, mouse)
            return denoise_block(model, s.cond[at][None], [inp], s.noise[at][:, None], STEPS).latents[0]

        still = block(s.keys, s.mouse)
        again = block(torch.zeros_like(s.keys), torch.zeros_like(s.mouse))
        w = s.keys.clone()
        w[:, 0] = 1.0                                    # W held
        forward = block(w, s.mouse)
        look = s.mouse.clone()
        look[:, 1] = 0.1                                 # yaw right
        turned = block(s.keys, look)
        # a key pressed only at video frames no window of this block reads (>= 4 * 5)
        late = s.keys.clone()
        late[4 * 5:, 2] = 1.0
        unread = block(late, s.mouse)
    assert torch.equal(still, again)
    assert torch.equal(still, unread)
    assert (forward - still).abs().max() > 1e-3
    assert (turned - still).abs().max() > 1e-3
    assert (forward - turned).abs().max() > 1e-3
