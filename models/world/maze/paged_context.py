"""``forward_frame``'s attention through kv/'s paged cache: the eager serving contexts.

A generated frame is ``steps`` denoising passes plus one clean pass, each attending
the row's held pages (sink + window) plus the frame's own page. ``PagedContext``
writes the frame's K/V into its page and calls ``kv.paged_attention`` at every
layer of every pass, which gathers the held pages again each time.
``GatheredContext`` (CPU) gathers them once per frame instead: the held pages
cannot change while one frame is made, only the own page does::

    per layer, one buffer [R, P, block, H, D]   (P = held pages + 1, rows in kv's page order)

      page:   0      1   ...   P-2    P-1
      holds:  sink   w1  ...   wN     own     <- gathered once: every page
                                      ^ each pass copies its own K/V here
                                        (and into kv's page, which the commit keeps)

The keys are kv's own in kv's order, so attention sees exactly what
``paged_attention`` would gather (tests assert equal frames).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kv import PagedKVCache
from kv.paged_attention import paged_attention
from models.world.maze.model import FrameContext

# The gathered buffers of one frame (all layers, K and V) stay below this; a larger
# batch gathers per pass (PagedContext) rather than hold hundreds of MB.
GATHER_BYTES_MAX = 256 << 20


class PagedContext(FrameContext):
    """``forward_frame``'s attention through kv/: write the frame's K/V into its page, attend."""

    def __init__(self, cache: PagedKVCache, batch: Any) -> None:
        self.cache, self.batch = cache, batch
        self.own = [None] * cache.geometry.num_layers  # type: ignore[list-item]

    def keep(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.cache.write(layer, self.batch, k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # model: [B, H, n, hd]; kv: [R, n, H, hd]
        o = paged_attention(q.transpose(1, 2), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(),
                            self.cache, layer, self.batch)
        return o.transpose(1, 2)


class GatheredContext(PagedContext):
    """``PagedContext`` with the held pages gathered once per frame (see the module doc).

    Build it with ``gathered_or_paged``: rows must all attend the same number of pages
    (the steady state; sessions still filling their window differ) and the buffers must
    fit ``GATHER_BYTES_MAX``.
    """

    def __init__(self, cache: PagedKVCache, batch: Any, pages: int) -> None:
        super().__init__(cache, batch)
        st = cache.storage
        R = batch.size
        idx = batch.block_tables[:, :pages].reshape(-1).long()
        _, bs, H, D = st.k[0].shape
        self.pages = pages
        # index_select makes one contiguous copy: [R * P, bs, H, D] viewed as [R, P, bs, H, D]
        self.kbuf = [kp.index_select(0, idx).view(R, pages, bs, H, D) for kp in st.k]
        self.vbuf = [vp.index_select(0, idx).view(R, pages, bs, H, D) for vp in st.v]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        R, H, n, D = k.shape
        kt, vt = k.transpose(1, 2), v.transpose(1, 2)                      # [R, n, H, D]
        kb, vb = self.kbuf[layer], self.vbuf[layer]
        kb[:, -1].copy_(kt)
        vb[:, -1].copy_(vt)
        self.cache.write(layer, self.batch, kb[:, -1], vb[:, -1])        # the page the commit keeps
        keys = kb.view(R, self.pages * n, H, D).transpose(1, 2)
        vals = vb.view(R, self.pages * n, H, D).transpose(1, 2)
        return F.scaled_dot_product_attention(q, keys, vals)


def gathered_or_paged(cache: PagedKVCache, batch: Any) -> PagedContext:
    """A ``GatheredContext`` where it applies (CPU, one page count, small enough), else ``PagedContext``."""
    if cache.device.type != "cpu":
        return PagedContext(cache, batch)
    counts = set(batch.num_pages)
    g = cache.geometry
    if len(counts) != 1 or g.block_size != g.tokens_per_frame:
        return PagedContext(cache, batch)
    pages = counts.pop()
    page_bytes = g.block_size * g.kv_heads * g.head_dim * cache.storage.k[0].element_size()
    if 2 * g.num_layers * batch.size * pages * page_bytes > GATHER_BYTES_MAX:
        return PagedContext(cache, batch)
    return GatheredContext(cache, batch, pages)
