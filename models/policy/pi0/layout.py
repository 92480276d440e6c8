"""Writing LeRobot's pi0 folder layout: config.json, model.safetensors, tokenizer.json.

The reader is ``build`` (``__init__.py``); this side lets a benchmark or a test make
a folder that the reader takes exactly as it takes ``lerobot/pi0_base``: parameter
names with ``model.``, the PaliGemma head saved in place of the tied embedding
(as LeRobot's files do), the expert's unused vocabulary head included, and a
tokenizer in the ``tokenizers`` JSON format with PaliGemma's special tokens.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Mapping

import torch
from safetensors.torch import save_file

from models.policy.pi0.config import GemmaSpec, Pi0Config, VisionSpec
from models.policy.pi0.model import Pi0Model
from models.policy.pi0.weights import EMBED_KEY, EXPERT_HEAD_KEY, PREFIX, TIED_HEAD_KEY, WEIGHTS_FILE

# PaliGemma's ids for its special tokens.
SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>")


def lerobot_config(cfg: Pi0Config, *, native: bool = True) -> dict[str, Any]:
    """``cfg`` as LeRobot's config.json (with the ``pi0_native`` sizes when ``native``)."""
    h, w = cfg.image_resolution
    raw: dict[str, Any] = {
        "type": "pi0",
        "n_obs_steps": 1,
        "input_features": {
            **{f: {"type": "VISUAL", "shape": [3, h, w]} for f in cfg.image_features},
            **({cfg.state_feature: {"type": "STATE", "shape": [cfg.state_dim]}} if cfg.state_feature else {}),
        },
        "output_features": {"action": {"type": "ACTION", "shape": [cfg.action_dim]}},
        "device": "cuda",
        "paligemma_variant": "gemma_2b",
        "action_expert_variant": "gemma_300m",
        "dtype": "float32",
        "chunk_size": cfg.chunk_size,
        "n_action_steps": cfg.chunk_size,
        "max_state_dim": cfg.max_state_dim,
        "max_action_dim": cfg.max_action_dim,
        "num_inference_steps": cfg.num_inference_steps,
        "min_period": cfg.min_period,
        "max_period": cfg.max_period,
        "image_resolution": [h, w],
        "empty_cameras": 0,
        "tokenizer_max_length": cfg.tokenizer_max_length,
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": cfg.state_norm, "ACTION": cfg.action_norm},
    }
    if native:
        raw["pi0_native"] = {
            "paligemma": _spec(cfg.vlm), "action_expert": _spec(cfg.expert),
            "vision": _spec(cfg.vision), "vocab_size": cfg.vocab_size,
        }
    return raw


def _spec(spec: GemmaSpec | VisionSpec) -> dict[str, int]:
    return {k: int(v) for k, v in vars(spec).items()}


def lerobot_state_dict(model: Pi0Model, *, expert_head: bool = True) -> dict[str, torch.Tensor]:
    """The tensors as LeRobot's model.safetensors holds them."""
    out = {PREFIX + k: v.detach().contiguous() for k, v in model.state_dict().items()}
    out[TIED_HEAD_KEY] = out.pop(EMBED_KEY)
    if expert_head:
        cfg = model.cfg
        gen = torch.Generator().manual_seed(1)
        out[EXPERT_HEAD_KEY] = torch.randn(cfg.vocab_size, cfg.expert.width, generator=gen).to(out[TIED_HEAD_KEY].dtype)
    return out


def write_tokenizer(folder: str, corpus: Iterable[str], vocab_size: int) -> None:
    """A small BPE tokenizer with PaliGemma's special-token ids and ``<bos>`` prepended."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=["\n"])
    tok.train_from_iterator(list(corpus), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>",
                   "pad_token": "<pad>", "unk_token": "<unk>", "padding_side": "right"}, f, indent=2)


def write_checkpoint(folder: str, model: Pi0Model, *, config: Mapping[str, Any] | None = None,
                     expert_head: bool = True) -> None:
    """``model`` as config.json + model.safetensors in ``folder``."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(dict(config) if config is not None else lerobot_config(model.cfg), f, indent=2)
    save_file(lerobot_state_dict(model, expert_head=expert_head), os.path.join(folder, WEIGHTS_FILE))
