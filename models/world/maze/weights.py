"""Saving and loading maze DiT weights as safetensors (config in the metadata)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from models.world.maze.model import MazeDiT, MazeDiTConfig

DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "weights" / "maze.safetensors"


def save_weights(model: MazeDiT, path: str | Path, dtype: torch.dtype = torch.float16,
                 extra: Mapping[str, object] | None = None) -> None:
    """Write the model's parameters as ``dtype`` with ``config`` (and ``extra``) as JSON metadata."""
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    meta = {"config": json.dumps(model.cfg.to_dict()), "format": "maze-dit-v1"}
    for k, v in (extra or {}).items():
        meta[k] = json.dumps(v)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=meta)


def read_metadata(path: str | Path) -> dict[str, object]:
    with safe_open(str(path), framework="pt") as f:
        return {k: json.loads(v) for k, v in (f.metadata() or {}).items() if k != "format"}


def load_model(path: str | Path = DEFAULT_WEIGHTS, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32) -> MazeDiT:
    """A ``MazeDiT`` in eval mode with the file's weights, on ``device`` as ``dtype``."""
    tensors: dict[str, torch.Tensor] = {}
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        for k in f.keys():
            tensors[k] = f.get_tensor(k)
    cfg = MazeDiTConfig(**json.loads(meta["config"]))
    model = MazeDiT(cfg)
    model.load_state_dict({k: v.float() for k, v in tensors.items()})
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)
