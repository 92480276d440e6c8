"""A tiny random Matrix-Game 2.0 variant folder in the exact published layout (for tests).

``write_tiny_variant(root, "gta_drive")`` writes ``root/gta_distilled_model/config.json``
(the published file's fields at ``config.TINY`` sizes) and ``gta_keyboard2dim.safetensors``
with every tensor under its ``model.`` name. Loading it goes through exactly the code that
loads the real one. Values are random but not degenerate: the action q/k norm weights and
the modulations are drawn too, so a test fails if the loader drops or misplaces one.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from models.world.matrix_game.checkpoint import CONFIG_NAME, PREFIX, variant_folder
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
