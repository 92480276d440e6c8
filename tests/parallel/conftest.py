"""A tiny LingBot checkpoint with 4 attention heads (2 or 4 ranks) and the tiny DreamZero-DROID
checkpoint (2 heads) with its tokenizer, written once per test session."""

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


@pytest.fixture(scope="session")
def dreamzero_folders(tmp_path_factory):
    """The tiny DreamZero checkpoint with DROID's action register, and its tokenizer folder."""
    from models.policy.dreamzero.config import TINY_DROID
    from models.policy.dreamzero.tiny_checkpoint import write_tiny_checkpoint, write_tiny_tokenizer

    root = tmp_path_factory.mktemp("dreamzero")
    return str(write_tiny_checkpoint(root / "ckpt", cfg=TINY_DROID)), str(write_tiny_tokenizer(root / "tok"))
