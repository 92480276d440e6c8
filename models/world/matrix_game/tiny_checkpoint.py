"""A tiny random Matrix-Game 2.0 checkpoint in the exact published layout (for tests).

``write_tiny_variant(root, "gta_drive")`` writes ``root/gta_distilled_model/config.json``
(the published file's fields at ``config.TINY`` sizes) and ``gta_keyboard2dim.safetensors``
with every tensor under its ``model.`` name. Loading it goes through exactly the code that
loads the real one. Values are random but not degenerate: the action q/k norm weights and
the modulations are drawn too, so a test fails if the loader drops or misplaces one.

``write_tiny_root(root)`` writes a whole root as served: every variant folder beside
``Wan2.1_VAE.pth`` (Wan2.1's VAE at width 4, original names) and the CLIP file (a vision
tower of CLIP's width 1280 with 2 blocks on a 2x2 grid of 2-pixel patches, plus a stand-in
text tower tensor that the loader must skip).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from models.world.matrix_game.checkpoint import (CLIP_FILE, CLIP_TEXT_PREFIX, CONFIG_NAME, PREFIX, VAE_FILE,
                                                 variant_folder)
from models.world.matrix_game.config import TINY, VARIANTS, MatrixGameConfig
from models.world.matrix_game.model import MatrixGameDiT


def tiny_state(cfg: MatrixGameConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random state dict of ``MatrixGameDiT(cfg)`` under the file's names."""
    gen = torch.Generator().manual_seed(seed)
    model = MatrixGameDiT(cfg)
    out = {}
    for name, p in model.named_parameters():
        fan_in = p.shape[-1] if p.ndim > 1 else p.numel()
        t = torch.randn(p.shape, generator=gen) / max(1.0, fan_in) ** 0.5
        if name.endswith("norm.weight") or name.endswith("_norm.weight") or ".norm_" in name:
            t = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
        out[PREFIX + name] = t.contiguous()
    return out


def write_tiny_variant(root: str | Path, variant: str, *, seed: int = 0,
                       config: MatrixGameConfig | None = None) -> Path:
    """Write the variant's folder under ``root``; returns the folder."""
    cfg = config or TINY[variant]
    folder = variant_folder(root, variant)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / CONFIG_NAME, "w") as f:
        json.dump(cfg.to_config(), f, indent=2)
    save_file(tiny_state(cfg, seed), str(folder / VARIANTS[variant].weights))
    return folder


def write_tiny_root(root: str | Path, variants: tuple[str, ...] = tuple(VARIANTS), *, seed: int = 0) -> Path:
    """Write a tiny checkpoint root (the variants, the VAE, the CLIP file); returns ``root``."""
    from models.world.wan_vae_build import diffusers_names, make_vae, wan_vae_names
    from models.world.matrix_game.config import CLIP_DIM
    from models.world.wan_clip import WanImageEncoder

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for i, variant in enumerate(variants):
        write_tiny_variant(root, variant, seed=seed + i)
    gen = torch.Generator().manual_seed(seed + 100)
    vae = make_vae(base_dim=4, z_dim=16)
    params = dict(vae.named_parameters())
    vae_state = {n: (0.05 * torch.randn(params[d].shape, generator=gen)).contiguous()
                 for n, d in diffusers_names(wan_vae_names()).items()}
    torch.save(vae_state, root / VAE_FILE)
    clip = WanImageEncoder(dim=CLIP_DIM, patch=2, grid=2, layers=2, mlp=16, out_dim=6)
    clip_state = {}
    for n, p in clip.named_parameters():
        t = 0.02 * torch.randn(p.shape, generator=gen)
        if n.endswith("norm1.weight") or n.endswith("norm2.weight") or n.endswith("_norm.weight"):
            t = t + 1.0
        clip_state[n[len(PREFIX):]] = t.contiguous()
    clip_state[CLIP_TEXT_PREFIX + "token_embedding.weight"] = torch.zeros(4, 8)
    torch.save(clip_state, root / CLIP_FILE)
    return root
