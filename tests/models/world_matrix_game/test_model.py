"""The rolling caches: after N blocks they hold what one pass over the whole sequence under
the block-causal window computes for the same clean latents and actions."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from models.world.matrix_game.config import TINY
from models.world.matrix_game.model import MatrixGameDiT, RowInput
from tests.models.world_matrix_game.conftest import fresh_kv, windows
from tests.models.world_matrix_game.test_denoise import Session


@pytest.mark.parametrize("variant,sink", [("universal", 0), ("gta_drive", 0), ("universal", 1), ("templerun", 0)])
def test_kv_after_n_blocks_equals_the_one_shot_sequence(variant, sink):
    torch.manual_seed(7)
    cfg = replace(TINY[variant], sink_size=sink)
    model = MatrixGameDiT(cfg).eval()
    a = cfg.action
    s = Session(model, 11, a.keyboard_dim_in, a.enable_mouse, blocks=4)
    with torch.no_grad():
        clean = torch.cat([s.step(model) for _ in range(4)], 1)        # [16, 12, h, w], committed
        one_shot = RowInput(0, fresh_kv(model), s.cross, windows(s.keys, 0, 12),
                            windows(s.mouse, 0, 12) if s.mouse is not None else None)
        cond = torch.cat(list(s.cond), 1)[None]
        _, (whole,) = model(clean[None], cond, torch.zeros(1), [one_shot])
    window = cfg.local_attn_size
    assert s.kv.frames == whole.frames == tuple(range(sink)) + tuple(range(12 - window + sink, 12))
    assert s.kv.action_frames == whole.action_frames == tuple(range(12 - window, 12))
    for i, (got, want) in enumerate(zip(s.kv.layers, whole.layers)):
        for name in ("k", "v", "mouse_k", "mouse_v", "key_k", "key_v"):
            x, y = getattr(got, name), getattr(want, name)
            assert (x is None) == (y is None), (i, name)
            if x is not None:
                torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5, msg=f"layer {i} {name}")


def test_a_row_whose_cache_does_not_end_at_its_start_is_refused():
    model = MatrixGameDiT(TINY["universal"]).eval()
    cross = model.project_image(torch.zeros(257, 1280))
    bad = RowInput(3, fresh_kv(model), cross, torch.zeros(3, 12, 4), torch.zeros(3, 12, 2))
    with pytest.raises(ValueError, match="cache ending at frame 0"):
        model(torch.zeros(1, 16, 3, 4, 6), torch.zeros(1, 20, 3, 4, 6), torch.zeros(1), [bad])
