"""Block allocator for the paged KV pool: ids only, no tensors.

The tensors live in ``storage.KVStorage``; this module hands out block ids.
Block 0 is the null block: it is never handed out or freed, and positional
block tables point at it for frames that were released or skipped. Free blocks
sit in a doubly linked queue of slotted records (``KVBlock``), so popping from
the front, appending at the back and removing a given block from the middle are
all O(1). ``allocate`` counts first and returns ``None`` when the request does
not fit: nothing is ever half-allocated. ``free`` checks that every block comes
back exactly once.
"""

from __future__ import annotations

from typing import Iterable

NULL_BLOCK = 0


class KVBlock:
    """One pool block's record; the links are only meaningful while it is free."""

    __slots__ = ("block_id", "prev_free", "next_free", "is_free")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.prev_free: KVBlock | None = None
        self.next_free: KVBlock | None = None
        self.is_free = False

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, free={self.is_free})"


class FreeBlockQueue:
    """Doubly linked queue of free blocks between two sentinels.

    The sentinels remove every "is this the end?" branch from the link updates.
    """

    __slots__ = ("_head", "_tail", "num_free")

    def __init__(self, blocks: Iterable[KVBlock] = ()) -> None:
        self._head = KVBlock(-1)
        self._tail = KVBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVBlock:
        block = self._head.next_free
        if block is self._tail:
            raise IndexError("no free blocks")
        nxt = block.next_free
        self._head.next_free = nxt
        nxt.prev_free = self._head
        block.prev_free = block.next_free = None
        block.is_free = False
        self.num_free -= 1
        return block

    def append(self, block: KVBlock) -> None:
        if block.is_free:
            raise ValueError(f"block {block.block_id} is already free")
        last = self._tail.prev_free
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        block.is_free = True
        self.num_free += 1

    def remove(self, block: KVBlock) -> None:
        """Take ``block`` out of the middle of the queue."""
        if not block.is_free:
            raise ValueError(f"block {block.block_id} is not free")
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        block.is_free = False
        self.num_free -= 1

    def ids(self) -> list[int]:
        """Free block ids in queue order (tests and debugging)."""
        out = []
        block = self._head.next_free
        while block is not self._tail:
            out.append(block.block_id)
            block = block.next_free
        return out


class BlockPool:
    """Hands out block ids ``1 .. num_blocks-1``; block 0 is the null block."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"a pool needs the null block and at least one more, got {num_blocks}")
        self.num_blocks = num_blocks
        self._blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free = FreeBlockQueue(self._blocks[1:])

    @property
    def num_free(self) -> int:
        return self._free.num_free

    def allocate(self, n: int) -> list[int] | None:
        """``n`` block ids from the front of the free queue, or ``None`` if fewer are free."""
        free = self._free
        if n > free.num_free:
            return None
        # FreeBlockQueue.popleft, unrolled: this runs for every block of every tick.
        head = free._head
        out = []
        block = head.next_free
        for _ in range(n):
            out.append(block.block_id)
            block.is_free = False
            block.prev_free = None
            nxt = block.next_free
            block.next_free = None
            block = nxt
        head.next_free = block
        block.prev_free = head
        free.num_free -= n
        return out

    def take(self, block_ids: Iterable[int]) -> bool:
        """Claim these specific free blocks (all or nothing); False if any is not free."""
        ids = list(block_ids)
        blocks = [self._blocks[i] for i in ids]
        if len(set(ids)) != len(ids) or not all(b.is_free for b in blocks):
            return False
        for block in blocks:
            self._free.remove(block)
        return True

    def free(self, block_ids: Iterable[int]) -> None:
        """Return blocks to the back of the free queue; each exactly once, never block 0.

        A bad id (null, out of range, already free, repeated) raises and leaves
        the queue as it was.
        """
        blocks = self._blocks
        n = self.num_blocks
        free = self._free
        tail = free._tail
        linked: list[KVBlock] = []
        for i in block_ids:
            if not 0 < i < n:
                self._unlink(linked)
                if i == NULL_BLOCK:
                    raise ValueError("the null block is never freed")
                raise ValueError(f"block id {i} out of range 1..{n - 1}")
            block = blocks[i]
            if block.is_free:
                self._unlink(linked)
                raise ValueError(f"block {i} freed twice")
            # FreeBlockQueue.append, unrolled.
            last = tail.prev_free
            last.next_free = block
            block.prev_free = last
            block.next_free = tail
            tail.prev_free = block
            block.is_free = True
            linked.append(block)
        free.num_free += len(linked)

    def _unlink(self, linked: list[KVBlock]) -> None:
        """Undo the appends of a failed ``free`` (they are the queue's last entries)."""
        for block in reversed(linked):
            block.prev_free.next_free = block.next_free
            block.next_free.prev_free = block.prev_free
            block.prev_free = block.next_free = None
            block.is_free = False

    def is_free(self, block_id: int) -> bool:
        return self._blocks[block_id].is_free

    def free_ids(self) -> list[int]:
        return self._free.ids()
