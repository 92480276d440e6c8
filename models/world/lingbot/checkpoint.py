"""The checkpoint folder: validated at start, then its components loaded.

A LingBot-World v2 checkpoint in the diffusers layout is::

    model_index.json   {"_class_name": "LingBotWorldCausalDMDPipeline", "transformer": [...], ...}
    transformer/       config.json + diffusion_pytorch_model(-0000i-of-0000n).safetensors [+ index]
    text_encoder/      config.json + model(.safetensors | -shards + index)     UMT5EncoderModel
    tokenizer/         tokenizer.json (or spiece.model) + tokenizer_config.json  T5TokenizerFast
    vae/               config.json + diffusion_pytorch_model.safetensors         AutoencoderKLWan
    scheduler/         scheduler_config.json                                     UniPCMultistepScheduler

``validate_checkpoint`` checks all of it before any weight is read: a missing or
mismatched component fails naming the folder and what was expected.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from models.world.lingbot.transformer import CausalLingBotWorldTransformer3DModel
from models.world.lingbot.weights import CheckpointError, load_transformer, read_config, weight_map

log = logging.getLogger(__name__)

PIPELINE_CLASS = "LingBotWorldCausalDMDPipeline"
# component -> (library, class) as model_index.json names them.
COMPONENTS: dict[str, tuple[str, str]] = {
    "transformer": ("diffusers", "CausalLingBotWorldTransformer3DModel"),
    "text_encoder": ("transformers", "UMT5EncoderModel"),
    "tokenizer": ("transformers", "T5TokenizerFast"),
    "vae": ("diffusers", "AutoencoderKLWan"),
    "scheduler": ("diffusers", "UniPCMultistepScheduler"),
}
# Scheduler settings the 4-step DMD sampling here relies on.
SCHEDULER_REQUIRED = {"_class_name": "UniPCMultistepScheduler", "prediction_type": "flow_prediction",
                      "use_flow_sigmas": True, "flow_shift": 5.0}


def _json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(f"{path.parent}: expected {path.name} ({what})")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def _any_file(folder: Path, names: tuple[str, ...], what: str) -> None:
    if not any((folder / n).is_file() for n in names):
        raise CheckpointError(f"{folder}: expected {' or '.join(names)} ({what})")


def validate_checkpoint(root: str | Path) -> dict[str, Any]:
    """Check the layout and configs of every component; returns the scheduler config."""
    root = Path(root)
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a folder (expected a LingBot-World v2 checkpoint)")
    index = _json(root / "model_index.json", f"the {PIPELINE_CLASS} component list")
    if index.get("_class_name") != PIPELINE_CLASS:
        raise CheckpointError(f"{root}/model_index.json: _class_name {index.get('_class_name')!r}, "
                              f"expected {PIPELINE_CLASS!r}")
    for name, (lib, cls) in COMPONENTS.items():
        got = index.get(name)
        if not isinstance(got, list) or list(got) != [lib, cls]:
            raise CheckpointError(f"{root}/model_index.json: {name} is {got!r}, expected [{lib!r}, {cls!r}]")
        if not (root / name).is_dir():
            raise CheckpointError(f"{root / name}: missing folder (expected the {cls} component)")
    t = root / "transformer"
    cfg = _json(t / "config.json", "CausalLingBotWorldTransformer3DModel config")
    if cfg.get("_class_name") not in (None, COMPONENTS["transformer"][1]):
        raise CheckpointError(f"{t}/config.json: _class_name {cfg.get('_class_name')!r}, "
                              f"expected {COMPONENTS['transformer'][1]!r}")
    read_config(t)      # every field known, topology as built here
    weight_map(t)       # an index or a single weights file
    te = root / "text_encoder"
    te_cfg = _json(te / "config.json", "UMT5EncoderModel config")
    if te_cfg.get("model_type") != "umt5":
        raise CheckpointError(f"{te}/config.json: model_type {te_cfg.get('model_type')!r}, expected 'umt5'")
    if te_cfg.get("d_model") != cfg.get("text_dim", 4096):
        raise CheckpointError(f"{te}/config.json: d_model {te_cfg.get('d_model')} does not match the "
                              f"transformer's text_dim {cfg.get('text_dim', 4096)}")
    _any_file(te, ("model.safetensors", "model.safetensors.index.json"), "UMT5 weights")
    tok = root / "tokenizer"
    _any_file(tok, ("tokenizer.json", "spiece.model"), "T5TokenizerFast vocabulary")
    vae = root / "vae"
    vae_cfg = _json(vae / "config.json", "AutoencoderKLWan config")
    if vae_cfg.get("_class_name") != "AutoencoderKLWan":
        raise CheckpointError(f"{vae}/config.json: _class_name {vae_cfg.get('_class_name')!r}, "
                              "expected 'AutoencoderKLWan'")
    if vae_cfg.get("z_dim") != cfg.get("out_channels", 16):
        raise CheckpointError(f"{vae}/config.json: z_dim {vae_cfg.get('z_dim')} does not match the "
                              f"transformer's out_channels {cfg.get('out_channels', 16)}")
    _any_file(vae, ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json"),
              "AutoencoderKLWan weights")
    sched = _json(root / "scheduler" / "scheduler_config.json", "UniPCMultistepScheduler config")
    for key, want in SCHEDULER_REQUIRED.items():
        if sched.get(key) != want:
            raise CheckpointError(f"{root / 'scheduler'}/scheduler_config.json: {key} is "
                                  f"{sched.get(key)!r}, expected {want!r}")
    return sched


@dataclass
class Components:
    transformer: CausalLingBotWorldTransformer3DModel
    text_encoder: Any
    tokenizer: Any
    vae: Any
    scheduler: Any
    root: Path


def load_components(root: str | Path, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float32, vae_dtype: torch.dtype = torch.float32,
                    progress: Callable[..., None] | None = None) -> Components:
    """Validate ``root`` and load every component onto ``device``. ``progress(stage, done,
    total)`` (``models.factory.Progress``) hears the transformer's bytes read, shard by shard
    (most of the checkpoint: about 74 of 80 GB for the 14B), then each other component."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler
    from transformers import T5TokenizerFast, UMT5EncoderModel

    root = Path(root)
    validate_checkpoint(root)
    log.info("lingbot: loading %s (transformer, text encoder, tokenizer, vae) to %s", root, device)
    report = progress or (lambda stage, done=None, total=None: None)
    folder = root / "transformer"
    total = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    done = 0

    def on_shard(i: int, n: int, shard: str) -> None:
        nonlocal done
        done += (folder / shard).stat().st_size
        report("reading checkpoint", done, total)

    report("reading checkpoint", 0, total)
    transformer = load_transformer(folder, device, dtype, on_shard=on_shard)
    report("reading text encoder")
    text_encoder = UMT5EncoderModel.from_pretrained(root / "text_encoder", dtype=dtype).to(device).eval()
    tokenizer = T5TokenizerFast.from_pretrained(root / "tokenizer")
    report("reading vae")
    vae = AutoencoderKLWan.from_pretrained(root / "vae", torch_dtype=vae_dtype).to(device).eval()
    scheduler = UniPCMultistepScheduler.from_pretrained(root / "scheduler")
    return Components(transformer, text_encoder, tokenizer, vae, scheduler, root)
