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

LRU order is tick order: ``ensure_resident`` and ``touch`` move sessions to the
most-recent end.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Callable, Sequence

from kv.cache import HostKV, PagedKVCache

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
        self._lru: OrderedDict[str, None] = OrderedDict()  # every open session, oldest first
        self._host: dict[str, HostKV] = {}                  # swapped sessions
        self.host_bytes = 0
        self.swap_outs = self.swap_ins = self.drops = 0
        self.swap_out_bytes = self.swap_in_bytes = 0
        self.swap_out_seconds = self.swap_in_seconds = 0.0

    # -- lifecycle -------------------------------------------------------------

    def open(self, session_id: str, branches: Sequence[str] | None = None) -> list[str]:
        """Open a session's KV, evicting LRU idle sessions for its slot; returns dropped ids."""
        dropped: list[str] = []
        while self.cache.num_resident >= self.cache.max_sessions:
            self._evict_one(frozenset((session_id,)), dropped)
        if not self.cache.open(session_id, branches):
            raise ResidencyError(f"no session slot for {session_id!r}")
        self._lru[session_id] = None
        return dropped

    def close(self, session_id: str) -> None:
        """Forget the session wherever it lives (idempotent)."""
        if session_id not in self._lru:
            return
        del self._lru[session_id]
        host = self._host.pop(session_id, None)
        if host is not None:
            self.host_bytes -= host.nbytes
        self.cache.close(session_id)

    def reset(self, session_id: str, keep_cross: bool = False) -> list[str]:
        """Reset the session's KV (made resident first, so kept cross caches survive)."""
        dropped = self.ensure_resident([session_id])
        self.cache.reset(session_id, keep_cross=keep_cross)
        return dropped

    def touch(self, session_id: str) -> None:
        self._lru.move_to_end(session_id)

    # -- the engine's call ---------------------------------------------------------

    def ensure_resident(self, session_ids: Sequence[str]) -> list[str]:
        """Make every session of the batch resident with room for its next chunk.

        Returns the ids of sessions dropped (not swapped) to make room. Raises
        ``ResidencyError`` if the batch cannot fit even with everyone else evicted.
        """
        cache = self.cache
        dropped: list[str] = []
        host = self._host
        swapped_in_batch = [sid for sid in session_ids if sid in host] if host else []
        need_blocks = sum(len(host[sid].block_ids) for sid in swapped_in_batch)
        need_blocks += cache.blocks_for_tick(session_ids)
        need_slots = len(swapped_in_batch)
        if (cache.num_free_blocks < need_blocks
                or cache.max_sessions - cache.num_resident < need_slots):
            batch = frozenset(session_ids)
            while (cache.num_free_blocks < need_blocks
                   or cache.max_sessions - cache.num_resident < need_slots):
                self._evict_one(batch, dropped)
        for sid in swapped_in_batch:
            host = self._host.pop(sid)
            start = time.perf_counter()
            if not cache.swap_in(host):  # cannot happen after the loop above
                self._host[sid] = host
                raise ResidencyError(f"swap-in of {sid!r} failed after making room")
            self.swap_in_seconds += time.perf_counter() - start
            self.swap_ins += 1
            self.swap_in_bytes += host.nbytes
            self.host_bytes -= host.nbytes
            log.info("kv swap-in session=%s bytes=%d", sid, host.nbytes)
        move = self._lru.move_to_end
        for sid in session_ids:
            move(sid)
        return dropped

    # -- eviction -------------------------------------------------------------------

    def _victim(self, protected: frozenset[str]) -> str | None:
        cache = self.cache
        for sid in self._lru:
            if sid in protected or sid in self._host or cache.in_flight(sid):
                continue
            return sid
        return None

    def _evict_one(self, protected: frozenset[str], dropped: list[str]) -> None:
        victim = self._victim(protected)
        if victim is None:
            raise ResidencyError(
                f"cannot make room: {self.cache.num_resident} resident sessions are all in the "
                f"batch or in flight ({self.cache.num_free_blocks} free blocks)")
        need = self.cache.swap_bytes(victim)
        if need > self.host_budget_bytes:
            self._drop(victim, dropped)
            return
        # Host room first: drop the oldest swapped sessions (older than any resident one).
        while self.host_bytes + need > self.host_budget_bytes:
            oldest = next(sid for sid in self._lru if sid in self._host)
            self._drop(oldest, dropped)
        start = time.perf_counter()
        host = self.cache.swap_out(victim)
        self.swap_out_seconds += time.perf_counter() - start
        self._host[victim] = host
        self.host_bytes += host.nbytes
        self.swap_outs += 1
        self.swap_out_bytes += host.nbytes
        log.info("kv swap-out session=%s bytes=%d", victim, host.nbytes)

    def _drop(self, session_id: str, dropped: list[str]) -> None:
        log.warning("kv drop session=%s (%s)", session_id, SESSION_EVICTED)
        self.close(session_id)
        self.drops += 1
        dropped.append(session_id)
        if self.on_drop is not None:
            self.on_drop(session_id)

    # -- reading ------------------------------------------------------------------------

    def is_swapped(self, session_id: str) -> bool:
        return session_id in self._host

    def lru_order(self) -> list[str]:
        return list(self._lru)

    def metrics(self) -> dict[str, float | int]:
        return {
            "resident_sessions": self.cache.num_resident,
            "swapped_sessions": len(self._host),
            "free_blocks": self.cache.num_free_blocks,
            "total_blocks": self.cache.pool.num_blocks,
            "host_bytes": self.host_bytes,
            "host_budget_bytes": self.host_budget_bytes,
            "swap_outs": self.swap_outs,
            "swap_ins": self.swap_ins,
            "swap_out_bytes": self.swap_out_bytes,
            "swap_in_bytes": self.swap_in_bytes,
            "swap_out_seconds": self.swap_out_seconds,
            "swap_in_seconds": self.swap_in_seconds,
            "drops": self.drops,
        }
