"""Block allocator for the paged KV pool: ids only, no tensors.

The tensors live in ``storage.KVStorage``; this module hands out block ids.
Block 0 is the null block: it is never handed out or freed, and positional
block tables point at it for frames that were released or skipped.

Free blocks wait in a FIFO queue (``FreeBlockQueue``): allocation takes from
the front, freeing appends at the back, and a given free block can be removed
from the middle, each in O(1). The queue is a numpy buffer, so a whole batch's
blocks come off the front, or go on the back, as one slice. ``allocate``
counts first and returns ``None`` when the request does not fit: nothing is
ever half-allocated. ``free`` checks that every block comes back exactly once.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

NULL_BLOCK = 0

# Up to this many ids, element-wise numpy access beats building index arrays
# (a single session's commit releases one chunk per branch).
_FEW = 4


class FreeBlockQueue:
    """FIFO of free block ids ``0 .. num_blocks-1`` in a numpy buffer.

    The queue is ``buf[head:tail]``. ``pos[b]`` is the buffer index of block
    ``b``'s entry while it is free and -1 otherwise, so an entry ``i`` is live
    iff ``pos[buf[i]] == i``::

        buf:  [ consumed | 7  3  x  9  4 | room ... ]      x: a removed block's
                          ^head          ^tail                stale entry
        pos:  pos[7] = head, pos[3] = head + 1, pos[x] = -1 (or a newer entry)

    ``remove`` only marks the block (O(1)) and leaves its stale entry; the next
    ``popleft``/``popleft_many`` sweeps stale entries out of the buffer in one
    vectorised pass first. When the back of the buffer is full the live entries
    move to the front (the buffer is twice the pool, so that costs O(1) per
    appended block amortised). Ids are not checked here; ``BlockPool`` checks.
    """

    __slots__ = ("_buf", "_pos", "_head", "_tail", "_stale", "num_free")

    def __init__(self, num_blocks: int, ids: Iterable[int] = ()) -> None:
        self._buf = np.zeros(2 * num_blocks + 1, dtype=np.int32)
        self._pos = np.full(num_blocks, -1, dtype=np.int64)
        self._head = self._tail = 0
        self._stale = 0
        self.num_free = 0
        self.extend(np.fromiter(ids, dtype=np.int64))

    # -- one block ---------------------------------------------------------------

    def popleft(self) -> int:
        if not self.num_free:
            raise IndexError("no free blocks")
        return int(self.popleft_many(1)[0])

    def append(self, block_id: int) -> None:
        if self._pos[block_id] >= 0:
            raise ValueError(f"block {block_id} is already free")
        self.extend(np.array([block_id], dtype=np.int64))

    def remove(self, block_id: int) -> None:
        """Take ``block_id`` out of the middle of the queue."""
        if self._pos[block_id] < 0:
            raise ValueError(f"block {block_id} is not free")
        self._pos[block_id] = -1
        self._stale += 1
        self.num_free -= 1

    # -- many blocks at once -------------------------------------------------------

    def popleft_many(self, n: int) -> np.ndarray:
        """The ``n`` blocks at the front, in order (the caller checked ``n <= num_free``)."""
        if self._stale:
            self._compact()
        h = self._head
        out = self._buf[h:h + n].astype(np.int64)  # a copy: compaction reuses the buffer
        self._pos[out] = -1
        self._head = h + n
        self.num_free -= n
        return out

    def extend(self, ids: np.ndarray | list[int]) -> None:
        """Append ``ids`` (distinct blocks that are not free) at the back, in order."""
        k = len(ids)
        if self._tail + k > len(self._buf):
            self._compact()
        t = self._tail
        if k <= _FEW:
            buf, pos = self._buf, self._pos
            for i, b in enumerate(ids, t):
                buf[i] = b
                pos[b] = i
        else:
            self._buf[t:t + k] = ids
            self._pos[ids] = np.arange(t, t + k)
        self._tail = t + k
        self.num_free += k

    def _compact(self) -> None:
        """Move the live entries, in order, to the front of the buffer."""
        live = self._live()
        m = len(live)
        self._buf[:m] = live
        self._pos[live] = np.arange(m)
        self._head, self._tail, self._stale = 0, m, 0

    def _live(self) -> np.ndarray:
        entries = self._buf[self._head:self._tail].astype(np.int64)
        if self._stale:
            entries = entries[self._pos[entries] == np.arange(self._head, self._tail)]
        return entries

    # -- reading -----------------------------------------------------------------------

    def is_free(self, block_id: int) -> bool:
        return self._pos.item(block_id) >= 0

    def free_mask(self, ids: np.ndarray) -> np.ndarray:
        return self._pos[ids] >= 0

    def ids(self) -> list[int]:
        """Free block ids in queue order (tests and debugging)."""
        return self._live().tolist()


class BlockPool:
    """Hands out block ids ``1 .. num_blocks-1``; block 0 is the null block."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"a pool needs the null block and at least one more, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free = FreeBlockQueue(num_blocks, range(1, num_blocks))

    @property
    def num_free(self) -> int:
        return self._free.num_free

    def allocate(self, n: int) -> list[int] | None:
        """``n`` block ids from the front of the free queue, or ``None`` if fewer are free."""
        out = self.allocate_array(n)
        return None if out is None else out.tolist()

    def allocate_array(self, n: int) -> np.ndarray | None:
        """``allocate`` as an int64 array (the batch path)."""
        if n > self._free.num_free:
            return None
        return self._free.popleft_many(n)

    def take(self, block_ids: Iterable[int]) -> bool:
        """Claim these specific free blocks (all or nothing); False if any is not free."""
        ids = list(block_ids)
        if len(set(ids)) != len(ids) or not all(0 < i < self.num_blocks and self._free.is_free(i)
                                                for i in ids):
            return False
        for i in ids:
            self._free.remove(i)
        return True

    def free(self, block_ids: Iterable[int]) -> None:
        """Return blocks to the back of the free queue; each exactly once, never block 0.

        A bad id (null, out of range, already free, repeated) raises and leaves
        the queue as it was.
        """
        ids = np.fromiter(block_ids, dtype=np.int64)
        if not len(ids):
            return
        n = self.num_blocks
        in_range = (ids > 0) & (ids < n)
        if in_range.all():
            # Already free, or repeated in this call (only the last of equal ids
            # keeps its own index in ``last``).
            last = np.empty(n, dtype=np.int64)
            last[ids] = np.arange(len(ids))
            twice = self._free.free_mask(ids) | (last[ids] != np.arange(len(ids)))
            if not twice.any():
                self._free.extend(ids)
                return
            first_bad = ids[np.argmax(twice)]
        else:
            first_bad = ids[np.argmin(in_range)]
        if first_bad == NULL_BLOCK:
            raise ValueError("the null block is never freed")
        if not 0 < first_bad < n:
            raise ValueError(f"block id {first_bad} out of range 1..{n - 1}")
        raise ValueError(f"block {first_bad} freed twice")

    def free_held(self, block_ids: np.ndarray | list[int]) -> None:
        """``free`` for blocks a block table held: in-range and distinct by construction.

        Only the cheap check stays (none of them is free already), so a
        bookkeeping bug still raises instead of handing a block out twice.
        """
        if len(block_ids) <= _FEW:
            for b in block_ids:
                if self._free.is_free(b):
                    raise ValueError(f"block {b} freed twice")
        elif self._free.free_mask(block_ids).any():
            ids = np.asarray(block_ids)
            raise ValueError(f"block {ids[self._free.free_mask(ids)][0]} freed twice")
        self._free.extend(block_ids)

    def is_free(self, block_id: int) -> bool:
        return self._free.is_free(block_id)

    def free_ids(self) -> list[int]:
        return self._free.ids()
