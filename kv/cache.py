"""``PagedKVCache``: the adapter-facing paged KV cache of one model.

It owns the pool tensors (``storage.KVStorage``), the block allocator
(``block_pool.BlockPool``), the block tables of every session branch
(``block_table.BlockTables``), the cross-attention slots and the open sessions
(``session_kv.SessionRegistry``). The engine thread is its only caller.

A tick, for a batch of sessions::

    batch = cache.begin_batch(session_ids)      # None: no room, nothing changed
    for layer in range(num_layers):
        ...                                     # q, k, v of the chunk: [R, tokens, heads, dim]
        out = paged_attention(q, k, v, cache, layer, batch)   # writes k, v, then attends
    cache.commit_batch(batch)                   # or cache.abort_batch(batch) on failure

Rows of a batch are (session, branch) pairs, every branch of every session in
order. Shortage (no free blocks or session slots) is a return value; misuse
(unknown session, a second chunk in flight) raises.

Two paths, one state. ``begin_batch`` and ``commit_batch``/``commit_chunks``
resolve the batch once (ids -> slots and table rows, memoised) and, when every
session is in the expected state, allocate, fill the tables, build the index,
commit and prune the window as a handful of numpy operations over all rows
(``BlockTables.begin_rows``/``commit_rows``); the per-tick Python cost no longer
grows with the session count. Anything else (single-session calls, a batch that
is about to raise, ``fast_path=False``) takes the per-row path, which does the
same transitions one row at a time; tests run both on random sequences and
compare every index, table and free queue.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch

from kv import batch as batch_mod
from kv import paged_attention
from kv.batch import KVBatch
from kv.block_pool import BlockPool
from kv.block_table import BlockTable, BlockTables
from kv.capacity import CapacityPlan
from kv.geometry import KVGeometry
from kv.session_kv import BatchRows, ChunkSlots, SessionKV, SessionRegistry, SlotState
from kv.storage import KVStorage

_HOST = torch.device("cpu")  # where ``begin_batch(upload=False)`` leaves a batch's index

log = logging.getLogger(__name__)

# Plain ints for the hot comparisons and writes: numpy converts an IntEnum slowly.
IDLE, IN_FLIGHT, SWAPPED = (int(s) for s in (SlotState.IDLE, SlotState.IN_FLIGHT, SlotState.SWAPPED))


@dataclass(frozen=True, eq=False)
class HostKV:
    """A swapped-out session's KV on the host: ``swap_out`` makes it, ``swap_in`` consumes it."""

    session_id: str
    blocks: torch.Tensor               # [layers, 2, n, block_size, heads, dim]
    block_ids: tuple[int, ...]         # device ids the rows came from
    cross: torch.Tensor | None         # [layers, 2, branches, cross_tokens, heads, dim]
    nbytes: int


class PagedKVCache:
    def __init__(self, geometry: KVGeometry, num_blocks: int, device: torch.device | str = "cpu",
                 *, max_sessions: int, worker_blocks: int = 0,
                 attention_backend: str = "auto", fast_path: bool = True) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        g = geometry
        self.geometry = g
        self.device = torch.device(device)
        self.max_sessions = max_sessions
        # False: every batch takes the per-row path (tests compare the two).
        self.fast_path = fast_path
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
        self.tables = BlockTables(g.sink_frames, g.window_frames, g.span_frames,
                                  g.pages_per_frame, chunk_pages=g.pages_per_tick)
        self.sessions = SessionRegistry(g.num_branches, max_sessions, self.tables)
        self._num_swapped = 0
        # Sessions whose in-flight chunk restarts their sequence: per table row, the stored
        # pages, committed frames and window start it replaces (freed at commit, put back
        # at abort).
        self._restarts: dict[str, list[tuple[int, list[int], int, int]]] = {}
        self.attention = paged_attention.AttentionDispatch(attention_backend)
        # Most pages a session holds per branch between ticks.
        self.max_held_pages = self.tables.max_held
        self._index = batch_mod.IndexBuilder(self.max_held_pages, self.pad_block,
                                             0 if g.cross_tokens else -1)

    @classmethod
    def from_plan(cls, geometry: KVGeometry, plan: CapacityPlan, device: torch.device | str,
                  **kwargs) -> "PagedKVCache":
        return cls(geometry, plan.num_blocks, device, max_sessions=plan.capacity,
                   worker_blocks=plan.worker_blocks, **kwargs)

    # -- sessions --------------------------------------------------------------

    def open(self, session_id: str, branches: Sequence[str] | None = None) -> bool:
        """Start tracking a session (resident, empty). False when all session slots are taken."""
        if session_id in self.sessions:
            raise ValueError(f"session {session_id!r} is already open")
        g = self.geometry
        branches = tuple(branches) if branches is not None else g.branches
        if not branches or len(set(branches)) != len(branches):
            raise ValueError(f"bad branches {branches}")
        if len(branches) > g.num_branches:
            raise ValueError(f"{len(branches)} branches but the geometry declares {g.num_branches}")
        if self.num_resident >= self.max_sessions:
            return False
        s = self.sessions.add(session_id, branches)
        if g.cross_tokens:
            self.sessions.cross[list(s.rows)] = [self._cross_free.pop() for _ in branches]
        log.debug("kv open session=%s branches=%s", session_id, branches)
        return True

    def close(self, session_id: str) -> None:
        """Free everything the session holds (a swapped session holds nothing here)."""
        s = self.sessions[session_id]
        if self.sessions.state.item(s.slot) == SWAPPED:
            for r in s.rows:  # the rows name blocks given back at swap-out
                self.tables.clear(r)
            self._num_swapped -= 1
        else:
            self._free_blocks(s)
            if self.geometry.cross_tokens:
                self._cross_free.extend(s.cross_slots.values())
        self.sessions.remove(session_id)
        log.debug("kv close session=%s", session_id)

    def reset(self, session_id: str, keep_cross: bool = False) -> None:
        """Drop all self-attention KV (and the in-flight chunk); keep cross caches if asked."""
        s = self._resident(session_id)
        self._free_blocks(s)
        if not keep_cross:
            for b in s.branches:
                s.cross_layers[b] = set()
        log.debug("kv reset session=%s keep_cross=%s", session_id, keep_cross)

    def _free_blocks(self, s: SessionKV) -> None:
        blocks: list[int] = []
        for r in s.rows:
            blocks.extend(self.tables.clear(r))
        for _, old, _, _ in self._restarts.pop(s.session_id, ()):
            blocks.extend(old)
        self.pool.free_held(blocks)
        self.sessions.state[s.slot] = IDLE

    def _resident(self, session_id: str) -> SessionKV:
        s = self.sessions[session_id]
        if self.sessions.state.item(s.slot) == SWAPPED:
            raise RuntimeError(f"session {session_id!r} is swapped out; make it resident first")
        return s

    # -- the in-flight chunk -----------------------------------------------------

    def _frames(self, frames: int | None) -> int:
        g = self.geometry
        frames = g.frames_per_tick if frames is None else frames
        if frames < 1 or frames % g.span_frames:
            raise ValueError(f"a chunk is whole retention spans of {g.span_frames} frames, got {frames}")
        return frames

    def begin_chunk(self, session_id: str, frames: int | None = None, *,
                    restart: bool = False) -> ChunkSlots | None:
        """Allocate scratch blocks for the session's next chunk; None if they do not fit.

        ``restart``: the chunk starts the session's sequence again at frame 0 (see
        ``begin_batch``)."""
        frames = self._frames(frames)
        s = self._resident(session_id)
        if s.in_flight:
            raise RuntimeError(f"session {session_id!r} already has a chunk in flight")
        T = frames * self.geometry.pages_per_frame
        blocks = self.pool.allocate(T * len(s.rows))
        if blocks is None:
            return None
        if restart:
            self._detach(s)
        start = s.num_frames
        out = {}
        for i, (b, r) in enumerate(zip(s.branches, s.rows)):
            mine = blocks[i * T:(i + 1) * T]
            self.tables.begin(r, mine, frames)
            out[b] = tuple(mine)
        self.sessions.state[s.slot] = IN_FLIGHT
        return ChunkSlots(session_id, start, frames, out)

    def begin_batch(self, session_ids: Sequence[str], frames: int | None = None,
                    pad_to: int | None = None, upload: bool = True, *,
                    restart: bool = False) -> KVBatch | None:
        """``begin_chunk`` for every session, all or nothing, then ``batch``.

        ``upload=False`` leaves ``KVBatch.index`` on the host: for a caller that copies
        ``host_index`` to the device itself, with its other inputs in one copy.

        ``restart=True``: each chunk starts its session's sequence again (a model whose
        window starts over, DreamZero every few chunks). Its rows attend to the chunk
        alone and it becomes frames ``[0, frames)``; the pages the session held stay
        allocated until ``commit`` frees them, and ``abort`` puts them back, so a
        restart that is not committed leaves the session as it was::

            before   [ held: frames 0..n-1 ]
            begin    [ chunk ]                  held pages set aside, still allocated
            commit   [ chunk = frames 0.. ]     set-aside pages freed
            abort    [ held: frames 0..n-1 ]    chunk freed, set-aside pages back
        """
        frames = self._frames(frames)
        T = frames * self.geometry.pages_per_frame
        plan = self.resolve(session_ids)
        if (restart or not self.fast_path or not plan.distinct
                or self.sessions.state[plan.slots].any()):
            return self._begin_batch_per_row(plan, frames, pad_to, upload, restart)
        blocks = self.pool.allocate_array(len(plan.rows) * T)
        if blocks is None:
            return None
        lengths = self.tables.begin_rows(plan.rows, blocks, T)
        self.sessions.state[plan.slots] = IN_FLIGHT
        return self._pack_rows(plan, lengths, T, pad_to, upload)

    def _begin_batch_per_row(self, plan: BatchRows, frames: int, pad_to: int | None,
                             upload: bool = True, restart: bool = False) -> KVBatch | None:
        sessions = [self.sessions[sid] for sid in plan.session_ids]
        for s in sessions:
            if s.state == SWAPPED:
                raise RuntimeError(f"session {s.session_id!r} is swapped out; make it resident first")
            if s.in_flight:
                raise RuntimeError(f"session {s.session_id!r} already has a chunk in flight")
        if not plan.distinct:
            raise ValueError("a session appears twice in one batch")
        T = frames * self.geometry.pages_per_frame
        rows = [r for s in sessions for r in s.rows]
        blocks = self.pool.allocate(len(rows) * T)
        if blocks is None:
            return None
        if restart:
            for s in sessions:
                self._detach(s)
        for i, r in enumerate(rows):
            self.tables.begin(r, blocks[i * T:(i + 1) * T], frames)
        for s in sessions:
            self.sessions.state[s.slot] = IN_FLIGHT
        return self._pack([(s, b, r) for s in sessions for b, r in zip(s.branches, s.rows)],
                          pad_to, plan.session_ids, upload)

    def _detach(self, s: SessionKV) -> None:
        """Set the session's stored pages aside for a restarting chunk (``begin_batch``)."""
        self._restarts[s.session_id] = [(r, *self.tables.detach(r)) for r in s.rows]

    def _end_restart(self, session_ids: Sequence[str], committed: bool) -> list[int]:
        """A restart's set-aside pages: returned to be freed (commit) or put back (abort)."""
        freed: list[int] = []
        for sid in session_ids:
            for r, blocks, frames, window_start in self._restarts.pop(sid, ()):
                if committed:
                    freed += blocks
                else:
                    self.tables.reattach(r, blocks, frames, window_start)
        return freed

    def restarting(self, session_id: str) -> bool:
        """Whether the session's in-flight chunk restarts its sequence."""
        return session_id in self._restarts

    def resolve(self, session_ids: Sequence[str]) -> BatchRows:
        """The batch's slots and table rows (memoised); KeyError for an id that is not open."""
        if not session_ids:
            raise ValueError("a batch needs at least one row")
        return self.sessions.resolve(session_ids)

    def batch(self, items: Iterable[str | tuple[str, str]], pad_to: int | None = None) -> KVBatch:
        """A ``KVBatch`` over sessions whose chunks are in flight.

        An item is a session id (all its branches, in order) or (session id, branch).
        ``pad_to`` appends dummy rows that write to and attend only the pad block.
        """
        rows: list[tuple[SessionKV, str, int]] = []
        for item in items:
            sid, branch = (item, None) if isinstance(item, str) else item
            s = self._resident(sid)
            if not s.in_flight:
                raise RuntimeError(f"session {sid!r} has no chunk in flight")
            if branch is not None and branch not in s.branches:
                raise KeyError(f"session {sid!r} has no branch {branch!r}")
            rows.extend((s, b, r) for b, r in zip(s.branches, s.rows) if branch in (None, b))
        return self._pack(rows, pad_to, tuple(dict.fromkeys(s.session_id for s, _, _ in rows)))

    def _pack_rows(self, plan: BatchRows, lengths: np.ndarray, T: int,
                   pad_to: int | None, upload: bool = True) -> KVBatch:
        """A batch of ``plan``'s rows, gathered straight from the table arrays."""
        rows = plan.rows
        index = self._index.gather(self.tables.pages, rows, lengths, self.sessions.cross[rows], T,
                                   pad_to)
        return batch_mod.pack(index, max(len(rows), pad_to or 0), self.tables.frames[rows],
                              lambda: plan.names, T, plan.session_ids, self.device if upload else _HOST)

    def _pack(self, rows: list[tuple[SessionKV, str, int]], pad_to: int | None,
              session_ids: tuple[str, ...], upload: bool = True) -> KVBatch:
        """A batch built row by row from the block tables."""
        if not rows:
            raise ValueError("a batch needs at least one row")
        t = self.tables
        T = t.pending.item(rows[0][2])
        if any(t.pending.item(r) != T for _, _, r in rows):
            raise ValueError("every row of a batch must write the same number of pages")
        attend = [BlockTable.view(t, r).attend_blocks() for _, _, r in rows]
        cross = [self.sessions.cross.item(r) for _, _, r in rows]
        index = self._index.assemble(attend, cross, T, pad_to)
        starts = np.array([t.frames.item(r) for _, _, r in rows], dtype=np.int64)
        names = tuple((s.session_id, b) for s, b, _ in rows)
        return batch_mod.pack(index, max(len(rows), pad_to or 0), starts, lambda: names, T,
                              session_ids, self.device if upload else _HOST)

    def commit_chunk(self, session_id: str) -> None:
        """Keep the chunk's blocks and release frames that left the window."""
        s = self._resident(session_id)
        if not s.in_flight:
            raise RuntimeError(f"session {s.session_id!r} has no chunk in flight")
        freed: list[int] = []
        for r in s.rows:
            freed += self.tables.commit(r)
        if self._restarts:
            freed += self._end_restart((session_id,), committed=True)
        self.sessions.state[s.slot] = IDLE
        self.pool.free_held(freed)

    def abort_chunk(self, session_id: str) -> None:
        """Free the chunk's blocks; the committed state is untouched."""
        s = self._resident(session_id)
        if not s.in_flight:
            return
        blocks: list[int] = []
        for r in s.rows:
            blocks += self.tables.abort(r)
        if self._restarts:
            self._end_restart((session_id,), committed=False)
        self.sessions.state[s.slot] = IDLE
        self.pool.free_held(blocks)

    def commit_batch(self, batch: KVBatch) -> None:
        """``commit_chunk`` for every session of the batch, with one pass over the pool."""
        self.commit_chunks(batch.session_ids)

    def commit_chunks(self, session_ids: Sequence[str]) -> None:
        """``commit_chunk`` for each of these (distinct, in-flight) sessions, all at once.

        Blocks that leave the window go back to the pool row by row, in page order.
        Raises before changing anything if a session is unknown, repeated, swapped
        out or has no chunk in flight.
        """
        if not session_ids:
            return
        plan = self.resolve(session_ids)
        state = self.sessions.state
        if not self.fast_path or not plan.distinct or (state[plan.slots] != IN_FLIGHT).any():
            self._commit_per_row(plan)
            return
        freed = self.tables.commit_rows(plan.rows)
        state[plan.slots] = IDLE
        self.pool.free_held(freed)
        if self._restarts:
            self.pool.free_held(self._end_restart(plan.session_ids, committed=True))

    def _commit_per_row(self, plan: BatchRows) -> None:
        sessions = [self.sessions[sid] for sid in plan.session_ids]
        for s in sessions:
            if not s.in_flight:
                raise RuntimeError(f"session {s.session_id!r} has no resident chunk in flight")
        if not plan.distinct:
            raise ValueError("a session appears twice in one batch")
        freed: list[int] = []
        for s in sessions:
            for r in s.rows:
                freed += self.tables.commit(r)
            self.sessions.state[s.slot] = IDLE
        if self._restarts:
            freed += self._end_restart(plan.session_ids, committed=True)
        self.pool.free_held(freed)

    def abort_batch(self, batch: KVBatch) -> None:
        for sid in batch.session_ids:
            if self.is_resident(sid):
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

    def attend_with(self, q: torch.Tensor, layer: int, batch: KVBatch, k_extra: torch.Tensor,
                    v_extra: torch.Tensor, *, scale: float | None = None) -> torch.Tensor:
        """``attend`` with transient K/V ``[R, L, kv_heads, head_dim]`` after each row's pages:
        tokens the forward attends but never keeps (``paged_attention.transient_attention``)."""
        return paged_attention.transient_attention(q, self.storage.k[layer], self.storage.v[layer], batch,
                                                   k_extra, v_extra, scale=scale)

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
        s = self.sessions[session_id]
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
        s = self.sessions[session_id]
        g = self.geometry
        cross = len(s.branches) * g.cross_bytes_per_branch
        return s.num_held_blocks() * g.num_layers * 2 * g.block_bytes + cross

    def swap_out(self, session_id: str) -> HostKV:
        """Copy the session's held blocks and cross caches to the host and free them here.

        The session's table rows keep their page counts; ``swap_in`` puts the new
        blocks in the same places.
        """
        s = self._resident(session_id)
        if s.in_flight:
            raise RuntimeError(f"session {session_id!r} has a chunk in flight")
        ids = s.held_blocks()
        st = self.storage
        blocks = st.copy_out([st.k, st.v], ids)
        cross = None
        if self.geometry.cross_tokens:
            slots = list(s.cross_slots.values())
            cross = st.copy_out([st.cross_k, st.cross_v], slots)
            self._cross_free.extend(slots)
            self.sessions.cross[list(s.rows)] = -1
        st.synchronize()
        self.pool.free_held(ids)
        self.sessions.state[s.slot] = SWAPPED
        self._num_swapped += 1
        nbytes = blocks.numel() * blocks.element_size()
        if cross is not None:
            nbytes += cross.numel() * cross.element_size()
        return HostKV(session_id, blocks, tuple(ids), cross, nbytes)

    def swap_in(self, host: HostKV) -> bool:
        """Bring a swapped session back, bit-exact, into fresh blocks; False if it does not fit."""
        sid = host.session_id
        s = self.sessions[sid]
        if s.state != SWAPPED:
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
            self.sessions.cross[list(s.rows)] = slots
        st.synchronize()
        # held_blocks() order: branch by branch, page order, as swap_out copied them.
        t = self.tables
        i = 0
        for r in s.rows:
            h = int(t.held[r])
            t.set_stored(r, ids[i:i + h])
            i += h
        self.sessions.state[s.slot] = IDLE
        self._num_swapped -= 1
        return True

    # -- reading -----------------------------------------------------------------

    def session(self, session_id: str) -> SessionKV:
        return self.sessions[session_id]

    def __contains__(self, session_id: str) -> bool:
        return session_id in self.sessions

    def is_resident(self, session_id: str) -> bool:
        return session_id in self.sessions and self.sessions[session_id].state != SWAPPED

    def in_flight(self, session_id: str) -> bool:
        return self.sessions[session_id].in_flight

    def committed_frames(self, session_id: str) -> int:
        return self.sessions[session_id].num_frames

    def table(self, session_id: str, branch: str | None = None) -> BlockTable:
        s = self.sessions[session_id]
        return s.tables[s.branches[0] if branch is None else branch]

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_resident(self) -> int:
        return len(self.sessions) - self._num_swapped

    @property
    def session_ids(self) -> list[str]:
        return self.sessions.ids()

    def blocks_for_tick(self, session_ids: Sequence[str], frames: int | None = None) -> int:
        """Blocks ``begin_batch`` would allocate for those of these sessions not in flight."""
        if not session_ids:
            return 0
        return self.blocks_for(self.resolve(session_ids), frames)

    def blocks_for(self, plan: BatchRows, frames: int | None = None) -> int:
        """``blocks_for_tick`` of a resolved batch."""
        per_branch = self._frames(frames) * self.geometry.pages_per_frame
        state = self.sessions.state[plan.slots]
        if self.fast_path and not state.any():  # all idle: every row begins a chunk
            return len(plan.rows) * per_branch
        waiting = self.sessions.num_branches[plan.slots][state != IN_FLIGHT]
        return int(waiting.sum()) * per_branch
