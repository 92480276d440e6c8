"""Which sessions live on the device: LRU eviction with swap to host.

The engine calls ``ensure_resident(batch_session_ids)`` before each batch. For
every session of the batch that is swapped out, and for the scratch blocks the
batch's chunks will need, room is made by evicting the least recently ticked
idle session: one that is neither in the batch nor has a chunk in flight. An
evicted session is swapped to host memory (pinned on CUDA) and swapped back
bit-exactly when it ticks again. When the host budget is full, the least
recently ticked *swapped* sessions are dropped to make host room (they are older
than any resident one); a session that cannot fit on the host even alone is
dropped itself. Dropping closes the session's KV, runs ``on_drop(session_id)``
(the adapter's release hook; the engine then sends the client an ``error`` with
code ``SESSION_EVICTED``) and returns the id from ``ensure_resident``/``open``.
Admission (``refusal``) counts every session at its most, so a model that asks it before
opening a session (``WorldAdapter.admit``) never gets to a drop; a batch's swapped
sessions are never dropped to make room, and the host bytes they leave are room for the
sessions swapped out in exchange.

A session's model-owned state (``attach_state``, see ``kv.model_state``) moves
with its KV: evicting a session swaps all its branches' blocks, its cross caches
and its state to the host together, bringing it back restores all three
bit-exactly, the host budget counts the state's bytes, and close or drop frees it.

LRU order is tick order: ``ensure_resident`` and ``touch`` move sessions to the
most-recent end. It is kept as a stamp per cache session slot (a counter that
grows with every touch), so touching a batch is one array write and the LRU
idle session is one ``argmin``.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Sequence

import numpy as np

from kv.cache import HostKV, PagedKVCache
from kv.capacity import format_bytes, session_bytes
from kv.model_state import ModelState
from kv.session_kv import SlotState

log = logging.getLogger(__name__)

SESSION_EVICTED = "session_evicted"


class ResidencyError(RuntimeError):
    """The batch alone needs more than the device holds (an engine sizing bug)."""


class Residency:
    def __init__(self, cache: PagedKVCache, *, host_budget_bytes: int,
                 on_drop: Callable[[str], None] | None = None) -> None:
        self.cache = cache
        self.host_budget_bytes = host_budget_bytes
        self.on_drop = on_drop
        # Last touch of each cache slot (larger = more recent); free slots are ignored.
        self._stamp = np.zeros(cache.sessions.capacity, dtype=np.int64)
        self._clock = 0
        self._host: dict[str, HostKV] = {}                  # swapped sessions
        self._states: dict[str, ModelState] = {}            # model-owned state, resident or not
        self.host_bytes = 0
        self.swap_outs = self.swap_ins = self.drops = 0
        self.swap_out_bytes = self.swap_in_bytes = 0
        self.swap_out_seconds = self.swap_in_seconds = 0.0

    # -- lifecycle -------------------------------------------------------------

    def open(self, session_id: str, branches: Sequence[str] | None = None) -> list[str]:
        """Open a session's KV, evicting LRU idle sessions for its slot; returns dropped ids."""
        dropped: list[str] = []
        while self.cache.num_resident >= self.cache.max_sessions:
            self._evict_one(self._slots_of((session_id,)), dropped)
        if not self.cache.open(session_id, branches):
            raise ResidencyError(f"no session slot for {session_id!r}")
        self.touch(session_id)
        return dropped

    def attach_state(self, session_id: str, state: ModelState) -> None:
        """Give an open, resident session its model-owned state (replacing and freeing any earlier one).

        Raises ``ValueError`` (and changes nothing) when the session is not open and
        resident, or when the state is larger than the geometry's
        ``model_state_bytes``, which capacity was planned with.
        """
        if session_id not in self.cache or not self.cache.is_resident(session_id):
            raise ValueError(f"session {session_id!r} is not open and resident")
        declared = self.cache.geometry.model_state_bytes
        if state.nbytes > declared:
            raise ValueError(f"model state of {state.nbytes} bytes exceeds the declared "
                             f"model_state_bytes {declared} that capacity was planned with")
        old = self._states.get(session_id)
        if old is not None and old is not state:
            old.free()
        self._states[session_id] = state

    def state(self, session_id: str) -> ModelState | None:
        """The session's model-owned state (on the device whenever the session is resident)."""
        return self._states.get(session_id)

    def close(self, session_id: str) -> None:
        """Forget the session wherever it lives, freeing its model state (idempotent)."""
        if session_id not in self.cache:
            return
        state = self._states.pop(session_id, None)
        host = self._host.pop(session_id, None)
        if host is not None:
            self.host_bytes -= host.nbytes + (state.nbytes if state is not None else 0)
        if state is not None:
            state.free()
        self.cache.close(session_id)

    def _state_bytes(self, session_id: str) -> int:
        state = self._states.get(session_id)
        return 0 if state is None else state.nbytes

    def reset(self, session_id: str, keep_cross: bool = False) -> list[str]:
        """Reset the session's KV (made resident first, so kept cross caches survive)."""
        dropped = self.ensure_resident([session_id])
        self.cache.reset(session_id, keep_cross=keep_cross)
        return dropped

    def touch(self, session_id: str) -> None:
        self._touch(np.array([self.cache.session(session_id).slot]))

    def _touch(self, slots: np.ndarray) -> None:
        """Make these slots the most recent, the last one most recent of all."""
        n = len(slots)
        self._stamps()[slots] = np.arange(self._clock + 1, self._clock + n + 1)
        self._clock += n

    def _stamps(self) -> np.ndarray:
        capacity = self.cache.sessions.capacity
        if len(self._stamp) < capacity:  # the cache grew its slots
            self._stamp = np.concatenate([self._stamp, np.zeros(capacity - len(self._stamp), np.int64)])
        return self._stamp

    def _slots_of(self, session_ids: Sequence[str]) -> np.ndarray:
        sessions = self.cache.sessions
        return np.array([sessions[sid].slot for sid in session_ids if sid in sessions],
                        dtype=np.int64)

    # -- the engine's call ---------------------------------------------------------

    def ensure_resident(self, session_ids: Sequence[str]) -> list[str]:
        """Make every session of the batch resident with room for its next chunk.

        Returns the ids of sessions dropped (not swapped) to make room. Raises
        ``ResidencyError`` if the batch cannot fit even with everyone else evicted.
        """
        cache = self.cache
        dropped: list[str] = []
        if not session_ids:
            return dropped
        plan = cache.resolve(session_ids)
        host = self._host
        swapped_in_batch = [sid for sid in plan.session_ids if sid in host] if host else []
        need_blocks = sum(len(host[sid].block_ids) for sid in swapped_in_batch)
        need_blocks += cache.blocks_for(plan)
        need_slots = len(swapped_in_batch)
        # The batch's swapped sessions leave the host as the victims arrive: their bytes are
        # room for them (the host holds both for the moment of the exchange), and they are
        # never dropped to make room for themselves.
        leaving = sum(host[sid].nbytes + self._state_bytes(sid) for sid in swapped_in_batch)
        while (cache.num_free_blocks < need_blocks
               or cache.max_sessions - cache.num_resident < need_slots):
            self._evict_one(plan.slots, dropped, leaving)
        for sid in swapped_in_batch:
            h = host.pop(sid)
            start = time.perf_counter()
            if not cache.swap_in(h):  # cannot happen after the loop above
                host[sid] = h
                raise ResidencyError(f"swap-in of {sid!r} failed after making room")
            state = self._states.get(sid)
            nbytes = h.nbytes
            if state is not None:
                state.to_device(cache.device)
                nbytes += state.nbytes
            self.swap_in_seconds += time.perf_counter() - start
            self.swap_ins += 1
            self.swap_in_bytes += nbytes
            self.host_bytes -= nbytes
            log.info("kv swap-in session=%s bytes=%d", sid, nbytes)
        self._touch(plan.slots)
        return dropped

    # -- eviction -------------------------------------------------------------------

    def _oldest(self, state: SlotState, protected: np.ndarray | None = None) -> str | None:
        """The least recently touched session in ``state`` outside ``protected`` slots."""
        sessions = self.cache.sessions
        candidate = sessions.state == state
        if protected is not None:
            candidate[protected] = False
        if not candidate.any():
            return None
        slot = int(np.argmin(np.where(candidate, self._stamps(), np.iinfo(np.int64).max)))
        return sessions.at(slot).session_id

    def _evict_one(self, protected: np.ndarray, dropped: list[str], leaving: int = 0) -> None:
        """Swap the least recently ticked idle session outside ``protected`` to host (or drop
        it); ``leaving``: host bytes of protected sessions about to be swapped in."""
        # Idle resident sessions only: not in the batch, no chunk in flight, not swapped.
        victim = self._oldest(SlotState.IDLE, protected)
        if victim is None:
            raise ResidencyError(
                f"cannot make room: {self.cache.num_resident} resident sessions are all in the "
                f"batch or in flight ({self.cache.num_free_blocks} free blocks)")
        need = self.cache.swap_bytes(victim) + self._state_bytes(victim)
        if need > self.host_budget_bytes:
            self._drop(victim, dropped)
            return
        # Host room first: drop the oldest swapped sessions (older than any resident one);
        # with none left to drop, the victim itself.
        while self.host_bytes - leaving + need > self.host_budget_bytes:
            oldest = self._oldest(SlotState.SWAPPED, protected)
            if oldest is None:
                self._drop(victim, dropped)
                return
            self._drop(oldest, dropped)
        start = time.perf_counter()
        host = self.cache.swap_out(victim)
        state = self._states.get(victim)
        moved = host.nbytes
        if state is not None:
            state.to_host()
            moved += state.nbytes
        self.swap_out_seconds += time.perf_counter() - start
        self._host[victim] = host
        self.host_bytes += moved
        self.swap_outs += 1
        self.swap_out_bytes += moved
        log.info("kv swap-out session=%s bytes=%d", victim, moved)

    def _drop(self, session_id: str, dropped: list[str]) -> None:
        log.warning("kv drop session=%s (%s)", session_id, SESSION_EVICTED)
        self.close(session_id)
        self.drops += 1
        dropped.append(session_id)
        if self.on_drop is not None:
            self.on_drop(session_id)

    # -- reading ------------------------------------------------------------------------

    def refusal(self, pending: int = 0) -> str | None:
        """Why one more session cannot be admitted without dropping another (None: it can).

        Every session open (resident or swapped) and ``pending`` (admitted, not opened yet)
        is counted at its most (``kv.capacity.session_bytes``: a full window), whatever it
        holds now: sessions grow, and which of them are resident is the LRU's choice. So
        a new one fits while the sessions beyond the resident slots fit the host budget at
        that size, and admitted sessions can always be swapped, never dropped. A new session
        never drops an existing one: it is refused instead (``busy`` at create).
        """
        need = session_bytes(self.cache.geometry)
        slots = self.cache.max_sessions
        held = self.cache.num_resident + len(self._host) + pending
        free_slots = max(slots - held, 0)
        host_free = max(self.host_budget_bytes - max(held - slots, 0) * need, 0)
        if free_slots > 0 or host_free >= need:
            return None
        return (f"no room for a new session: it needs {format_bytes(need)} of KV memory; free: "
                f"{format_bytes(free_slots * need)} on the device ({_count(held, 'session')} held, "
                f"{_count(slots, 'resident slot')}) and {format_bytes(host_free)} of the "
                f"{format_bytes(self.host_budget_bytes)} host swap budget (each session counted at its most)")

    def is_swapped(self, session_id: str) -> bool:
        return session_id in self._host

    def lru_order(self) -> list[str]:
        """Open sessions, least recently touched first."""
        sessions = self.cache.sessions
        slots = np.flatnonzero(sessions.state != SlotState.FREE)
        order = slots[np.argsort(self._stamps()[slots], kind="stable")]
        return [sessions.at(int(slot)).session_id for slot in order]

    def metrics(self) -> dict[str, float | int]:
        return {
            "resident_sessions": self.cache.num_resident,
            "swapped_sessions": len(self._host),
            "free_blocks": self.cache.num_free_blocks,
            "total_blocks": self.cache.pool.num_blocks,
            # Never a session's: the pad block and the worker blocks (the null block aside).
            "reserved_blocks": 1 + len(self.cache.worker_blocks),
            "host_bytes": self.host_bytes,
            "host_budget_bytes": self.host_budget_bytes,
            "swap_outs": self.swap_outs,
            "swap_ins": self.swap_ins,
            "swap_out_bytes": self.swap_out_bytes,
            "swap_in_bytes": self.swap_in_bytes,
            "swap_out_seconds": self.swap_out_seconds,
            "swap_in_seconds": self.swap_in_seconds,
            "drops": self.drops,
            # list(): one C call, so a reader on another thread never iterates a
            # dict the engine thread is resizing.
            "model_state_bytes": sum(s.nbytes for s in list(self._states.values())),
        }


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
