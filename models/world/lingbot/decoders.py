"""The block decoder: the Wan VAE (default) or a TAEHV decoder (``decoder=taehv:PATH``).

Both are streaming decoders with one contract (``models/world/wan_vae.py``'s
``StreamingWanDecoder``, ``models/world/taehv.py``'s ``TAEHVDecoder``): a per-session
state counted as kv model state, ``frames`` / ``decode`` of a block's latents, frames
in [-1, 1], 9 frames for a session's first block and 12 after. They differ in what
they take: the Wan VAE the latents de-normalised with its ``latents_mean`` /
``latents_std``, TAEHV the diffusion latents as they are. ``BlockDecoder.prepare``
turns the pipeline's latents (float32, one row) into the decoder's input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from models.world.lingbot.vae_io import latent_stats
from models.world.wan_vae import StreamingWanDecoder


@dataclass(frozen=True)
class BlockDecoder:
    name: str                                          # "wan" or "taehv"
    streaming: Any                                     # StreamingWanDecoder's API
    prepare: Callable[[torch.Tensor], torch.Tensor]    # latents [1, z, F, h, w] -> decoder input


def wan_decoder(vae: Any) -> BlockDecoder:
    """The checkpoint's Wan VAE, decoding latents de-normalised per channel."""
    dtype = next(vae.parameters()).dtype

    def prepare(x: torch.Tensor) -> torch.Tensor:
        mean, std = latent_stats(vae, x)
        return (x * std + mean).to(dtype)

    return BlockDecoder("wan", StreamingWanDecoder(vae), prepare)


def taehv_decoder(path: str, device: torch.device | str) -> BlockDecoder:
    """A TAEHV decoder from the ``taew2_1`` state dict at ``path`` (``ValueError`` naming the
    path and the first tensor that breaks the layout), decoding latents as they are; in
    float16 on CUDA (the file's and the reference's dtype), float32 elsewhere."""
    from models.world.taehv import load_taehv

    dtype = torch.float16 if torch.device(device).type == "cuda" else torch.float32
    dec = load_taehv(path, device=device, dtype=dtype)
    return BlockDecoder("taehv", dec, lambda x: x.to(dtype))
