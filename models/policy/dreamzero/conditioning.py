"""What a call feeds the DiT from the robot's frames, as upstream's serving path builds it.

Read off ``dreamzero0/dreamzero`` (ab790c1): ``socket_test_optimized_AR.py``
(``ARDroidRoboarenaPolicy._convert_observation``) and ``WANPolicyHead.lazy_joint_video_action`` /
``encode_image`` in ``groot/vla/model/dreamzero/action_head/wan_flow_matching_action_tf.py``.

Frames a call uses (``frames_for_call``). Every stitched frame a robot sends joins its
history; a session's first call uses the newest one, every later call the newest 4, padded
in front by repeating the history's first frame::

    history  f0                 first call       -> [f0]
    history  f0 f1              (4 wanted)       -> [f0 f0 f0 f1]
    history  f0 .. f7           (4 wanted)       -> [f4 f5 f6 f7]

Upstream keeps the whole history; only its first 4 frames and its last 4 are ever read,
and the first only while it has fewer than 4, so keeping the last 4 (``HISTORY``) is exact.

A window restart (``window.plan_call``) encodes the newest frame as the first-frame
condition (``first_frame_condition``): its CLIP features (the penultimate block of the
vision tower) and ``y``, the VAE latents of that frame followed by ``num_frames - 1``
black frames with a 4-channel mask that is 1 on the first latent frame only::

    y = [ mask: 1 1 1 1 at latent 0, 0 elsewhere | VAE(frame, 0, 0, ..., 0) ]   [20, 1 + (num_frames-1)/4, h, w]

and the first latent frame of that encoding is what the ``t = 0`` pass writes. A call that
continues the window (4 frames) re-encodes them (``observed_latents``): each frame repeated
``num_frame_per_block`` times, the first frame put in front, ``1 + 4 n`` frames -> ``1 + n``
latents, of which the last ``n`` are written.

Pixels are ``uint8 / 255`` normalised to [-1, 1] (mean 0.5, std 0.5), as upstream's
``normalize_video``; the VAE latents are normalised with Wan2.1's mean and std (``vae.encode_latents``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from models.policy.dreamzero.config import MASK_CHANNELS, VAE_SPATIAL_STRIDE, VAE_TEMPORAL_STRIDE, DreamZeroConfig
from models.policy.dreamzero.vae import encode_latents

# Frames a call after the first re-encodes (upstream's FRAMES_PER_CHUNK), and what a session keeps.
FRAMES_PER_CALL = 4
HISTORY = FRAMES_PER_CALL
# DROID's stitched frame (observation.FRAME_HEIGHT x FRAME_WIDTH) in latent patches: 22 x 40 = 880.
_DROID_ASPECT = 22 / 40


def latent_grid(cfg: DreamZeroConfig) -> tuple[int, int]:
    """The patch grid ``(rows, columns)`` of one latent frame: of the factorings of
    ``frame_seqlen`` the one nearest DROID's 22 x 40 aspect (880 -> (22, 40); the tiny 4 -> (1, 4))."""
    n = cfg.frame_seqlen
    pairs = [(r, n // r) for r in range(1, n + 1) if n % r == 0]
    return min(pairs, key=lambda p: (abs(p[0] / p[1] - _DROID_ASPECT), p[0]))


def frame_size(cfg: DreamZeroConfig) -> tuple[int, int]:
    """The stitched frame's pixel size the DiT was built for (DROID: 352 x 640)."""
    rows, cols = latent_grid(cfg)
    ph, pw = cfg.patch_size[1:]
    return rows * ph * VAE_SPATIAL_STRIDE, cols * pw * VAE_SPATIAL_STRIDE


def frames_for_call(history: Sequence[np.ndarray], first_call: bool) -> list[np.ndarray]:
    """The frames a call uses from the session's ``history`` (oldest first, the call's own
    frames included): the newest one on a first call, else the newest ``FRAMES_PER_CALL``
    padded in front with the history's first (module docstring)."""
    if not history:
        raise ValueError("a call needs at least one frame")
    if first_call:
        return [history[-1]]
    used = list(history[-FRAMES_PER_CALL:])
    return [history[0]] * (FRAMES_PER_CALL - len(used)) + used


def to_video(frames: Sequence[np.ndarray], device: torch.device | str) -> torch.Tensor:
    """uint8 frames ``[H, W, 3]`` -> ``[1, 3, T, H, W]`` float32 in [-1, 1]."""
    x = torch.from_numpy(np.stack(frames)).to(device=device, dtype=torch.float32) / 255.0
    return ((x - 0.5) / 0.5).permute(3, 0, 1, 2)[None]


@dataclass(frozen=True)
class FirstFrame:
    """The condition of a window: the first frame's CLIP features, ``y`` and first latent."""

    clip: torch.Tensor      # [1, tokens, image_dim]
    y: torch.Tensor         # [1, 4 + z_dim, condition_latents, h, w]
    latent: torch.Tensor    # [1, z_dim, 1, h, w]


@torch.no_grad()
def first_frame_condition(image_encoder, vae, frame: np.ndarray, cfg: DreamZeroConfig,
                          device: torch.device | str) -> FirstFrame:
    """Encode ``frame`` (uint8 ``[H, W, 3]``, the stitched frame) as a window's first frame."""
    video = to_video([frame], device)                                   # [1, 3, 1, H, W]
    clip = image_encoder.encode(video[:, :, 0])
    black = torch.zeros(1, 3, cfg.num_frames - 1, *video.shape[3:], device=video.device)
    latents = encode_latents(vae, torch.cat([video, black], 2)).float()  # [1, z, L, h, w]
    mask = torch.zeros(1, MASK_CHANNELS, *latents.shape[2:], device=latents.device)
    mask[:, :, 0] = 1
    return FirstFrame(clip, torch.cat([mask, latents], 1), latents[:, :, :1])


@torch.no_grad()
def observed_latents(vae, frames: Sequence[np.ndarray], cfg: DreamZeroConfig,
                     device: torch.device | str) -> torch.Tensor:
    """The ``FRAMES_PER_CALL`` frames of a call that continues its window -> the latents the
    ``t = 0`` pass writes, ``[1, z_dim, num_frame_per_block, h, w]`` (module docstring)."""
    if len(frames) != FRAMES_PER_CALL:
        raise ValueError(f"a continuing call encodes {FRAMES_PER_CALL} frames, got {len(frames)}")
    n = cfg.num_frame_per_block
    video = to_video(frames, device)
    # 4 frames, each repeated n // (4 // 4) times: 4 n frames, the first in front: 1 + 4 n.
    video = torch.repeat_interleave(video, n * VAE_TEMPORAL_STRIDE // FRAMES_PER_CALL, dim=2)
    video = torch.cat([video[:, :, :1], video], 2)
    return encode_latents(vae, video).float()[:, :, -n:]
