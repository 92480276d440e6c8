"""How one block of the LingBot transformer attends through ``kv/``.

A block (``num_frames_per_block`` latent frames of every batch row) is one kv
chunk. Its self-attention sees, without any mask, the row's held pages (the
sink and the rolling window, see ``config``) and the block's own keys: the
reference's chunk-causal attention, where the causal boundary is between blocks.

Two kinds of forward share this:

* **transient** (``update_cache=False``): the denoising steps. The block's K/V
  are concatenated to the held pages in a gathered copy; nothing in the pool,
  the scratch pages or the cross slots is written.
* **committing** (``update_cache=True``): the clean pass after the last step.
  The block's K/V go into the chunk's scratch pages (``kv.paged_attention``), and
  the caller's ``commit_batch`` keeps them and rolls the window.

Cross-attention reads the session's text K/V from its cross slot, projected once
per prompt (``LingBotTransformer.project_text`` then ``write_text``).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from kv import KVBatch, PagedKVCache
from kv.paged_attention import paged_attention


class BlockKV:
    """The kv view one forward of one block uses: a cache and a begun batch."""

    def __init__(self, cache: PagedKVCache, batch: KVBatch) -> None:
        self.cache = cache
        self.batch = batch

    @property
    def start_frames(self) -> tuple[int, ...]:
        """Absolute latent frame index of each row's block (RoPE time positions)."""
        return self.batch.start_frames

    @property
    def rows(self) -> int:
        return self.batch.size

    def self_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       update_cache: bool) -> torch.Tensor:
        """q/k/v ``[R, L, H, D]`` of the block -> ``[R, L, H, D]`` over held pages + block."""
        if update_cache:
            # The pool may hold a narrower dtype than the model computes in (bf16 KV).
            dt = self.cache.geometry.dtype
            return paged_attention(q.to(dt), k.to(dt), v.to(dt), self.cache, layer,
                                   self.batch).to(q.dtype)
        return self._transient(layer, q, k, v)

    def _transient(self, layer: int, q: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor) -> torch.Tensor:
        # Held pages are the first num_pages - chunk_pages of each row's table; the
        # chunk's own pages are skipped (they are unwritten scratch), the block's
        # K/V come from the forward instead. Rows are grouped by held-page count.
        batch, storage = self.batch, self.cache.storage
        k_pool, v_pool = storage.k[layer], storage.v[layer]
        T = batch.chunk_pages
        tables = batch.block_tables
        out = torch.empty_like(q)
        groups: dict[int, list[int]] = {}
        for r, n in enumerate(batch.num_pages):
            groups.setdefault(n - T, []).append(r)
        for held, rows in groups.items():
            idx = torch.tensor(rows, dtype=torch.long, device=q.device)
            qg, kg, vg = q.index_select(0, idx), k.index_select(0, idx), v.index_select(0, idx)
            if held:
                blocks = tables.index_select(0, idx)[:, :held].reshape(-1).long()
                g, bs = len(rows), k_pool.shape[1]
                kh = k_pool.index_select(0, blocks).view(g, held * bs, *k_pool.shape[2:])
                vh = v_pool.index_select(0, blocks).view(g, held * bs, *v_pool.shape[2:])
                kg = torch.cat([kh.to(kg.dtype), kg], 1)
                vg = torch.cat([vh.to(vg.dtype), vg], 1)
            o = F.scaled_dot_product_attention(qg.transpose(1, 2), kg.transpose(1, 2),
                                               vg.transpose(1, 2)).transpose(1, 2)
            out.index_copy_(0, idx, o)
        return out

    def cross_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Text K/V of each row ``[R, text tokens, H, D]``."""
        return self.cache.cross_kv(layer, self.batch)


def write_text(cache: PagedKVCache, session_id: str, text_kv: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Store one session's projected text K/V (``[tokens, H, D]`` per layer) in its cross slot."""
    for layer, (k, v) in enumerate(text_kv):
        cache.write_cross(session_id, layer, k, v)
