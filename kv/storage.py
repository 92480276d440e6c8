"""The pool tensors, allocated once, and the copies in and out of them.

Per layer: one K and one V tensor ``[num_blocks, block_size, kv_heads, head_dim]``
(block 0 is the null block, kept at zero) and, when the geometry has cross
attention, one K and one V tensor ``[num_cross_slots, cross_tokens, kv_heads,
head_dim]``. Every layer uses the same block ids, so one block table serves all
layers.

Host copies (swap) are one tensor per session ``[num_layers, 2, n, ...]``; on
CUDA it comes from PyTorch's pinned caching host allocator, so after the first
swap of a given size no new pinning happens (that allocator rounds sizes up to
a power of two; the residency budget counts the logical bytes).
"""

from __future__ import annotations

import torch

from kv.geometry import KVGeometry

# Above this many separate runs of consecutive block ids a swap gathers the
# blocks into one device staging tensor and does one copy per layer instead of
# one copy per run: copy-launch overhead (~5-10 us each) beats an extra pass
# over device memory only for a handful of long runs.
_MAX_DIRECT_RUNS = 4


def _runs(ids: list[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of consecutive ids as (first id, offset in ``ids``, length)."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            runs.append((ids[start], start, i - start))
            start = i
    return runs


class KVStorage:
    """Device tensors of a paged KV cache. Shapes only; no bookkeeping."""

    def __init__(self, geometry: KVGeometry, num_blocks: int, num_cross_slots: int,
                 device: torch.device | str) -> None:
        g = geometry
        self.geometry = g
        self.device = torch.device(device)
        shape = (num_blocks, g.block_size, g.kv_heads, g.head_dim)
        # zeros, not empty: the null block must read as zeros, and a fresh pool
        # must not leak another process's memory into a debugging dump.
        self.k = [torch.zeros(shape, dtype=g.dtype, device=self.device) for _ in range(g.num_layers)]
        self.v = [torch.zeros(shape, dtype=g.dtype, device=self.device) for _ in range(g.num_layers)]
        if g.cross_tokens:
            cshape = (num_cross_slots, g.cross_tokens, g.kv_heads, g.head_dim)
            self.cross_k = [torch.zeros(cshape, dtype=g.dtype, device=self.device)
                            for _ in range(g.num_layers)]
            self.cross_v = [torch.zeros(cshape, dtype=g.dtype, device=self.device)
                            for _ in range(g.num_layers)]
        else:
            self.cross_k = []
            self.cross_v = []

    @property
    def pin(self) -> bool:
        return self.device.type == "cuda"

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v + self.cross_k + self.cross_v)

    # -- swap ------------------------------------------------------------------

    def copy_out(self, tensors: list[list[torch.Tensor]], ids: list[int]) -> torch.Tensor:
        """Copy rows ``ids`` of every layer's K and V to one new host tensor.

        ``tensors`` is ``[self.k, self.v]`` or ``[self.cross_k, self.cross_v]``.
        Returns ``[num_layers, 2, len(ids), ...]`` on the host (pinned on CUDA).
        """
        first = tensors[0][0]
        shape = (len(tensors[0]), 2, len(ids), *first.shape[1:])
        host = torch.empty(shape, dtype=first.dtype, pin_memory=self.pin)
        if not ids:
            return host
        if self.device.type == "cpu":
            idx = torch.tensor(ids, dtype=torch.long)
            for layer in range(shape[0]):
                for kv in range(2):
                    torch.index_select(tensors[kv][layer], 0, idx, out=host[layer, kv])
            return host
        runs = _runs(ids)
        idx = None if len(runs) <= _MAX_DIRECT_RUNS else torch.tensor(ids, device=self.device)
        for layer in range(shape[0]):
            for kv in range(2):
                src = tensors[kv][layer]
                dst = host[layer, kv]
                if idx is None:
                    for first_id, off, n in runs:
                        dst[off:off + n].copy_(src[first_id:first_id + n], non_blocking=True)
                else:
                    dst.copy_(src.index_select(0, idx), non_blocking=True)
        return host

    def copy_in(self, tensors: list[list[torch.Tensor]], ids: list[int], host: torch.Tensor) -> None:
        """Inverse of ``copy_out``: write ``host[:, :, j]`` to row ``ids[j]`` of every layer."""
        if not ids:
            return
        if self.device.type == "cpu":
            idx = torch.tensor(ids, dtype=torch.long)
            for layer in range(host.shape[0]):
                for kv in range(2):
                    tensors[kv][layer].index_copy_(0, idx, host[layer, kv])
            return
        runs = _runs(ids)
        idx = None if len(runs) <= _MAX_DIRECT_RUNS else torch.tensor(ids, device=self.device)
        for layer in range(host.shape[0]):
            for kv in range(2):
                dst = tensors[kv][layer]
                src = host[layer, kv]
                if idx is None:
                    for first_id, off, n in runs:
                        dst[first_id:first_id + n].copy_(src[off:off + n], non_blocking=True)
                else:
                    staged = src.to(self.device, non_blocking=True)
                    dst.index_copy_(0, idx, staged)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
