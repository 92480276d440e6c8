"""Classifier-free guidance split over two ranks: each rank runs one CFG branch of every row.

The other way to put two GPUs on one guided model (vLLM-Omni runs DreamZero so): no
all-to-all inside the network; each rank's forward is a whole forward of half the rows
(its branch of each session), and one all-gather per denoising pass gives every rank both
branches' outputs, from which each takes the same guided step::

                 rank 0 (branch 0, conditional)      rank 1 (branch 1, negative)
    forward:     rows [s0 cond, s1 cond, ...]        rows [s0 neg, s1 neg, ...]
    all_gather:  (out_cond, out_neg)                 (out_cond, out_neg)
    guidance:    out_neg + scale * (out_cond - out_neg), on both

Each rank's kv/ pool holds its branch's K/V only, every head: a session's bytes per rank
are half of one process's (``KVGeometry.branches`` of one).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from models.world.parallel.ulysses import _collective, smallest

BRANCHES = 2


class CfgSplit:
    """One rank's view of a two-rank CFG split (the default process group, or ``group``):
    this rank computes branch ``rank``."""

    def __init__(self, rank: int, size: int, group: dist.ProcessGroup | None = None) -> None:
        if size != BRANCHES:
            raise ValueError(f"a CFG split runs its {BRANCHES} branches on {BRANCHES} ranks, "
                             f"the group has {size}")
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is not in a group of {size}")
        self.rank, self.size, self.group = rank, size, group

    @classmethod
    def from_default_group(cls) -> "CfgSplit":
        """The process's group (``ValueError`` unless it has exactly two ranks)."""
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError(f"a CFG split needs a group of {BRANCHES} ranks (--sequence-parallel {BRANCHES})")
        return cls(dist.get_rank(), dist.get_world_size())

    @property
    def branch(self) -> int:
        """The CFG branch this rank computes (0: conditional, 1: negative)."""
        return self.rank

    def smallest(self, value: int, device: torch.device | str = "cpu") -> int:
        """The smallest of both ranks' ``value``."""
        return smallest(value, device, self.group)

    def both(self, *tensors: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
        """Every rank's ``tensors`` (same shapes and dtype on every rank), branch by branch:
        ``[(branch 0's), (branch 1's)]``; one all-gather for all of them."""
        flat = torch.cat([t.reshape(-1) for t in tensors])
        parts = [torch.empty_like(flat) for _ in range(self.size)]
        _collective(dist.all_gather, parts, flat.contiguous(), group=self.group)
        sizes = [t.numel() for t in tensors]
        return [tuple(p.view_as(t) for p, t in zip(part.split(sizes), tensors)) for part in parts]
