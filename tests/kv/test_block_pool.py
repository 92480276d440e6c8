import pytest

import numpy as np

from kv.block_pool import NULL_BLOCK, BlockPool, FreeBlockQueue


def test_null_block_is_never_handed_out():
    pool = BlockPool(5)
    assert pool.num_free == 4
    assert pool.allocate(4) == [1, 2, 3, 4]
    assert pool.num_free == 0
    assert not pool.is_free(NULL_BLOCK)


def test_allocate_counts_first_and_changes_nothing_on_shortage():
    pool = BlockPool(6)
    assert pool.allocate(2) == [1, 2]
    assert pool.allocate(4) is None
    assert pool.num_free == 3
    assert pool.free_ids() == [3, 4, 5]
    assert pool.allocate(3) == [3, 4, 5]
    assert pool.allocate(1) is None
    assert pool.allocate(0) == []


def test_free_appends_in_order_and_allocation_is_fifo():
    pool = BlockPool(6)
    a = pool.allocate(5)
    pool.free([4, 2])
    pool.free([5])
    assert pool.free_ids() == [4, 2, 5]
    assert pool.allocate(2) == [4, 2]
    assert a == [1, 2, 3, 4, 5]


def test_free_returns_each_block_exactly_once():
    pool = BlockPool(5)
    pool.allocate(4)
    pool.free([2, 3])
    with pytest.raises(ValueError, match="freed twice"):
        pool.free([1, 2])           # 1 is valid, 2 already free
    assert pool.free_ids() == [2, 3]  # the bad call linked nothing
    with pytest.raises(ValueError, match="freed twice"):
        pool.free([4, 4])
    assert pool.free_ids() == [2, 3]
    with pytest.raises(ValueError, match="null block"):
        pool.free([NULL_BLOCK])
    with pytest.raises(ValueError, match="out of range"):
        pool.free([5])
    assert pool.num_free == 2
    pool.free([1, 4])
    assert pool.free_ids() == [2, 3, 1, 4]
    assert pool.num_free == 4


def test_take_removes_from_the_middle():
    pool = BlockPool(8)
    assert pool.take([3, 5])
    assert pool.free_ids() == [1, 2, 4, 6, 7]
    assert not pool.take([2, 3])      # 3 is taken: all or nothing
    assert pool.free_ids() == [1, 2, 4, 6, 7]
    assert not pool.take([NULL_BLOCK])
    assert pool.allocate(5) == [1, 2, 4, 6, 7]


def test_free_queue_order_and_removal():
    q = FreeBlockQueue(4, range(4))
    q.remove(2)
    assert q.ids() == [0, 1, 3]
    assert q.popleft() == 0
    q.append(2)
    assert q.ids() == [1, 3, 2]
    with pytest.raises(ValueError):
        q.append(2)
    with pytest.raises(ValueError):
        q.remove(0)
    for _ in range(3):
        q.popleft()
    with pytest.raises(IndexError):
        q.popleft()
    assert q.num_free == 0


def test_free_queue_compacts_stale_entries_and_a_full_buffer():
    q = FreeBlockQueue(6, range(1, 6))
    q.remove(3)
    q.remove(1)
    assert q.popleft_many(2).tolist() == [2, 4]   # stale entries of 1 and 3 swept first
    q.append(3)
    assert q.ids() == [5, 3]
    # Cycle every block through the queue many times: the buffer (twice the pool)
    # fills from the back and the live entries move to the front, order kept.
    for _ in range(10):
        out = q.popleft_many(2)
        q.extend(out[::-1])
    assert q.ids() == [5, 3] and q.num_free == 2
    q.extend(np.array([1, 2, 4]))
    assert q.ids() == [5, 3, 1, 2, 4]
    assert [q.is_free(i) for i in range(6)] == [False, True, True, True, True, True]


def test_freeing_held_blocks_refuses_a_free_block():
    pool = BlockPool(4)
    pool.allocate(3)
    pool.free_held(np.array([2, 1]))
    with pytest.raises(ValueError, match="block 1 freed twice"):
        pool.free_held([3, 1])
    assert pool.free_ids() == [2, 1]


def test_pool_needs_a_real_block():
    with pytest.raises(ValueError):
        BlockPool(1)
