"""Loading the transformer from a diffusers-layout folder, shard by shard.

``transformer/`` holds ``config.json`` and either one
``diffusion_pytorch_model.safetensors`` or shards listed in
``diffusion_pytorch_model.safetensors.index.json`` (``weight_map``: name ->
shard file). The model is built on the meta device, materialised empty on the
target device, and each shard is opened (memory-mapped), copied tensor by tensor
into place and closed before the next: host memory beyond the model itself stays
at about one shard. Before anything is read, the index's names must equal the
model's checkpoint names exactly; an unknown or missing key fails naming it.
The 14B checkpoint is float32 on disk (about 74 GB in 8 shards).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable, Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from models.world.lingbot.config import ConfigError, LingBotTransformerConfig
from models.world.lingbot.transformer import (CausalLingBotWorldTransformer3DModel,
                                              checkpoint_shapes, checkpoint_targets)

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
INDEX_NAME = "diffusion_pytorch_model.safetensors.index.json"


class CheckpointError(ValueError):
    """A checkpoint folder that does not hold what this model expects (names the problem)."""


def read_config(folder: Path) -> LingBotTransformerConfig:
    path = folder / CONFIG_NAME
    if not path.is_file():
        raise CheckpointError(f"{folder}: missing {CONFIG_NAME} (the transformer config)")
    try:
        return LingBotTransformerConfig.from_config(json.loads(path.read_text()))
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None
    except ValueError as e:  # not JSON
        raise CheckpointError(f"{path}: not readable JSON ({e})") from None


def weight_map(folder: Path) -> dict[str, str]:
    """Checkpoint name -> shard file name, from the index (or the single file's header)."""
    index = folder / INDEX_NAME
    if index.is_file():
        wm = json.loads(index.read_text()).get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise CheckpointError(f"{index}: no weight_map")
        return {str(k): str(v) for k, v in wm.items()}
    single = folder / WEIGHTS_NAME
    if single.is_file():
        with safe_open(str(single), framework="pt") as f:
            return {k: WEIGHTS_NAME for k in f.keys()}
    raise CheckpointError(f"{folder}: neither {INDEX_NAME} nor {WEIGHTS_NAME}")


def check_names(expected: Mapping[str, object], found: Mapping[str, object], where: str) -> None:
    missing = sorted(set(expected) - set(found))
    unknown = sorted(set(found) - set(expected))
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} key(s), first {missing[:5]}")
        if unknown:
            parts.append(f"unknown {len(unknown)} key(s), first {unknown[:5]}")
        raise CheckpointError(f"{where}: " + "; ".join(parts))


def load_transformer(folder: str | Path, device: torch.device | str = "cpu",
                     dtype: torch.dtype = torch.float32,
                     on_shard: Callable[[int, int, str], None] | None = None,
                     ) -> CausalLingBotWorldTransformer3DModel:
    """Build and load the transformer from ``folder`` (the checkpoint's ``transformer/``).

    ``on_shard(i, n, file)`` runs after each shard is loaded and closed (progress,
    and the memory test's probe).
    """
    folder = Path(folder)
    cfg = read_config(folder)
    with torch.device("meta"):
        model = CausalLingBotWorldTransformer3DModel(cfg)
    wm = weight_map(folder)
    check_names(checkpoint_shapes(model), wm, str(folder))
    model = model.to_empty(device=device).to(dtype)
    targets = checkpoint_targets(model)
    shards: dict[str, list[str]] = {}
    for name, shard in wm.items():
        shards.setdefault(shard, []).append(name)
    loaded: set[str] = set()
    for i, (shard, names) in enumerate(sorted(shards.items())):
        path = folder / shard
        if not path.is_file():
            raise CheckpointError(f"{folder}: shard {shard} listed in the index is missing")
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            absent = sorted(set(names) - keys)
            if absent:
                raise CheckpointError(f"{path}: the index lists {absent[:5]} here but the shard lacks them")
            for name in names:
                param, row, shape = targets[name]
                t = f.get_tensor(name)
                if tuple(t.shape) != shape:
                    raise CheckpointError(f"{path}: {name} has shape {tuple(t.shape)}, expected {shape}")
                with torch.no_grad():
                    param.data[row:row + shape[0]].copy_(t)
                del t
                loaded.add(name)
        log.info("lingbot transformer: shard %d/%d loaded (%s, %d tensors)", i + 1, len(shards),
                 shard, len(names))
        if on_shard is not None:
            on_shard(i, len(shards), shard)
    check_names(targets, {n: None for n in loaded}, str(folder))
    return model.eval()


def checkpoint_state(model: CausalLingBotWorldTransformer3DModel) -> dict[str, torch.Tensor]:
    """The model's weights under the checkpoint's names (q/k/v split), as the file stores them."""
    out = {}
    for name, (param, row, shape) in checkpoint_targets(model).items():
        out[name] = param.detach()[row:row + shape[0]].contiguous().cpu()
    return out


def save_transformer(model: CausalLingBotWorldTransformer3DModel, folder: str | Path,
                     max_shard_bytes: int | None = None) -> list[str]:
    """Write ``config.json`` and the weights in the diffusers layout; sharded (with the index
    json) when ``max_shard_bytes`` is given. Returns the shard file names."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_NAME).write_text(json.dumps(model.config.to_config(), indent=2))
    state = checkpoint_state(model)
    if max_shard_bytes is None:
        save_file(state, str(folder / WEIGHTS_NAME))
        return [WEIGHTS_NAME]
    groups: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(state):
        nbytes = state[name].numel() * state[name].element_size()
        if groups[-1] and size + nbytes > max_shard_bytes:
            groups.append({})
            size = 0
        groups[-1][name] = state[name]
        size += nbytes
    n = len(groups)
    files = [f"diffusion_pytorch_model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    wm = {}
    for file, group in zip(files, groups):
        save_file(group, str(folder / file))
        wm.update({k: file for k in group})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (folder / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total},
                                                 "weight_map": dict(sorted(wm.items()))}, indent=2))
    return files
