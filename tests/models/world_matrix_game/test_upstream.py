"""Against upstream: three blocks of each variant equal what Matrix-Game-2's own
``CausalWanModel`` and inference loop produced for the same weights, inputs and noise
(``fixtures/upstream_blocks.json``), at the published 44x80 latent (upstream hard-codes its
880 tokens per frame and an action head of 64) and a tiny width."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from models.world.matrix_game.config import TINY
from models.world.matrix_game.denoise import denoise_block
from models.world.matrix_game.model import MatrixGameDiT, RowInput, empty_kv
from models.world.matrix_game.tiny_checkpoint import tiny_state
from models.world.matrix_game.window import block_windows

FIXTURE = json.loads((Path(__file__).with_name("fixtures") / "upstream_blocks.json").read_text())
H, W, S, BLOCKS = 44, 80, 880, 3


def _recipe(variant: str):
    base = TINY[variant]
    cfg = replace(base, action=replace(base.action, keyboard_hidden_dim=128, mouse_hidden_dim=128,
                                       mouse_qk_dim_list=(8, 28, 28), rope_dim_list=(8, 28, 28)))
    model = MatrixGameDiT(cfg).eval()
    model.load_state_dict({k[len("model."):]: v for k, v in tiny_state(cfg, seed=3).items()}, strict=True)
    steps = FIXTURE["variants"][variant]["steps"]
    g = torch.Generator().manual_seed(0)
    clip = torch.randn(1, 257, 1280, generator=g)
    cond = torch.randn(1, 20, 3 * BLOCKS, H, W, generator=g)
    n = 1 + 4 * (3 * BLOCKS - 1)
    keys = (torch.rand(1, n, cfg.action.keyboard_dim_in, generator=g) > 0.5).float()
    mouse = 0.1 * torch.randn(1, n, 2, generator=g) if cfg.action.enable_mouse else None
    noise = torch.randn(BLOCKS, len(steps), 1, 16, 3, H, W, generator=g)
    return model, steps, clip, cond, keys, mouse, noise


def _windows(history: torch.Tensor, start: int) -> torch.Tensor:
    return block_windows(history[0], start, 3, 12, 4)


@pytest.mark.parametrize("variant", ["universal", "gta_drive", "templerun"])
def test_blocks_match_upstream(variant):
    model, steps, clip, cond, keys, mouse, noise = _recipe(variant)
    want = FIXTURE["variants"][variant]["blocks"]
    with torch.no_grad():
        cross = model.project_image(clip[0])
        kv = empty_kv(model.config, S)
        for b in range(BLOCKS):
            s = 3 * b
            row = RowInput(s, kv, cross, _windows(keys, s), _windows(mouse, s) if mouse is not None else None)
            res = denoise_block(model, cond[:, :, s:s + 3], [row], noise[b], steps)
            kv = res.caches[0]
            out = res.latents[0]
            idx = torch.linspace(0, out.numel() - 1, len(want[b]["samples"])).long()
            torch.testing.assert_close(out.flatten()[idx], torch.tensor(want[b]["samples"]), rtol=0, atol=2e-5)
            assert float(out.double().sum()) == pytest.approx(want[b]["sum"], abs=1e-2)
            assert float(out.double().abs().sum()) == pytest.approx(want[b]["abs_sum"], rel=1e-6)
