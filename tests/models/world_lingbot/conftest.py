"""Tiny LingBot configurations shared by the tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.world.lingbot.config import LingBotTransformerConfig

FIXTURES = Path(__file__).with_name("fixtures")

# 2 layers, 2 heads x 12: every code path of the 14B model, in milliseconds.
TINY = LingBotTransformerConfig(num_attention_heads=2, attention_head_dim=12, in_channels=36,
                                out_channels=16, text_dim=16, freq_dim=8, ffn_dim=32, num_layers=2,
                                sink_size=3, num_frames_per_block=3, sliding_window_num_frames=12)


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture
def tiny_config() -> LingBotTransformerConfig:
    return TINY


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A tiny checkpoint in the real diffusers layout, written once per test session."""
    from models.world.lingbot.tiny_checkpoint import write_tiny_checkpoint
    return write_tiny_checkpoint(tmp_path_factory.mktemp("lingbot") / "ckpt")
