"""``KVBatch``: the device-side view of one batch of in-flight chunks.

One *row* per (session, branch). Everything attention needs is packed into one
int32 tensor so that building a batch costs a single host-to-device copy::

    index = [ num_pages (R) | cross_slot (R) | block tables (R x P, null-padded) ]

Row ``r`` of the block tables lists, in page order, the blocks the row attends
to: its held sink and window pages, then the chunk's own ``T`` pages (so the
chunk's blocks are ``tables[r, num_pages[r] - T : num_pages[r]]``). Attention backends derive their own plans from it once per batch and
keep them in ``plans`` (every layer reuses them: all layers share block ids).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

import torch

from kv.block_pool import NULL_BLOCK


@dataclass(frozen=True, eq=False)
class KVBatch:
    rows: tuple[tuple[str, str], ...]   # (session_id, branch); ("", "") for pad rows
    start_frames: tuple[int, ...]       # first frame of each row's chunk
    num_pages: tuple[int, ...]          # pages each row attends to (held + chunk)
    chunk_pages: int                    # pages each row's chunk writes
    session_ids: tuple[str, ...]        # distinct real sessions, in row order
    index: torch.Tensor = field(repr=False)
    plans: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def size(self) -> int:
        return len(self.rows)

    @property
    def lengths(self) -> torch.Tensor:
        """[R] int32: pages each row attends to."""
        return self.index[:self.size]

    @property
    def cross_slots(self) -> torch.Tensor:
        """[R] int32: each row's cross-attention slot."""
        return self.index[self.size:2 * self.size]

    @property
    def block_tables(self) -> torch.Tensor:
        """[R, P] int32: attended blocks in page order (chunk last), null-padded."""
        R = self.size
        return self.index[2 * R:].view(R, -1)

    @property
    def chunk_blocks(self) -> torch.Tensor:
        """[R, T] int64: the blocks each row's chunk is written to."""
        t = self.plans.get("chunk_blocks")
        if t is None:
            # The chunk is the last T attended pages of each row.
            T = self.chunk_pages
            cols = (self.lengths.long() - T)[:, None] + torch.arange(T, device=self.index.device)
            t = self.plans["chunk_blocks"] = self.block_tables.long().gather(1, cols)
        return t


def pack(names: list[tuple[str, str]], starts: list[int], lengths: list[int], slots: list[int],
         tables: array, width: int, chunk_pages: int, session_ids: tuple[str, ...],
         device: torch.device) -> KVBatch:
    """Assemble a ``KVBatch`` from per-row lists and the row-major ``tables`` array."""
    flat = array("i", lengths)
    flat.extend(slots)
    flat.extend(tables)
    host = torch.frombuffer(flat, dtype=torch.int32)
    if device.type == "cpu":
        index = host.clone()  # own the memory: ``flat`` dies with this frame
    else:
        index = host.to(device)
    assert index.numel() == len(names) * (2 + width)
    return KVBatch(rows=tuple(names), start_frames=tuple(starts), num_pages=tuple(lengths),
                   chunk_pages=chunk_pages, session_ids=session_ids, index=index)
