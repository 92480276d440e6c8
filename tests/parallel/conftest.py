"""A tiny LingBot checkpoint with 4 attention heads (2 or 4 ranks), written once per test session."""

from __future__ import annotations

import dataclasses

import pytest


@pytest.fixture(scope="session")
def four_head_checkpoint(tmp_path_factory):
    from models.world.lingbot import tiny_checkpoint

    config = dataclasses.replace(tiny_checkpoint.TINY_TRANSFORMER, num_attention_heads=4, attention_head_dim=6)
    mp = pytest.MonkeyPatch()
    mp.setattr(tiny_checkpoint, "TINY_TRANSFORMER", config)
    try:
        return tiny_checkpoint.write_tiny_checkpoint(tmp_path_factory.mktemp("lingbot4") / "ckpt")
    finally:
        mp.undo()
