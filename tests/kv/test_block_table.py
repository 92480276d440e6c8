import pytest

from kv.block_table import BlockTable


def test_positional_table_with_null_holes():
    t = BlockTable(sink=1, window=2, span=1, pages_per_frame=2)
    t.begin([1, 2], 1)
    assert t.commit() == []
    t.begin([3, 4], 1)
    assert t.commit() == []
    t.begin([5, 6], 1)
    assert t.commit() == []
    assert t.positional() == [1, 2, 3, 4, 5, 6]
    t.begin([7, 8], 1)
    assert t.commit() == [3, 4]           # frame 1 leaves the window
    assert t.positional() == [1, 2, 0, 0, 5, 6, 7, 8]
    assert list(t.held) == [1, 2, 5, 6, 7, 8]
    assert t.window_start_frame == 2


def test_abort_leaves_committed_state():
    t = BlockTable(sink=1, window=1, span=1, pages_per_frame=1)
    t.begin([1], 1)
    t.commit()
    t.begin([2], 1)
    t.commit()
    before = (list(t.held), t.num_frames, t.positional())
    t.begin([3], 1)
    assert t.attend_blocks() == [1, 2, 3]
    assert t.block_at(2) == 3               # pending pages are addressable
    assert t.abort() == [3]
    assert (list(t.held), t.num_frames, t.positional()) == before
    with pytest.raises(IndexError):
        t.block_at(2)


def test_begin_twice_and_wrong_block_count():
    t = BlockTable(sink=0, window=1, span=1, pages_per_frame=2)
    with pytest.raises(ValueError):
        t.begin([1], 1)
    t.begin([1, 2], 1)
    with pytest.raises(RuntimeError):
        t.begin([3, 4], 1)


def test_clear_and_remap():
    t = BlockTable(sink=1, window=1, span=1, pages_per_frame=1)
    for blk in (1, 2, 3):
        t.begin([blk], 1)
        t.commit()
    t.begin([4], 1)
    t.remap({1: 11, 3: 13, 4: 14})
    assert t.positional() == [11, 0, 13, 14]
    assert t.clear() == [11, 13, 14]
    assert t.num_frames == 0 and t.positional() == []


def test_rows_at_once_equal_one_row_at_a_time():
    """begin_rows / commit_rows on a store equal begin / commit row by row on a copy.

    Each step begins two disjoint groups of rows with chunks of different lengths
    and commits them in one call (the engine commits sessions of two batches).
    """
    import numpy as np

    from kv.block_table import BlockTables

    rng = np.random.default_rng(0)
    for sink, window, span, ppf in [(1, 3, 1, 1), (2, 3, 2, 2), (0, 1, 1, 3)]:
        vec = BlockTables(sink, window, span, ppf, rows=6)
        one = BlockTables(sink, window, span, ppf, rows=6)
        next_id = 1
        for step in range(40):
            rows = rng.choice(6, size=rng.integers(1, 7), replace=False)
            for group in np.array_split(rows, 2):
                T = span * ppf * int(rng.integers(1, 3))
                blocks = np.arange(next_id, next_id + len(group) * T)
                next_id += len(blocks)
                lengths = vec.begin_rows(group, blocks, T)
                for i, r in enumerate(group.tolist()):
                    one.begin(r, blocks[i * T:(i + 1) * T].tolist(), T // ppf)
                assert lengths.tolist() == (one.held[group] + T).tolist()
            released = vec.commit_rows(rows).tolist()
            assert released == [b for r in rows.tolist() for b in one.commit(r)]
            for name in ("pages", "held", "pending", "frames", "window_start"):
                assert np.array_equal(getattr(vec, name), getattr(one, name)), (step, name)
        assert vec.width > vec.max_held + span * ppf   # two-span chunks widened the rows
