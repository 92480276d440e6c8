"""The LingBot model's kv/ geometry: what it declares and a cache built from it.

One kv *frame* is one latent frame (``tokens_per_frame`` patches, 1560 at 480x832),
one *tick* is one block of ``num_frames_per_block`` frames, and retention's span
(``span_frames``) is one block too: frames leave the window a whole block at a time.
Between blocks a session holds the sink (its first ``sink_size`` frames) and the
``rolling_frames`` most recent ones; a block attends to those and itself,
``sliding_window_num_frames`` in all (see ``config``)::

    after 7 blocks (n = 21), sink 9, rolling 6, block 3:
    frame:  0 .. 8 | 9 .. 14 | 15 .. 20 | 21 22 23
            [sink] | released| [rolling]| [block in flight]

The cross slot holds the session's text K/V: ``text_tokens`` per layer (512, the
UMT5 sequence length the pipeline pads prompts to).
"""

from __future__ import annotations

import torch

from kv import KVGeometry, PagedKVCache
from kv.capacity import pool_blocks
from models.world.lingbot.config import LingBotTransformerConfig

TEXT_TOKENS = 512


def kv_geometry(cfg: LingBotTransformerConfig, latent_height: int, latent_width: int,
                text_tokens: int = TEXT_TOKENS, dtype: torch.dtype = torch.bfloat16,
                block_size: int | None = None, model_state_bytes: int = 0) -> KVGeometry:
    """The geometry kv/ plans and stores for this model at one latent resolution;
    ``model_state_bytes``: the per-session Wan VAE decode state (capacity counts it)."""
    tokens = cfg.tokens_per_frame(latent_height, latent_width)
    return KVGeometry(num_layers=cfg.num_layers, kv_heads=cfg.num_attention_heads,
                      head_dim=cfg.attention_head_dim, tokens_per_frame=tokens,
                      block_size=block_size or tokens, sink_frames=cfg.sink_size,
                      window_frames=cfg.rolling_frames, frames_per_tick=cfg.num_frames_per_block,
                      span_frames=cfg.num_frames_per_block, dtype=dtype, cross_tokens=text_tokens,
                      model_state_bytes=model_state_bytes)


def make_cache(geometry: KVGeometry, sessions: int, device: torch.device | str = "cpu",
               attention_backend: str | None = None) -> PagedKVCache:
    """A pool sized for ``sessions`` resident sessions, one block in flight each."""
    device = torch.device(device)
    backend = attention_backend or ("auto" if device.type == "cuda" else "gather_sdpa")
    return PagedKVCache(geometry, pool_blocks(geometry, sessions, ticks_in_flight=sessions), device,
                        max_sessions=sessions, attention_backend=backend)
