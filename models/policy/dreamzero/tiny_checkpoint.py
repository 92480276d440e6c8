"""A tiny random DreamZero checkpoint in the exact published layout (for tests).

Every component is real and tiny, under its published prefix and names: the DiT at
``config.TINY``, a 1-layer umt5 encoder (Wan names) of width ``TINY.text_dim``, a 2-layer
CLIP vision tower (Wan names) of width ``TINY.image_dim`` on 2x2 patches, and Wan2.1's VAE
at width 4 (original names). The tensors are spread over several shards with the index,
as the 14B checkpoint's ten are; ``experiment_cfg`` holds a GR00T-style metadata.json
(``oxe_droid``: state and action statistics of DROID's joint_position (7) and
gripper_position (1)) and a conf.yaml. Loading it goes through exactly the code that
loads the real one.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from models.policy.dreamzero.checkpoint import (COMPONENT_PREFIXES, CONF_PATH, CONFIG_NAME, DIT_PREFIX,
                                                INDEX_NAME, METADATA_PATH, shard_name)
from models.policy.dreamzero.config import TINY, DreamZeroConfig
from models.policy.dreamzero.image_encoder import WanImageEncoder
from models.policy.dreamzero.model import DreamZeroDiT
from models.policy.dreamzero.text_encoder import wan_name
from models.policy.dreamzero.vae import diffusers_names, make_vae, wan_vae_names

EMBODIMENT = "oxe_droid"
TINY_VOCAB = 30          # the LingBot tiny tokenizer's 30 pieces (models/world/lingbot/tiny_checkpoint.py)


def _stats(n: int, lo: float, hi: float) -> dict[str, list[float]]:
    step = (hi - lo) / max(1, n)
    q01 = [lo + i * step for i in range(n)]
    q99 = [hi - i * step / 2 for i in range(n)]
    return {"min": [v - 0.1 for v in q01], "max": [v + 0.1 for v in q99], "q01": q01, "q99": q99,
            "mean": [(a + b) / 2 for a, b in zip(q01, q99)], "std": [0.5] * n}


def tiny_metadata() -> dict:
    """``experiment_cfg/metadata.json`` of the tiny checkpoint (GR00T's DatasetMetadata dump)."""
    groups = {"joint_position": _stats(7, -2.0, 2.0), "gripper_position": _stats(1, 0.0, 1.0)}
    return {EMBODIMENT: {"statistics": {"state": groups, "action": groups},
                         "modalities": {"state": {"joint_position": {"shape": [7]},
                                                  "gripper_position": {"shape": [1]}},
                                        "action": {"joint_position": {"shape": [7]},
                                                   "gripper_position": {"shape": [1]}}},
                         "embodiment_tag": EMBODIMENT}}


CONF_YAML = """\
# The training configuration (resolved); read by people, not by the loader.
num_frames: 33
action_horizon: 24
num_views: 3
num_frame_per_block: 2
num_action_per_block: 24
num_state_per_block: 1
max_chunk_size: 4
frame_seqlen: 880
transforms:
  oxe_droid:
    state_concat_order: [state.joint_position, state.gripper_position]
    action_concat_order: [action.joint_position, action.gripper_position]
"""


def _randomize(module: torch.nn.Module, std: float = 0.1) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, std)


def tiny_state(cfg: DreamZeroConfig = TINY) -> dict[str, torch.Tensor]:
    """Every tensor of the tiny checkpoint under its published name."""
    from transformers import UMT5Config, UMT5EncoderModel

    state: dict[str, torch.Tensor] = {}
    dit = DreamZeroDiT(cfg)
    _randomize(dit)
    state.update({DIT_PREFIX + n: p.detach().clone() for n, p in dit.named_parameters()})

    te = UMT5EncoderModel(UMT5Config(vocab_size=TINY_VOCAB, d_model=cfg.text_dim, d_kv=4, d_ff=24, num_layers=1,
                                     num_heads=2, relative_attention_num_buckets=8, feed_forward_proj="gated-gelu",
                                     is_encoder_decoder=False))
    _randomize(te)
    state.update({COMPONENT_PREFIXES["text_encoder"] + wan_name(n): p.detach().clone()
                  for n, p in te.named_parameters()})

    ie = WanImageEncoder(dim=cfg.image_dim, patch=2, grid=2, layers=2, mlp=16, out_dim=6)
    _randomize(ie)
    state.update({COMPONENT_PREFIXES["image_encoder"] + n: p.detach().clone() for n, p in ie.named_parameters()})

    vae = make_vae(base_dim=4, z_dim=cfg.out_dim)
    _randomize(vae, 0.05)
    params = dict(vae.named_parameters())
    state.update({COMPONENT_PREFIXES["vae"] + n: params[d].detach().clone()
                  for n, d in diffusers_names(wan_vae_names()).items()})
    return state


def write_tiny_tokenizer(root: str | Path) -> Path:
    """Write the tiny umt5 tokenizer folder (``tokenizer.json`` + config) under ``root``."""
    from models.world.lingbot.tiny_checkpoint import tiny_tokenizer

    root = Path(root)
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(root)
    return root


def write_tiny_checkpoint(root: str | Path, seed: int = 0, *, shards: int = 3,
                          cfg: DreamZeroConfig = TINY) -> Path:
    """Write the tiny checkpoint under ``root`` (``shards`` safetensors files) and return it."""
    root = Path(root)
    (root / "experiment_cfg").mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    state = tiny_state(cfg)
    (root / CONFIG_NAME).write_text(json.dumps(cfg.to_checkpoint_config(), indent=2))
    names = sorted(state)
    per = -(-len(names) // shards)
    wm: dict[str, str] = {}
    for i in range(shards):
        group = {n: state[n].contiguous() for n in names[i * per:(i + 1) * per]}
        file = shard_name(i + 1, shards)
        save_file(group, str(root / file), metadata={"format": "pt"})
        wm.update({n: file for n in group})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (root / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wm}, indent=2))
    (root / METADATA_PATH).write_text(json.dumps(tiny_metadata(), indent=2))
    (root / CONF_PATH).write_text(CONF_YAML)
    return root
