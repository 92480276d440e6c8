"""LingBot-World components with random weights, built directly on the device (benchmarks only).

No checkpoint is read and nothing is staged on the host: the transformer is built on
the ``meta`` device, cast there, materialised once on the target device in its dtype
(``to_empty``) and initialised in place, so the 14B model in bf16 (about 28 GiB) is
ready on an H200 in seconds. The parts that are not on a tick's path are small:

* the text encoder is a 1-layer UMT5 at the transformer's ``text_dim`` (the real
  UMT5-XXL only runs when a session opens or its prompt changes), with the tiny
  checkpoint's tokenizer;
* the Wan VAE is diffusers' ``AutoencoderKLWan`` at its default (Wan 2.1, 127 M
  parameters) config, or the tiny checkpoint's for ``tiny=True``;
* the scheduler is the public checkpoint's config.

Random weights are scaled so activations stay finite through 40 layers; speed does
not depend on the values, and the bench reports whether the frames were finite.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from models.world.lingbot.checkpoint import Components
from models.world.lingbot.config import LingBotTransformerConfig
from models.world.lingbot.tiny_checkpoint import SCHEDULER_CONFIG, TINY_TRANSFORMER, tiny_tokenizer
from models.world.lingbot.transformer import CausalLingBotWorldTransformer3DModel

# The tiny checkpoint's VAE (tiny_checkpoint.write_tiny_checkpoint), for CPU smoke runs.
TINY_VAE = dict(base_dim=8, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
                temperal_downsample=[False, True, True])


@torch.no_grad()
def init_random_(model: nn.Module, seed: int = 0) -> None:
    """Initialise every parameter in place: matrices N(0, 0.5/fan_in), biases 0, norm gains 1,
    the modulation tables N(0, 1/dim) (the module's own init)."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, p in model.named_parameters():
        if p.ndim >= 2 and not name.endswith("modulation"):
            fan_in = math.prod(p.shape[1:])
            p.normal_(0.0, math.sqrt(0.5 / fan_in), generator=gen)
        elif name.endswith("modulation"):
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=gen)
        elif name.endswith("bias"):
            p.zero_()
        else:
            p.fill_(1.0)


def random_transformer(cfg: LingBotTransformerConfig, device: torch.device | str,
                       dtype: torch.dtype, seed: int = 0) -> CausalLingBotWorldTransformer3DModel:
    """The transformer at ``cfg`` with random weights, allocated once, on ``device`` in ``dtype``."""
    with torch.device("meta"):
        model = CausalLingBotWorldTransformer3DModel(cfg)
    model = model.to(dtype).to_empty(device=device)
    init_random_(model, seed)
    return model.eval().requires_grad_(False)


def random_components(device: torch.device | str, *, dtype: torch.dtype, vae_dtype: torch.dtype,
                      tiny: bool = False, seed: int = 0) -> Components:
    """Every component the pipeline needs, random, on ``device`` (``tiny``: the tiny checkpoint's sizes)."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler
    from transformers import UMT5Config, UMT5EncoderModel

    device = torch.device(device)
    cfg = TINY_TRANSFORMER if tiny else LingBotTransformerConfig()
    transformer = random_transformer(cfg, device, dtype, seed)
    tokenizer = tiny_tokenizer()
    torch.manual_seed(seed)
    with torch.device(device):
        text_encoder = UMT5EncoderModel(UMT5Config(
            vocab_size=len(tokenizer), d_model=cfg.text_dim, d_kv=max(4, cfg.text_dim // 64),
            d_ff=4 * 64, num_layers=1, num_heads=2, relative_attention_num_buckets=8))
        vae = AutoencoderKLWan(z_dim=cfg.out_channels, **(TINY_VAE if tiny else {}))
    text_encoder = text_encoder.to(dtype).eval().requires_grad_(False)
    vae = vae.to(vae_dtype).eval().requires_grad_(False)
    scheduler = UniPCMultistepScheduler.from_config(SCHEDULER_CONFIG)
    return Components(transformer, text_encoder, tokenizer, vae, scheduler, Path("random-weights"))


def parameter_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())
