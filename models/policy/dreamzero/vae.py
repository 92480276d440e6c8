"""DreamZero's Wan2.1 VAE (``action_head.vae.model.*``): the one builder is
``models/world/wan_vae_build.py`` (Matrix-Game 2.0 uses it too); DreamZero's checkpoint
errors are ``CheckpointError``, and its latents are normalised as upstream's encode does.
"""

from __future__ import annotations

import torch

from models.world.wan_vae_build import (DIM_MULT, NUM_RES_BLOCKS, TEMPORAL_DOWNSAMPLE, WanVaeError,
                                        build_vae as _build, diffusers_names, make_vae, wan_vae_names)

__all__ = ["DIM_MULT", "NUM_RES_BLOCKS", "TEMPORAL_DOWNSAMPLE", "build_vae", "diffusers_names",
           "encode_latents", "expected_names", "make_vae", "wan_vae_names"]


def expected_names(found: set[str]) -> set[str]:
    """Every original name the VAE must have (its structure is fixed)."""
    return set(wan_vae_names())


def build_vae(weights: dict[str, torch.Tensor], device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32):
    """An ``AutoencoderKLWan`` holding exactly ``weights`` (original names); an unknown or
    missing name, or another shape, fails naming it (``CheckpointError``)."""
    from models.policy.dreamzero.checkpoint import CheckpointError

    try:
        return _build(weights, device, dtype)
    except WanVaeError as e:
        raise CheckpointError(str(e)) from None


@torch.no_grad()
def encode_latents(vae, video: torch.Tensor) -> torch.Tensor:
    """``video [R, 3, 1 + 4n, H, W]`` in [-1, 1] -> normalised latents ``[R, z_dim, 1 + n, H/8, W/8]``:
    the posterior mean, then ``(mu - latents_mean) * (1 / latents_std)`` with Wan2.1's 16 values
    (diffusers' config holds upstream ``WanVideoVAE``'s mean and std), as upstream's encode scales it."""
    mu = vae.encode(video.to(vae.dtype)).latent_dist.mode()
    mean = torch.tensor(vae.config.latents_mean, dtype=mu.dtype, device=mu.device).view(1, -1, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std, dtype=mu.dtype, device=mu.device).view(1, -1, 1, 1, 1)
    return (mu - mean) * inv_std
