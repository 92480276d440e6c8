"""Per-session KV bookkeeping: one block table per branch plus cross-attention slots.

A ``SessionKV`` holds ids only (blocks, cross slots); ``cache.PagedKVCache`` owns
the tensors and the pools and is the only one that mutates these objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from kv.block_table import BlockTable


@dataclass(frozen=True)
class ChunkSlots:
    """Where one session's in-flight chunk goes: the answer of ``begin_chunk``.

    ``blocks[branch]`` are the fresh blocks, in page order, that the chunk's
    ``frames`` frames are written to; ``start_frame`` is the chunk's first
    absolute frame index (for positional encodings).
    """

    session_id: str
    start_frame: int
    frames: int
    blocks: dict[str, tuple[int, ...]]


class SessionKV:
    __slots__ = ("session_id", "branches", "tables", "cross_slots", "cross_layers", "in_flight")

    def __init__(self, session_id: str, branches: tuple[str, ...], tables: dict[str, BlockTable],
                 cross_slots: dict[str, int]) -> None:
        self.session_id = session_id
        self.branches = branches
        self.tables = tables
        # Slot index per branch in the cross-attention tensors; -1 while swapped out.
        self.cross_slots = cross_slots
        # Layers whose cross-attention K/V were written, per branch.
        self.cross_layers: dict[str, set[int]] = {b: set() for b in branches}
        self.in_flight = False

    @property
    def num_frames(self) -> int:
        """Committed frames (all branches advance together)."""
        return self.tables[self.branches[0]].num_frames

    def held_blocks(self) -> list[int]:
        """Committed blocks of every branch, branch by branch in page order."""
        out: list[int] = []
        for b in self.branches:
            out.extend(self.tables[b].held)
        return out

    def num_held_blocks(self) -> int:
        return sum(len(self.tables[b].held) for b in self.branches)
