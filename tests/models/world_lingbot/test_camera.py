"""Camera maths: key steps, intrinsics, frame-wise relative poses, Plücker rays, folding."""

from __future__ import annotations

import math

import torch

from models.world.lingbot.camera import (CameraState, advance, block_camera, default_intrinsics,
                                         fold_to_latent, integrate, key_step, plucker_rays,
                                         relative_poses)

EYE = torch.eye(4, dtype=torch.float64)


def test_key_steps_move_and_turn_in_the_camera_frame():
    assert torch.allclose(key_step({"w"})[:3, 3], torch.tensor([0, 0, 0.05], dtype=torch.float64))
    assert torch.allclose(key_step({"s"})[:3, 3], torch.tensor([0, 0, -0.05], dtype=torch.float64))
    assert torch.allclose(key_step({"d"})[:3, 3], torch.tensor([0.05, 0, 0], dtype=torch.float64))
    assert torch.allclose(key_step({"a"})[:3, 3], torch.tensor([-0.05, 0, 0], dtype=torch.float64))
    assert torch.equal(key_step(set()), EYE)
    fwd = key_step({"l"})[:3, :3] @ torch.tensor([0, 0, 1.0], dtype=torch.float64)
    assert math.isclose(math.degrees(math.atan2(fwd[0], fwd[2])), 6.0)       # L: yaw right
    fwd = key_step({"j"})[:3, :3] @ torch.tensor([0, 0, 1.0], dtype=torch.float64)
    assert math.isclose(math.degrees(math.atan2(fwd[0], fwd[2])), -6.0)
    fwd = key_step({"i"})[:3, :3] @ torch.tensor([0, 0, 1.0], dtype=torch.float64)
    assert math.isclose(math.degrees(math.atan2(-fwd[1], fwd[2])), 6.0)      # I: pitch up (y is down)
    fwd = key_step({"k"})[:3, :3] @ torch.tensor([0, 0, 1.0], dtype=torch.float64)
    assert math.isclose(math.degrees(math.atan2(-fwd[1], fwd[2])), -6.0)


def test_integration_moves_along_the_turned_heading():
    poses = integrate(EYE, [{"l"}] * 15 + [{"w"}])   # 90 degrees right, then forward
    assert torch.allclose(poses[-1][:3, 3], torch.tensor([0.05, 0, 0], dtype=torch.float64), atol=1e-12)
    assert poses.shape == (16, 4, 4)


def test_intrinsics_scale_with_the_resolution():
    assert default_intrinsics(480, 832).tolist() == [[500.0, 500.0, 416.0, 240.0]]
    assert default_intrinsics(240, 416, frames=2).tolist() == [[250.0, 250.0, 208.0, 120.0]] * 2


def test_relative_poses_are_frame_wise_and_normalised_by_the_largest_translation():
    poses = integrate(EYE, [{"w"}, {"w", "d"}, set()])
    rel = relative_poses(EYE, poses)
    # frame 0: one W step (0.05); frame 1: W+D (norm 0.0707); frame 2: no motion.
    biggest = math.hypot(0.05, 0.05)
    assert torch.allclose(rel[0, :3, 3], torch.tensor([0, 0, 0.05 / biggest], dtype=torch.float64))
    assert torch.allclose(rel[1, :3, 3].norm(), torch.tensor(1.0, dtype=torch.float64))
    assert torch.allclose(rel[2], EYE)
    first = relative_poses(None, poses)
    assert torch.allclose(first[0], EYE)          # a session's first frame


def test_plucker_rays_half_pixel_centres_origin_then_direction():
    rel = EYE.clone()[None]
    rel[0, :3, 3] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    k = torch.tensor([[2.0, 2.0, 2.0, 1.0]], dtype=torch.float64)   # 4 x 2 image, centre (2, 1)
    rays = plucker_rays(rel, k, 2, 4)
    assert rays.shape == (1, 2, 4, 6)
    assert torch.equal(rays[0, 1, 3, :3], torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    # pixel (row 1, col 3) centre (3.5, 1.5): direction (0.75, 0.25, 1) normalised.
    d = torch.tensor([0.75, 0.25, 1.0], dtype=torch.float64)
    assert torch.allclose(rays[0, 1, 3, 3:], d / d.norm())
    d = torch.tensor([-0.75, -0.25, 1.0], dtype=torch.float64)
    assert torch.allclose(rays[0, 0, 0, 3:], d / d.norm())


def test_fold_puts_channel_then_8x8_offset_per_latent_pixel():
    rays = torch.arange(2 * 16 * 24 * 6, dtype=torch.float64).reshape(2, 16, 24, 6)
    x = fold_to_latent(rays)
    assert x.shape == (384, 2, 2, 3)
    f, y, xx, c, dy, dx = 1, 1, 2, 4, 3, 5
    assert x[c * 64 + dy * 8 + dx, f, y, xx] == rays[f, 8 * y + dy, 8 * xx + dx, c]


def test_advance_chains_blocks_and_anchors_trajectories():
    cam, s1 = advance(CameraState(), [{"w"}] * 3, None, 16, 16)
    assert cam.shape == (384, 3, 2, 2) and cam.dtype == torch.float32
    assert torch.allclose(s1.pose[:3, 3], torch.tensor([0, 0, 0.1], dtype=torch.float64))  # 1st frame fixed
    cam2, s2 = advance(s1, [{"w"}] * 3, None, 16, 16)
    assert torch.allclose(s2.pose[:3, 3], torch.tensor([0, 0, 0.25], dtype=torch.float64))
    assert torch.allclose(cam2, block_camera(s1.pose, integrate(s1.pose, [{"w"}] * 3),
                                             default_intrinsics(16, 16, 3), 16, 16).float())
    rel = torch.stack([EYE, key_step({"d"}), key_step({"d"}) @ key_step({"d"})])
    k = torch.tensor([[500.0, 500.0, 416.0, 240.0]] * 3, dtype=torch.float64)
    _, s3 = advance(s2, [set()] * 3, (rel, k, True), 16, 16)
    assert torch.allclose(s3.pose, s2.pose @ rel[-1]) and torch.allclose(s3.anchor, s2.pose)
