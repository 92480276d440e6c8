"""``PagedKVCache``: the adapter-facing paged KV cache of one model.

It owns the pool tensors (``storage.KVStorage``), the block allocator
(``block_pool.BlockPool``), the cross-attention slots and one ``SessionKV`` per
open session. The engine thread is its only caller.

A tick, for a batch of sessions::

    batch = cache.begin_batch(session_ids)      # None: no room, nothing changed
    for layer in range(num_layers):
        ...                                     # q, k, v of the chunk: [R, tokens, heads, dim]
        out = paged_attention(q, k, v, cache, layer, batch)   # writes k, v, then attends
    cache.commit_batch(batch)                   # or cache.abort_batch(batch) on failure

Rows of a batch are (session, branch) pairs, every branch of every session in
order. Shortage (no free blocks or session slots) is a return value; misuse
(unknown session, a second chunk in flight) raises.
"""

from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from kv import batch as batch_mod
from kv import paged_attention
from kv.batch import KVBatch
from kv import retention
from kv.block_pool import NULL_BLOCK, BlockPool
from kv.block_table import BlockTable
from kv.capacity import CapacityPlan
from kv.geometry import KVGeometry
from kv.session_kv import ChunkSlots, SessionKV
from kv.storage import KVStorage

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class HostKV:
    """A swapped-out session's KV on the host: ``swap_out`` makes it, ``swap_in`` consumes it."""

    session_id: str
    blocks: torch.Tensor               # [layers, 2, n, block_size, heads, dim]
    block_ids: tuple[int, ...]         # device ids the rows came from (the tables still name them)
    cross: torch.Tensor | None         # [layers, 2, branches, cross_tokens, heads, dim]
    nbytes: int


class PagedKVCache:
    def __init__(self, geometry: KVGeometry, num_blocks: int, device: torch.device | str = "cpu",
                 *, max_sessions: int, worker_blocks: int = 0,
                 attention_backend: str = "auto") -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        g = geometry
        self.geometry = g
        self.device = torch.device(device)
        self.max_sessions = max_sessions
        n_cross = max_sessions * g.num_branches if g.cross_tokens else 0
        self.storage = KVStorage(g, num_blocks, n_cross, self.device)
        self.pool = BlockPool(num_blocks)
        # Block 1: the write target of pad rows (a batch padded to a fixed size
        # writes its dummy rows here and nobody reads it back as real data).
        self.pad_block = self.pool.allocate(1)[0]
        reserved = self.pool.allocate(worker_blocks)
        if reserved is None:
            raise ValueError(f"{worker_blocks} worker blocks do not fit in {num_blocks} blocks")
        # A worker-local slot: blocks the model may use for K/V it computes but
        # never keeps (e.g. shared by CFG branches), outside session accounting.
        self.worker_blocks = tuple(reserved)
        self._cross_free = list(range(n_cross - 1, -1, -1))  # a stack; slot 0 first
        self._sessions: dict[str, SessionKV] = {}
        self._swapped: set[str] = set()
        self.attention = paged_attention.AttentionDispatch(attention_backend)
        # Most pages a session holds per branch between ticks.
        self.max_held_pages = g.pages_per_frame * retention.max_retained_frames(
            g.sink_frames, g.window_frames, g.chunk_frames)

    @classmethod
    def from_plan(cls, geometry: KVGeometry, plan: CapacityPlan, device: torch.device | str,
                  **kwargs) -> "PagedKVCache":
        return cls(geometry, plan.num_blocks, device, max_sessions=plan.capacity,
                   worker_blocks=plan.worker_blocks, **kwargs)

    # -- sessions --------------------------------------------------------------

    def open(self, session_id: str, branches: Sequence[str] | None = None) -> bool:
        """Start tracking a session (resident, empty). False when all session slots are taken."""
        if session_id in self._sessions:
            raise ValueError(f"session {session_id!r} is already open")
        g = self.geometry
        branches = tuple(branches) if branches is not None else g.branches
        if not branches or len(set(branches)) != len(branches):
            raise ValueError(f"bad branches {branches}")
        if len(branches) > g.num_branches:
            raise ValueError(f"{len(branches)} branches but the geometry declares {g.num_branches}")
        if self.num_resident >= self.max_sessions:
            return False
        slots = {b: (self._cross_free.pop() if g.cross_tokens else -1) for b in branches}
        tables = {b: BlockTable(g.sink_frames, g.window_frames, g.chunk_frames, g.pages_per_frame)
                  for b in branches}
        self._sessions[session_id] = SessionKV(session_id, branches, tables, slots)
        log.debug("kv open session=%s branches=%s", session_id, branches)
        return True

    def close(self, session_id: str) -> None:
        """Free everything the session holds (a swapped session holds nothing here)."""
        s = self._sessions.pop(session_id)
        if session_id in self._swapped:
            self._swapped.discard(session_id)
            return
        self._release_blocks(s)
        if self.geometry.cross_tokens:
            self._cross_free.extend(s.cross_slots[b] for b in s.branches)
        log.debug("kv close session=%s", session_id)

    def reset(self, session_id: str, keep_cross: bool = False) -> None:
        """Drop all self-attention KV (and the in-flight chunk); keep cross caches if asked."""
        s = self._resident(session_id)
        self._release_blocks(s)
        if not keep_cross:
            for b in s.branches:
                s.cross_layers[b] = set()
        log.debug("kv reset session=%s keep_cross=%s", session_id, keep_cross)

    def _release_blocks(self, s: SessionKV) -> None:
        blocks: list[int] = []
        for b in s.branches:
            blocks.extend(s.tables[b].clear())
        self.pool.free(blocks)
        s.in_flight = False

    def _resident(self, session_id: str) -> SessionKV:
        s = self._sessions[session_id]
        if session_id in self._swapped:
            raise RuntimeError(f"session {session_id!r} is swapped out; make it resident first")
        return s

    # -- the in-flight chunk -----------------------------------------------------

    def _frames(self, frames: int | None) -> int:
        g = self.geometry
        frames = g.frames_per_tick if frames is None else frames
        if frames < 1 or frames % g.chunk_frames:
            raise ValueError(f"a chunk is whole retention chunks of {g.chunk_frames}, got {frames}")
        return frames

    def begin_chunk(self, session_id: str, frames: int | None = None) -> ChunkSlots | None:
        """Allocate scratch blocks for the session's next chunk; None if they do not fit."""
        frames = self._frames(frames)
        s = self._resident(session_id)
        if s.in_flight:
            raise RuntimeError(f"session {session_id!r} already has a chunk in flight")
        per_branch = frames * self.geometry.pages_per_frame
        blocks = self.pool.allocate(per_branch * len(s.branches))
        if blocks is None:
            return None
        start = s.num_frames
        out = {}
        for i, b in enumerate(s.branches):
            mine = blocks[i * per_branch:(i + 1) * per_branch]
            s.tables[b].begin(mine, frames)
            out[b] = tuple(mine)
        s.in_flight = True
        return ChunkSlots(session_id, start, frames, out)

    def begin_batch(self, session_ids: Sequence[str], frames: int | None = None,
                    pad_to: int | None = None) -> KVBatch | None:
        """``begin_chunk`` for every session, all or nothing, then ``batch``."""
        frames = self._frames(frames)
        per_branch = frames * self.geometry.pages_per_frame
        sessions = self._sessions
        swapped = self._swapped
        batch = []
        rows = 0
        for sid in session_ids:
            s = sessions[sid]
            if sid in swapped:
                raise RuntimeError(f"session {sid!r} is swapped out; make it resident first")
            if s.in_flight:
                raise RuntimeError(f"session {sid!r} already has a chunk in flight")
            batch.append(s)
            rows += len(s.branches)
        if len(set(session_ids)) != len(batch):
            raise ValueError("a session appears twice in one batch")
        blocks = self.pool.allocate(rows * per_branch)
        if blocks is None:
            return None
        i = 0
        rows = []
        for s in batch:
            # BlockTable.begin, inlined (hot): not in flight was checked above.
            for b, t in s.tables.items():
                t.pending = blocks[i:i + per_branch]
                t.pending_frames = frames
                i += per_branch
                rows.append((s, b, t))
            s.in_flight = True
        return self._pack(rows, pad_to, tuple(session_ids))

    def batch(self, items: Iterable[str | tuple[str, str]], pad_to: int | None = None) -> KVBatch:
        """A ``KVBatch`` over sessions whose chunks are in flight.

        An item is a session id (all its branches, in order) or (session id, branch).
        ``pad_to`` appends dummy rows that write to and attend only the pad block.
        """
        rows: list[tuple[SessionKV, str, BlockTable]] = []
        for item in items:
            sid, branch = (item, None) if isinstance(item, str) else item
            s = self._resident(sid)
            if not s.in_flight:
                raise RuntimeError(f"session {sid!r} has no chunk in flight")
            rows.extend((s, b, s.tables[b]) for b in (s.branches if branch is None else (branch,)))
        return self._pack(rows, pad_to, tuple(dict.fromkeys(s.session_id for s, _, _ in rows)))

    def _pack(self, rows: list[tuple[SessionKV, str, BlockTable]], pad_to: int | None,
              session_ids: tuple[str, ...]) -> KVBatch:
        if not rows:
            raise ValueError("a batch needs at least one row")
        T = len(rows[0][2].pending)
        # Fixed width: the most a row can attend (sink + window + chunk). Stable
        # shapes keep compiled attention kernels from recompiling.
        width = self.max_held_pages + T
        names, starts, lengths, slots = [], [], [], []
        tables = array("i")
        extend = tables.extend
        null_row = array("i", [NULL_BLOCK] * width)
        for s, b, t in rows:
            held = t.held
            pending = t.pending
            if len(pending) != T:
                raise ValueError("every row of a batch must write the same number of pages")
            n = len(held) + T
            names.append((s.session_id, b))
            starts.append(t.num_frames)
            lengths.append(n)
            slots.append(s.cross_slots[b])
            extend(held)
            extend(pending)
            if n < width:
                extend(null_row[n:])
        pad_rows = (pad_to or 0) - len(rows)
        if pad_rows > 0:
            pad = array("i", [self.pad_block] * T) + null_row[T:]
            for _ in range(pad_rows):
                names.append(("", ""))
                starts.append(0)
                lengths.append(T)
                slots.append(0 if self.geometry.cross_tokens else -1)
                extend(pad)
        return batch_mod.pack(names, starts, lengths, slots, tables, width, T, session_ids,
                              self.device)

    def _commit(self, s: SessionKV) -> list[int]:
        if not s.in_flight:
            raise RuntimeError(f"session {s.session_id!r} has no chunk in flight")
        released: list[int] = []
        for b in s.branches:
            released += s.tables[b].commit()
        s.in_flight = False
        return released

    def commit_chunk(self, session_id: str) -> None:
        """Keep the chunk's blocks and release frames that left the window."""
        released = self._commit(self._resident(session_id))
        if released:
            self.pool.free(released)

    def abort_chunk(self, session_id: str) -> None:
        """Free the chunk's blocks; the committed state is untouched."""
        s = self._resident(session_id)
        if not s.in_flight:
            return
        blocks: list[int] = []
        for b in s.branches:
            blocks += s.tables[b].abort()
        self.pool.free(blocks)
        s.in_flight = False

    def commit_batch(self, batch: KVBatch) -> None:
        """``commit_chunk`` for every session of the batch, with one pass over the pool."""
        released: list[int] = []
        sessions = self._sessions
        swapped = self._swapped
        for sid in batch.session_ids:
            s = sessions[sid]
            if sid in swapped or not s.in_flight:
                raise RuntimeError(f"session {sid!r} has no resident chunk in flight")
            for t in s.tables.values():  # _commit, inlined (hot)
                released += t.commit()
            s.in_flight = False
        if released:
            self.pool.free(released)

    def abort_batch(self, batch: KVBatch) -> None:
        for sid in batch.session_ids:
            if sid in self._sessions and sid not in self._swapped:
                self.abort_chunk(sid)

    # -- tensors -------------------------------------------------------------------

    def write(self, layer: int, target: KVBatch | ChunkSlots, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """Write the chunk's K and V of one layer: ``[rows, chunk tokens, kv_heads, head_dim]``."""
        g = self.geometry
        if isinstance(target, ChunkSlots):
            idx = torch.tensor([blk for b in target.blocks for blk in target.blocks[b]],
                               dtype=torch.long, device=self.device)
        else:
            idx = target.chunk_blocks.reshape(-1)
        shape = (idx.numel(), g.block_size, g.kv_heads, g.head_dim)
        self.storage.k[layer].index_copy_(0, idx, k.reshape(shape))
        self.storage.v[layer].index_copy_(0, idx, v.reshape(shape))

    def attend(self, q: torch.Tensor, layer: int, batch: KVBatch, *, scale: float | None = None,
               backend: str | None = None) -> torch.Tensor:
        """Each row's queries ``[R, Lq, Hq, D]`` over its held pages plus its chunk."""
        return self.attention(q, self.storage.k[layer], self.storage.v[layer], batch,
                              scale=scale, backend=backend)

    def write_cross(self, session_id: str, layer: int, k: torch.Tensor, v: torch.Tensor,
                    branch: str | None = None) -> None:
        """Populate one layer of a branch's cross-attention cache ``[cross_tokens, heads, dim]``."""
        if not self.geometry.cross_tokens:
            raise RuntimeError("this geometry has no cross-attention cache")
        s = self._resident(session_id)
        branch = s.branches[0] if branch is None else branch
        slot = s.cross_slots[branch]
        self.storage.cross_k[layer][slot].copy_(k)
        self.storage.cross_v[layer][slot].copy_(v)
        s.cross_layers[branch].add(layer)

    def has_cross(self, session_id: str, branch: str | None = None) -> bool:
        s = self._sessions[session_id]
        branch = s.branches[0] if branch is None else branch
        return len(s.cross_layers[branch]) == self.geometry.num_layers

    def cross_kv(self, layer: int, batch: KVBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention K and V of each row: ``[R, cross_tokens, heads, dim]``."""
        slots = batch.plans.get("cross_slots")
        if slots is None:
            slots = batch.plans["cross_slots"] = batch.cross_slots.long()
        return (self.storage.cross_k[layer].index_select(0, slots),
                self.storage.cross_v[layer].index_select(0, slots))

    # -- swap (mechanics only; ``residency.Residency`` decides when) -----------------

    def swap_bytes(self, session_id: str) -> int:
        """Host bytes ``swap_out`` would take for this session."""
        s = self._sessions[session_id]
        g = self.geometry
        cross = len(s.branches) * g.cross_bytes_per_branch
        return s.num_held_blocks() * g.num_layers * 2 * g.block_bytes + cross

    def swap_out(self, session_id: str) -> HostKV:
        """Copy the session's held blocks and cross caches to the host and free them here."""
        s = self._resident(session_id)
        if s.in_flight:
            raise RuntimeError(f"session {session_id!r} has a chunk in flight")
        ids = s.held_blocks()
        st = self.storage
        blocks = st.copy_out([st.k, st.v], ids)
        cross = None
        if self.geometry.cross_tokens:
            slots = [s.cross_slots[b] for b in s.branches]
            cross = st.copy_out([st.cross_k, st.cross_v], slots)
            self._cross_free.extend(slots)
            s.cross_slots = {b: -1 for b in s.branches}
        st.synchronize()
        self.pool.free(ids)
        self._swapped.add(session_id)
        nbytes = blocks.numel() * blocks.element_size()
        if cross is not None:
            nbytes += cross.numel() * cross.element_size()
        return HostKV(session_id, blocks, tuple(ids), cross, nbytes)

    def swap_in(self, host: HostKV) -> bool:
        """Bring a swapped session back, bit-exact, into fresh blocks; False if it does not fit."""
        sid = host.session_id
        s = self._sessions[sid]
        if sid not in self._swapped:
            raise RuntimeError(f"session {sid!r} is not swapped out")
        g = self.geometry
        if self.num_resident >= self.max_sessions:
            return False
        ids = self.pool.allocate(len(host.block_ids))
        if ids is None:
            return False
        st = self.storage
        st.copy_in([st.k, st.v], ids, host.blocks)
        if g.cross_tokens:
            slots = [self._cross_free.pop() for _ in s.branches]
            st.copy_in([st.cross_k, st.cross_v], slots, host.cross)
            s.cross_slots = dict(zip(s.branches, slots))
        st.synchronize()
        mapping = dict(zip(host.block_ids, ids))
        for b in s.branches:
            s.tables[b].remap(mapping)
        self._swapped.discard(sid)
        return True

    # -- reading -----------------------------------------------------------------

    def session(self, session_id: str) -> SessionKV:
        return self._sessions[session_id]

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def is_resident(self, session_id: str) -> bool:
        return session_id in self._sessions and session_id not in self._swapped

    def in_flight(self, session_id: str) -> bool:
        return self._sessions[session_id].in_flight

    def committed_frames(self, session_id: str) -> int:
        return self._sessions[session_id].num_frames

    def table(self, session_id: str, branch: str | None = None) -> BlockTable:
        s = self._sessions[session_id]
        return s.tables[s.branches[0] if branch is None else branch]

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_resident(self) -> int:
        return len(self._sessions) - len(self._swapped)

    @property
    def session_ids(self) -> list[str]:
        return list(self._sessions)

    def blocks_for_tick(self, session_ids: Iterable[str], frames: int | None = None) -> int:
        """Blocks ``begin_batch`` would allocate for those of these sessions not in flight."""
        per_branch = self._frames(frames) * self.geometry.pages_per_frame
        sessions = self._sessions
        n = 0
        for sid in session_ids:
            s = sessions[sid]
            if not s.in_flight:
                n += len(s.branches)
        return n * per_branch
