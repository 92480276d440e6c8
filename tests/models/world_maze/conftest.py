"""A small random-weight maze checkpoint (written with the real saver) for adapter tests."""

import pytest
import torch

from models.world.maze.model import MazeDiT, MazeDiTConfig
from models.world.maze.weights import save_weights

TINY = MazeDiTConfig(dim=64, depth=2, heads=1)


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    torch.manual_seed(0)
    m = MazeDiT(TINY)
    for blk in m.blocks:
        torch.nn.init.normal_(blk.ada.weight, std=0.05)
    torch.nn.init.normal_(m.out.weight, std=0.05)
    path = tmp_path_factory.mktemp("maze") / "tiny.safetensors"
    save_weights(m, path, extra={"steps": 3})
    return path
