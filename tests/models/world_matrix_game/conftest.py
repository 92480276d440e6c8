"""Shared pieces of the Matrix-Game tests: one CPU thread (exact, repeatable sums), tiny
variant folders, and a helper that runs sessions block by block."""

from __future__ import annotations

import pytest
import torch

from models.world.matrix_game.model import MatrixGameDiT, RowInput, SessionKV, empty_kv
from models.world.matrix_game.tiny_checkpoint import write_tiny_variant
from models.world.matrix_game.window import block_windows

H, W = 4, 6           # latent grid: 2 x 3 tokens per frame


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix_game")
    for variant in ("universal", "gta_drive", "templerun"):
        write_tiny_variant(root, variant, seed=1)
    return root


def windows(history: torch.Tensor, start: int, frames: int = 3) -> torch.Tensor:
    """``[frames, 12, C]``: each latent frame's window of a per-video-frame history ``[N, C]``."""
    return block_windows(history, start, frames, 12, 4)


def row(model: MatrixGameDiT, start: int, kv: SessionKV, cross, keys: torch.Tensor,
        mouse: torch.Tensor | None) -> RowInput:
    return RowInput(start, kv, cross, windows(keys, start),
                    windows(mouse, start) if mouse is not None else None)


def fresh_kv(model: MatrixGameDiT) -> SessionKV:
    return empty_kv(model.config, model.tokens_per_frame(H, W))
