"""Exact loading of LeRobot's ``model.safetensors`` into ``Pi0Model``.

Every tensor in the file is consumed and every parameter is filled, or loading
fails naming the key. Two keys are not parameters of ``Pi0Model``:

* ``model.paligemma_with_expert.paligemma.lm_head.weight``: PaliGemma ties its output
  head to the token embedding, and LeRobot's files hold the head in place of
  ``...language_model.embed_tokens.weight`` (LeRobot copies it over on load). Either
  key, or both (then they must agree in shape), fills the embedding.
* ``model.paligemma_with_expert.gemma_expert.lm_head.weight``: the action expert's
  vocabulary head, which flow matching never runs; its shape is checked and it is
  dropped (openpi's PyTorch conversion writes it; files without it load too).
"""

from __future__ import annotations

import logging
import os
from typing import Iterable

import torch
from safetensors import safe_open

from models.policy.pi0.config import CheckpointError, Pi0Config
from models.policy.pi0.model import Pi0Model

log = logging.getLogger(__name__)

PREFIX = "model."
EMBED_KEY = PREFIX + "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
TIED_HEAD_KEY = PREFIX + "paligemma_with_expert.paligemma.lm_head.weight"
EXPERT_HEAD_KEY = PREFIX + "paligemma_with_expert.gemma_expert.lm_head.weight"
WEIGHTS_FILE = "model.safetensors"


def checkpoint_keys(model: Pi0Model) -> dict[str, torch.Size]:
    """The parameter names (as saved, with ``model.``) and shapes ``Pi0Model`` needs."""
    return {PREFIX + k: v.shape for k, v in model.state_dict().items()}


def _names(keys: Iterable[str], limit: int = 5) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def load_weights(model: Pi0Model, folder: str, *, device: torch.device, dtype: torch.dtype) -> int:
    """Fill ``model`` (built on the meta device) from ``folder/model.safetensors``; returns tensors read."""
    path = os.path.join(folder, WEIGHTS_FILE)
    if not os.path.exists(path):
        raise CheckpointError(f"{folder}: no {WEIGHTS_FILE}")
    want = checkpoint_keys(model)
    cfg: Pi0Config = model.cfg
    with safe_open(path, framework="pt", device="cpu") as f:
        have = set(f.keys())
        unknown = have - set(want) - {TIED_HEAD_KEY, EXPERT_HEAD_KEY}
        if unknown:
            raise CheckpointError(f"{path}: unknown tensor {_names(unknown)} (not a pi0 parameter)")
        if EMBED_KEY not in have and TIED_HEAD_KEY in have:
            embed_source = TIED_HEAD_KEY
        else:
            embed_source = EMBED_KEY
        missing = {k for k in want if k not in have} - ({EMBED_KEY} if embed_source == TIED_HEAD_KEY else set())
        if missing:
            raise CheckpointError(f"{path}: missing tensor {_names(missing)}")
        extra_shapes = {TIED_HEAD_KEY: want[EMBED_KEY],
                        EXPERT_HEAD_KEY: torch.Size([cfg.vocab_size, cfg.expert.width])}
        for key in have:
            shape = torch.Size(f.get_slice(key).get_shape())
            expected = want.get(key, extra_shapes.get(key))
            if shape != expected:
                raise CheckpointError(f"{path}: tensor {key} has shape {list(shape)}, pi0 with this config.json "
                                      f"needs {list(expected)}")
        state = {}
        for key in want:
            src = embed_source if key == EMBED_KEY else key
            state[key[len(PREFIX):]] = f.get_tensor(src).to(device=device, dtype=dtype)
    model.load_state_dict(state, strict=True, assign=True)
    _materialise_buffers(model, device)
    log.info("pi0: loaded %d tensors from %s (%d in the file)", len(state), path, len(have))
    return len(have)


def _materialise_buffers(model: Pi0Model, device: torch.device) -> None:
    """Non-persistent buffers are not in the file: rebuild those a meta-device build left empty."""
    emb = model.paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings
    for name, buf in list(model.named_buffers()):
        if not buf.is_meta:
            continue
        if name.endswith("embeddings.position_ids"):
            emb.position_ids = torch.arange(emb.num_positions, device=device).expand((1, -1))
        else:
            raise CheckpointError(f"pi0: buffer {name} is not in the checkpoint and cannot be rebuilt")


def build_empty(cfg: Pi0Config) -> Pi0Model:
    """A ``Pi0Model`` whose tensors take no memory until ``load_weights`` assigns them."""
    with torch.device("meta"):
        return Pi0Model(cfg)


def build_random(cfg: Pi0Config, *, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Pi0Model:
    """Random weights initialised directly on ``device`` (benchmarks; nothing to download)."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype if dtype.is_floating_point else prev)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
            torch.manual_seed(seed)
            model = Pi0Model(cfg)
    finally:
        torch.set_default_dtype(prev)
    return model.to(dtype=dtype)
