"""The Wan VAE's side of the pipeline: the first-frame condition and the latent statistics.

Latents are normalised per channel with the VAE config's ``latents_mean`` /
``latents_std`` (``(z - mean) / std``), as the Wan pipelines do. Blocks are decoded
by the streaming decoder (``models/world/wan_vae.py``, one state per session).
"""

from __future__ import annotations

import numpy as np
import torch

from models.world.lingbot.config import MASK_CHANNELS, VAE_TEMPORAL_STRIDE


def latent_stats(vae, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE's per-channel ``latents_mean`` / ``latents_std`` as ``[1, z, 1, 1, 1]`` like ``like``."""
    shape = (1, -1, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, dtype=like.dtype, device=like.device).view(shape)
    std = torch.tensor(vae.config.latents_std, dtype=like.dtype, device=like.device).view(shape)
    return mean, std


@torch.no_grad()
def encode_video(vae, video: torch.Tensor) -> torch.Tensor:
    """``[B, 3, T, H, W]`` in [-1, 1] -> normalised latents ``[B, z, 1 + (T-1)/4, H/8, W/8]``."""
    dtype = next(vae.parameters()).dtype
    z = vae.encode(video.to(dtype)).latent_dist.mode().float()
    mean, std = latent_stats(vae, z)
    return (z - mean) / std


@torch.no_grad()
def image_condition(vae, image: np.ndarray | None, height: int, width: int, latents: int,
                    device: torch.device | str = "cpu") -> torch.Tensor:
    """The image-to-video condition ``[4 + z, latents, H/8, W/8]``: mask, then image latents.

    The reference encodes the first image followed by blank (zero) frames; the mask
    marks the frames given (the 4 mask channels of latent 0 stand for its pixel frames).
    Without an image both are of an all-blank video and the mask is zero. Latent
    frames past ``latents`` reuse the last one (see ``condition_at``).
    """
    frames = 1 + VAE_TEMPORAL_STRIDE * (latents - 1)
    video = torch.zeros(1, 3, frames, height, width, device=device)
    if image is not None:
        if image.shape != (height, width, 3) or image.dtype != np.uint8:
            raise ValueError(f"image must be uint8 [{height}, {width}, 3], got {image.dtype} {image.shape}")
        video[0, :, 0] = torch.from_numpy(image).to(device).permute(2, 0, 1).float() / 127.5 - 1.0
    z = encode_video(vae, video)[0]
    mask = torch.zeros(MASK_CHANNELS, z.shape[1], *z.shape[2:], device=z.device)
    if image is not None:
        mask[:, 0] = 1.0
    return torch.cat([mask, z])


def condition_at(cond: torch.Tensor, start: int, frames: int) -> torch.Tensor:
    """Latent frames ``start .. start+frames`` of a condition (the last one repeats past its end)."""
    idx = torch.clamp(torch.arange(start, start + frames, device=cond.device), max=cond.shape[1] - 1)
    return cond.index_select(1, idx)
