"""Per-session KV bookkeeping: which table rows and cross slots a session owns, and its state.

Every open session has a *slot*; branch ``j`` of the session in slot ``s`` is
row ``s * stride + j`` of the cache's ``BlockTables`` (``stride`` is the
geometry's branch count). What a tick reads for every session of a batch lives
in arrays indexed by slot or row, so a batch is resolved once (``resolve``:
ids -> slots and rows, memoised per id tuple) and then handled with vectorised
operations. ``SessionKV`` is one session seen as an object. ``cache.PagedKVCache``
owns the tensors and the pool and is the only one that changes any of this.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property
from typing import Sequence

import numpy as np

from kv.block_table import BlockTable, BlockTables


class SlotState(IntEnum):
    """A slot's state. Transitions (checked by the cache)::

        FREE -open-> IDLE -begin-> IN_FLIGHT -commit/abort-> IDLE
        IDLE -swap_out-> SWAPPED -swap_in-> IDLE        any -close-> FREE

    ``IDLE`` is 0, so "every session of the batch is resident and idle" is
    ``not state[slots].any()``.
    """

    IDLE = 0
    IN_FLIGHT = 1
    SWAPPED = 2
    FREE = 3


# As plain ints: numpy compares and stores an IntEnum member slowly (hot paths).
_IDLE, _IN_FLIGHT, _SWAPPED, _FREE = (int(s) for s in SlotState)

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
    """One open session: its slot, its branches' rows and cross slots (views of the arrays)."""

    __slots__ = ("session_id", "branches", "slot", "rows", "cross_layers", "_registry")

    def __init__(self, session_id: str, branches: tuple[str, ...], slot: int,
                 registry: "SessionRegistry") -> None:
        self.session_id = session_id
        self.branches = branches
        self.slot = slot
        self.rows = tuple(slot * registry.stride + j for j in range(len(branches)))
        # Layers whose cross-attention K/V were written, per branch.
        self.cross_layers: dict[str, set[int]] = {b: set() for b in branches}
        self._registry = registry

    @property
    def state(self) -> SlotState:
        return SlotState(self._registry.state.item(self.slot))

    @property
    def in_flight(self) -> bool:
        return self._registry.state.item(self.slot) == _IN_FLIGHT

    @property
    def tables(self) -> dict[str, BlockTable]:
        t = self._registry.tables
        return {b: BlockTable.view(t, r) for b, r in zip(self.branches, self.rows)}

    @property
    def cross_slots(self) -> dict[str, int]:
        """Slot index per branch in the cross-attention tensors; -1 while swapped out."""
        cross = self._registry.cross
        return {b: int(cross[r]) for b, r in zip(self.branches, self.rows)}

    @property
    def num_frames(self) -> int:
        """Committed frames (all branches advance together)."""
        return int(self._registry.tables.frames[self.rows[0]])

    def held_blocks(self) -> list[int]:
        """Committed blocks of every branch, branch by branch in page order."""
        t = self._registry.tables
        out: list[int] = []
        for r in self.rows:
            out.extend(t.stored(r))
        return out

    def num_held_blocks(self) -> int:
        return int(self._registry.tables.held[list(self.rows)].sum())


@dataclass(frozen=True, eq=False)
class BatchRows:
    """A batch's sessions resolved to slots and table rows (read-only arrays)."""

    session_ids: tuple[str, ...]
    slots: np.ndarray            # [S] session slots, batch order
    rows: np.ndarray             # [R] table rows: every branch of every session, in order
    distinct: bool               # no session id appears twice
    by_slot: list["SessionKV | None"]  # the registry's slot list when resolved (never mutated)

    @cached_property
    def names(self) -> tuple[tuple[str, str], ...]:
        """(session id, branch) of each row."""
        by_slot = self.by_slot
        return tuple((sid, b) for sid, slot in zip(self.session_ids, self.slots.tolist())
                     for b in by_slot[slot].branches)


class SessionRegistry:
    """Open sessions by id and by slot, with per-slot state and per-row cross slots in arrays.

    ``tables`` is the cache's ``BlockTables``; the registry grows it with its slots.
    """

    # Distinct batches remembered by ``resolve``: the engine forms few per tick
    # (a residency check and a begin for the same ids, new and old sessions apart).
    MEMO_SIZE = 32

    def __init__(self, stride: int, capacity: int, tables: BlockTables) -> None:
        self.stride = stride
        self.tables = tables
        self.state = np.full(capacity, _FREE, dtype=np.int8)
        self.cross = np.full(capacity * stride, -1, dtype=np.int32)
        self.num_branches = np.zeros(capacity, dtype=np.int64)
        self._by_id: dict[str, SessionKV] = {}
        # slot -> session. Replaced, never mutated, on open and close: a BatchRows
        # keeps the list it was resolved against, so its row names stay right.
        self._by_slot: list[SessionKV | None] = [None] * capacity
        self._free_slots = list(range(capacity - 1, -1, -1))  # a stack; slot 0 first
        self._memo: dict[tuple[str, ...], BatchRows] = {}
        tables.grow(capacity * stride)

    @property
    def capacity(self) -> int:
        return len(self.state)

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._by_id

    def __getitem__(self, session_id: str) -> SessionKV:
        return self._by_id[session_id]

    def ids(self) -> list[str]:
        """Open session ids, in opening order."""
        return list(self._by_id)

    def at(self, slot: int) -> SessionKV:
        s = self._by_slot[slot]
        assert s is not None, slot
        return s

    def add(self, session_id: str, branches: tuple[str, ...]) -> SessionKV:
        if not self._free_slots:
            self._grow(2 * self.capacity)
        slot = self._free_slots.pop()
        s = SessionKV(session_id, branches, slot, self)
        self._by_id[session_id] = s
        by_slot = list(self._by_slot)
        by_slot[slot] = s
        self._by_slot = by_slot
        self.state[slot] = _IDLE
        self.num_branches[slot] = len(branches)
        self._memo.clear()
        return s

    def remove(self, session_id: str) -> SessionKV:
        s = self._by_id.pop(session_id)
        by_slot = list(self._by_slot)
        by_slot[s.slot] = None
        self._by_slot = by_slot
        self.state[s.slot] = _FREE
        self.num_branches[s.slot] = 0
        self.cross[list(s.rows)] = -1
        self._free_slots.append(s.slot)
        self._memo.clear()
        return s

    def _grow(self, capacity: int) -> None:
        extra = capacity - self.capacity
        self.state = np.concatenate([self.state, np.full(extra, _FREE, np.int8)])
        self.cross = np.concatenate([self.cross, np.full(extra * self.stride, -1, np.int32)])
        self.num_branches = np.concatenate([self.num_branches, np.zeros(extra, np.int64)])
        self._by_slot = self._by_slot + [None] * extra
        # Lowest new slot on top of the stack.
        self._free_slots = list(range(capacity - 1, capacity - extra - 1, -1)) + self._free_slots
        self.tables.grow(capacity * self.stride)

    def resolve(self, session_ids: Sequence[str]) -> BatchRows:
        """Slots and rows of these sessions (KeyError for an id that is not open)."""
        key = session_ids if type(session_ids) is tuple else tuple(session_ids)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        by_id = self._by_id
        slots = np.array([by_id[sid].slot for sid in key], dtype=np.int64)
        G = self.stride
        if G == 1:
            rows = slots
        else:
            branch = np.arange(G)
            rows = (slots[:, None] * G + branch)[branch < self.num_branches[slots][:, None]]
        slots.flags.writeable = False
        rows.flags.writeable = False
        out = BatchRows(key, slots, rows, len(set(key)) == len(key), self._by_slot)
        if len(self._memo) >= self.MEMO_SIZE:
            self._memo.clear()
        self._memo[key] = out
        return out
