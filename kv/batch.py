"""``KVBatch``: the device-side view of one batch of in-flight chunks.

One *row* per (session, branch). Everything attention needs is packed into one
int32 tensor so that building a batch costs a single host-to-device copy::

    index[r] = [ num_pages | cross_slot | chunk blocks (T) | block table (P, null-padded) ]

``block table`` lists, in page order, the blocks row ``r`` attends to: its held
sink and window pages, then the chunk's own pages (which are also ``chunk
blocks``). Attention backends derive their own plans from it once per batch and
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
    index: torch.Tensor = field(repr=False)
    plans: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def size(self) -> int:
        return len(self.rows)

    @property
    def session_ids(self) -> tuple[str, ...]:
        """Distinct real sessions, in row order."""
        return tuple(dict.fromkeys(sid for sid, _ in self.rows if sid))

    @property
    def lengths(self) -> torch.Tensor:
        """[R] int32: pages each row attends to."""
        return self.index[:, 0]

    @property
    def cross_slots(self) -> torch.Tensor:
        return self.index[:, 1]

    @property
    def chunk_blocks(self) -> torch.Tensor:
        """[R, T] int64: the blocks each row's chunk is written to."""
        t = self.plans.get("chunk_blocks")
        if t is None:
            t = self.plans["chunk_blocks"] = self.index[:, 2:2 + self.chunk_pages].long()
        return t

    @property
    def block_tables(self) -> torch.Tensor:
        """[R, P] int32: attended blocks in page order, padded with the null block."""
        return self.index[:, 2 + self.chunk_pages:]


def pack(rows: list[tuple[str, str]], start_frames: list[int], attend: list[list[int]],
         chunks: list[list[int]], cross_slots: list[int], device: torch.device) -> KVBatch:
    """Build a ``KVBatch``; ``attend[r]`` ends with ``chunks[r]``."""
    width = max(len(a) for a in attend)
    t = len(chunks[0])
    flat = array("i")
    extend = flat.extend
    for a, c, slot in zip(attend, chunks, cross_slots):
        extend((len(a), slot))
        extend(c)
        extend(a)
        if len(a) < width:
            extend([NULL_BLOCK] * (width - len(a)))
    host = torch.frombuffer(flat, dtype=torch.int32).view(len(rows), 2 + t + width)
    if device.type == "cpu":
        index = host.clone()  # own the memory: ``flat`` dies with this frame
    else:
        index = host.to(device)
    return KVBatch(rows=tuple(rows), start_frames=tuple(start_frames),
                   num_pages=tuple(len(a) for a in attend), chunk_pages=t, index=index)
