"""``KVBatch``: the device-side view of one batch of in-flight chunks.

One *row* per (session, branch). Everything attention needs is packed into one
int32 tensor so that building a batch costs a single host-to-device copy::

    index = [ num_pages (R) | cross_slot (R) | block tables (R x P, null-padded) ]

Row ``r`` of the block tables lists, in page order, the blocks the row attends
to: its held sink and window pages, then the chunk's own ``T`` pages (so the
chunk's blocks are ``tables[r, num_pages[r] - T : num_pages[r]]``). Attention
backends derive their own plans from it once per batch and keep them in
``plans`` (every layer reuses them: all layers share block ids).

The per-row Python views (``rows``, ``start_frames``, ``num_pages``) are built
on first use from the host copy of the index: the tick's hot path never needs
them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

import numpy as np
import torch

from kv.block_pool import NULL_BLOCK

PAD_ROW = ("", "")


@dataclass(frozen=True, eq=False)
class KVBatch:
    session_ids: tuple[str, ...]        # distinct real sessions, in row order
    size: int                           # rows, pad rows included
    chunk_pages: int                    # pages each row's chunk writes
    index: torch.Tensor = field(repr=False)
    host_index: np.ndarray = field(repr=False)      # ``index`` on the host (int32)
    real_starts: np.ndarray = field(repr=False)     # first frame of each real row's chunk
    # (session_id, branch) of each real row, computed when ``rows`` is first read.
    row_names: Callable[[], tuple[tuple[str, str], ...]] = field(repr=False)
    plans: dict[str, Any] = field(default_factory=dict, repr=False)

    @cached_property
    def rows(self) -> tuple[tuple[str, str], ...]:
        """(session_id, branch) of each row; ``("", "")`` for pad rows."""
        names = self.row_names()
        return names + (PAD_ROW,) * (self.size - len(names))

    @cached_property
    def start_frames(self) -> tuple[int, ...]:
        """First frame of each row's chunk (0 for pad rows)."""
        return tuple(self.real_starts.tolist()) + (0,) * (self.size - len(self.real_starts))

    @cached_property
    def num_pages(self) -> tuple[int, ...]:
        """Pages each row attends to (held + chunk)."""
        return tuple(self.host_index[:self.size].tolist())

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


class IndexBuilder:
    """Fills ``KVBatch.index`` arrays for one cache.

    Every row is ``width = max_held_pages + chunk_pages`` wide, the most a row
    can attend (sink + window + chunk): stable shapes keep compiled attention
    kernels from recompiling. Pad rows (``pad_to``) write to and attend only
    the pad block, with a valid cross slot.
    """

    def __init__(self, max_held_pages: int, pad_block: int, pad_cross_slot: int) -> None:
        self.max_held_pages = max_held_pages
        self.pad_block = pad_block
        self.pad_cross_slot = pad_cross_slot

    def _new(self, rows: int, chunk_pages: int, pad_to: int | None) -> tuple[np.ndarray, int, int]:
        P = max(rows, pad_to or 0)
        W = self.max_held_pages + chunk_pages
        index = np.empty(P * (2 + W), dtype=np.int32)
        if P > rows:
            index[rows:P] = chunk_pages
            index[P + rows:2 * P] = self.pad_cross_slot
            pad = index[2 * P + rows * W:].reshape(P - rows, W)
            pad[:, :chunk_pages] = self.pad_block
            pad[:, chunk_pages:] = NULL_BLOCK
        return index, P, W

    def gather(self, pages: np.ndarray, rows: np.ndarray, lengths: np.ndarray, cross: np.ndarray,
               chunk_pages: int, pad_to: int | None) -> np.ndarray:
        """The index of table ``rows`` of ``pages`` (rows null-padded past ``lengths``)."""
        R = len(rows)
        index, P, W = self._new(R, chunk_pages, pad_to)
        index[:R] = lengths
        index[P:P + R] = cross
        out = index[2 * P:2 * P + R * W].reshape(R, W)
        if pages.shape[1] == W:
            np.take(pages, rows, axis=0, out=out, mode="clip")  # "clip": no buffered copy
        else:
            out[:] = pages[rows, :W]
        return index

    def assemble(self, attend: list[list[int]], cross: list[int], chunk_pages: int,
                 pad_to: int | None) -> np.ndarray:
        """The index of rows given as lists: each row's attended blocks and cross slot."""
        R = len(attend)
        index, P, W = self._new(R, chunk_pages, pad_to)
        tables = index[2 * P:2 * P + R * W].reshape(R, W)
        tables[:] = NULL_BLOCK
        for i, blocks in enumerate(attend):
            index[i] = len(blocks)
            index[P + i] = cross[i]
            tables[i, :len(blocks)] = blocks
        return index


def pack(host_index: np.ndarray, size: int, starts: np.ndarray,
         row_names: Callable[[], tuple[tuple[str, str], ...]], chunk_pages: int,
         session_ids: tuple[str, ...], device: torch.device) -> KVBatch:
    """Wrap a filled host index as a ``KVBatch`` of ``size`` rows on ``device``.

    ``starts`` are the real rows' first frames; ``row_names`` gives their names.
    """
    host = torch.from_numpy(host_index)  # shares the memory: host_index is this batch's own
    index = host if device.type == "cpu" else host.to(device)
    return KVBatch(session_ids=session_ids, size=size, chunk_pages=chunk_pages, index=index,
                   host_index=host_index, real_starts=starts, row_names=row_names)
