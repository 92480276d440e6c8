"""``forward_frame``'s attention through kv/'s paged cache (the eager serving path).

A generated frame is ``steps`` denoising passes plus one clean pass, each attending
the row's held pages (sink + window) plus the frame's own page: every pass writes
the frame's K/V into its page and calls ``kv.paged_attention``, which gathers the
held pages again. Gathering them once per frame instead (one buffer per layer kept
across the passes) was measured on CPU and gained nothing: the per-pass gather
leaves the keys hot in cache right before attention reads them, the kept buffers
(19 MB a session) are cold by the next pass (bench/results/maze_cpu_ab_shared.json,
variant ``gather_once=0``, at the commit that had it).
"""

from __future__ import annotations

from typing import Any

import torch

from kv import PagedKVCache
from kv.paged_attention import paged_attention
from models.world.maze.model import FrameContext


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
