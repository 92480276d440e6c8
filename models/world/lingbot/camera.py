"""Camera maths for LingBot's Plücker conditioning: key actions to poses, poses to rays.

Conventions (OpenCV camera: x right, y down, z forward; poses are 4x4 camera-to-world):

* A latent frame's keys move the camera in its own frame: W +0.05 along z, S -0.05,
  D +0.05 along x, A -0.05; L turns 6 degrees of yaw right (about the camera's y),
  J left; I pitches 6 degrees up (about x), K down. ``pose[f] = pose[f-1] @ step(keys)``.
* Intrinsics ``[fx, fy, cx, cy]`` are 500, 500, 416, 240 at 832x480 and scale with the
  resolution (x with the width, y with the height).
* The transformer sees, per latent frame, rays of the pose *relative to the previous
  frame* (frame-wise), translations divided by the largest translation norm of the
  block (unless all are zero), through pixel centres ``(u + 0.5, v + 0.5)``, as six
  channels: ray origin (3), then unit direction (3).
* Pixel rays are folded to the latent grid: channel ``c * 64 + dy * 8 + dx`` of latent
  pixel ``(y, x)`` is channel ``c`` of video pixel ``(8y + dy, 8x + dx)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from models.world.lingbot.config import PLUCKER_CHANNELS, VAE_SPATIAL_STRIDE

STEP = 0.05
TURN_DEGREES = 6.0
REFERENCE_SIZE = (480, 832)                  # (height, width) the default intrinsics are for
REFERENCE_INTRINSICS = (500.0, 500.0, 416.0, 240.0)


def scaled_intrinsics(intrinsics: torch.Tensor, height: int, width: int,
                      from_size: tuple[int, int] = REFERENCE_SIZE) -> torch.Tensor:
    """``[..., 4]`` intrinsics given at ``from_size`` (h, w), rescaled to ``height`` x ``width``."""
    sx, sy = width / from_size[1], height / from_size[0]
    scale = torch.tensor([sx, sy, sx, sy], dtype=intrinsics.dtype, device=intrinsics.device)
    return intrinsics * scale


def default_intrinsics(height: int, width: int, frames: int = 1) -> torch.Tensor:
    """``[frames, 4]`` default intrinsics at this resolution."""
    k = torch.tensor(REFERENCE_INTRINSICS, dtype=torch.float64)
    return scaled_intrinsics(k, height, width).expand(frames, 4).clone()


def _rot_y(deg: float) -> torch.Tensor:
    a = math.radians(deg)
    return torch.tensor([[math.cos(a), 0, math.sin(a)], [0, 1, 0], [-math.sin(a), 0, math.cos(a)]],
                        dtype=torch.float64)


def _rot_x(deg: float) -> torch.Tensor:
    a = math.radians(deg)
    return torch.tensor([[1, 0, 0], [0, math.cos(a), -math.sin(a)], [0, math.sin(a), math.cos(a)]],
                        dtype=torch.float64)


def key_step(keys: Iterable[str]) -> torch.Tensor:
    """The 4x4 camera-frame motion of one latent frame with ``keys`` held."""
    k = set(keys)
    dz = STEP * ((("w" in k) - ("s" in k)))
    dx = STEP * ((("d" in k) - ("a" in k)))
    yaw = TURN_DEGREES * (("l" in k) - ("j" in k))
    pitch = TURN_DEGREES * (("i" in k) - ("k" in k))
    m = torch.eye(4, dtype=torch.float64)
    m[:3, :3] = _rot_y(yaw) @ _rot_x(pitch)
    m[:3, 3] = torch.tensor([dx, 0.0, dz], dtype=torch.float64)
    return m


def integrate(pose: torch.Tensor, frames: Iterable[Iterable[str]]) -> torch.Tensor:
    """Poses ``[F, 4, 4]`` after each frame's keys, starting from ``pose`` (the frame before)."""
    out = []
    for keys in frames:
        pose = pose @ key_step(keys)
        out.append(pose)
    return torch.stack(out)


def se3_inverse(t: torch.Tensor) -> torch.Tensor:
    r = t[..., :3, :3].transpose(-1, -2)
    out = torch.zeros_like(t)
    out[..., :3, :3] = r
    out[..., :3, 3] = -(r @ t[..., :3, 3:]).squeeze(-1)
    out[..., 3, 3] = 1
    return out


def relative_poses(previous: torch.Tensor | None, poses: torch.Tensor) -> torch.Tensor:
    """Frame-wise relative poses ``inv(P[f-1]) @ P[f]`` of ``poses [F, 4, 4]``.

    ``previous`` is the pose before the first (None at a session's first frame: that
    frame is the identity). Translations are then divided by their largest norm.
    """
    prev = torch.cat([(poses[:1] if previous is None else previous[None]), poses[:-1]])
    rel = se3_inverse(prev) @ poses
    norm = rel[:, :3, 3].norm(dim=-1).max()
    if norm > 0:
        rel[:, :3, 3] = rel[:, :3, 3] / norm
    return rel


def plucker_rays(rel: torch.Tensor, intrinsics: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``[F, height, width, 6]``: per pixel (origin, unit direction) of each pose."""
    dtype = rel.dtype
    v, u = torch.meshgrid(torch.arange(height, dtype=dtype) + 0.5,
                          torch.arange(width, dtype=dtype) + 0.5, indexing="ij")
    fx, fy, cx, cy = (intrinsics.to(dtype)[:, i, None, None] for i in range(4))
    d = torch.stack([(u - cx) / fx, (v - cy) / fy, torch.ones_like(u).expand_as(u - cx)], -1)
    d = d / d.norm(dim=-1, keepdim=True)                                 # [F, H, W, 3]
    d = torch.einsum("fhwj,fij->fhwi", d, rel[:, :3, :3])
    o = rel[:, None, None, :3, 3].expand_as(d)
    return torch.cat([o, d], -1)


def fold_to_latent(rays: torch.Tensor, stride: int = VAE_SPATIAL_STRIDE) -> torch.Tensor:
    """``[F, H, W, 6]`` -> ``[6 * stride^2, F, H/stride, W/stride]`` (channel-major, then dy, dx)."""
    F_, H, W, C = rays.shape
    if C != PLUCKER_CHANNELS or H % stride or W % stride:
        raise ValueError(f"rays {tuple(rays.shape)} do not fold by {stride}")
    x = rays.permute(0, 3, 1, 2).reshape(F_, C, H // stride, stride, W // stride, stride)
    return x.permute(1, 3, 5, 0, 2, 4).reshape(C * stride * stride, F_, H // stride, W // stride)


def block_camera(previous: torch.Tensor | None, poses: torch.Tensor, intrinsics: torch.Tensor,
                 height: int, width: int) -> torch.Tensor:
    """The transformer's camera input for one block: ``[384, F, H/8, W/8]`` float32."""
    rel = relative_poses(previous, poses.to(torch.float64))
    return fold_to_latent(plucker_rays(rel, intrinsics.to(torch.float64), height, width)).float()


@dataclass(frozen=True)
class CameraState:
    """A session's camera between blocks (immutable: a failed tick keeps the old one)."""

    pose: torch.Tensor | None = None     # [4, 4] c2w of the last generated frame; None before any
    anchor: torch.Tensor | None = None   # world pose the playing trajectory's first frame maps to


def advance(state: CameraState, keys: Sequence[Iterable[str]],
            trajectory: tuple[torch.Tensor, torch.Tensor, bool] | None, height: int,
            width: int) -> tuple[torch.Tensor, CameraState]:
    """The next block's camera input ``[384, F, H/8, W/8]`` and the state after it.

    ``keys``: one key set per latent frame. ``trajectory``: (poses relative to the
    trajectory's first frame ``[F, 4, 4]``, intrinsics at 832x480 ``[F, 4]``, whether it
    starts in this block) or None; it takes precedence over the keys. A session's very
    first frame is the identity pose (its keys are not applied: there is no motion
    before the first image).
    """
    eye = torch.eye(4, dtype=torch.float64)
    if trajectory is not None:
        rel, intr, starts = trajectory
        anchor = (state.pose if state.pose is not None else eye) if starts or state.anchor is None \
            else state.anchor
        poses = anchor @ rel.to(torch.float64)
        intrinsics = scaled_intrinsics(intr.to(torch.float64), height, width)
    else:
        anchor = None
        if state.pose is None:
            poses = torch.cat([eye[None], integrate(eye, list(keys)[1:])]) if len(keys) > 1 else eye[None]
        else:
            poses = integrate(state.pose, keys)
        intrinsics = default_intrinsics(height, width, len(poses))
    camera = block_camera(state.pose, poses, intrinsics, height, width)
    return camera, CameraState(pose=poses[-1].clone(), anchor=anchor)
