import itertools

import pytest

from kv import retention
from kv.block_table import BlockTable


def test_diagram_example():
    # sink=2, window=4, span=2, n=12: sink 0-1 kept, 2-7 released, 8-11 kept.
    assert retention.window_start(12, 2, 4, 2) == 8
    assert retention.kept_frames(12, 2, 4, 2) == [0, 1, 8, 9, 10, 11]


def test_sink_zero():
    assert retention.kept_frames(10, 0, 3, 1) == [7, 8, 9]
    assert retention.freed_on_commit(9, 10, 0, 3, 1) == range(6, 7)
    assert retention.kept_frames(2, 0, 3, 1) == [0, 1]


def test_window_smaller_than_a_span_keeps_the_last_whole_span():
    assert retention.kept_frames(9, 1, 2, 3) == [0, 6, 7, 8]
    assert retention.freed_on_commit(6, 9, 1, 2, 3) == range(3, 6)
    assert retention.max_window_frames(2, 3) == 3


def test_window_not_a_multiple_of_the_span_rounds_up():
    # window 4, span 3: 6 frames kept, never fewer than 4.
    assert retention.kept_frames(12, 0, 4, 3) == [6, 7, 8, 9, 10, 11]
    assert retention.freed_on_commit(9, 12, 0, 4, 3) == range(3, 6)
    assert retention.max_retained_frames(2, 4, 3) == 8


def test_exactly_full_then_one_more_chunk():
    sink, window, span = 3, 3, 1
    # exactly sink + window frames: nothing released yet
    assert retention.kept_frames(6, sink, window, span) == [0, 1, 2, 3, 4, 5]
    assert retention.freed_on_commit(3, 6, sink, window, span) == range(3, 3)
    # one more tick of 3 frames releases 3..5
    assert retention.freed_on_commit(6, 9, sink, window, span) == range(3, 6)
    assert retention.kept_frames(9, sink, window, span) == [0, 1, 2, 6, 7, 8]


def test_sink_still_filling_releases_nothing():
    assert retention.window_start(3, 9, 9, 1) == 9
    assert retention.freed_on_commit(0, 3, 9, 9, 1) == range(9, 9)
    assert retention.kept_frames(3, 9, 9, 1) == [0, 1, 2]


def test_window_zero_keeps_only_the_sink():
    assert retention.freed_on_commit(0, 3, 0, 0, 1) == range(0, 3)
    assert retention.kept_frames(6, 1, 0, 1) == [0]


def test_bad_arguments():
    with pytest.raises(ValueError):
        retention.window_start(1, 0, 1, 0)
    with pytest.raises(ValueError):
        retention.freed_on_commit(5, 4, 0, 1, 1)


@pytest.mark.parametrize("sink,window,span,tick,ppf", [
    (s, w, c, t, p)
    for s, w, c, t, p in itertools.product([0, 1, 3], [0, 1, 2, 4, 5], [1, 2, 3], [1, 2], [1, 2])
])
def test_block_table_follows_retention(sink, window, span, tick, ppf):
    """The table's inlined commit arithmetic equals the pure functions, tick by tick."""
    frames = tick * span
    table = BlockTable(sink, window, span, ppf)
    owner = {}
    next_id = 1
    for step in range(8):
        n0 = table.num_frames
        blocks = list(range(next_id, next_id + frames * ppf))
        next_id += len(blocks)
        for i, blk in enumerate(blocks):
            owner[blk] = n0 + i // ppf
        table.begin(blocks, frames)
        released = table.commit()
        n1 = n0 + frames
        gone = retention.freed_on_commit(n0, n1, sink, window, span)
        assert sorted({owner[b] for b in released}) == list(gone)
        assert len(released) == len(gone) * ppf
        kept = retention.kept_frames(n1, sink, window, span)
        assert [owner[b] for b in table.held][::ppf] == kept
        assert len(table.held) <= ppf * retention.max_retained_frames(sink, window, span)
        positional = table.positional()
        assert len(positional) == n1 * ppf
        for page, blk in enumerate(positional):
            if page // ppf in kept:
                assert owner[blk] == page // ppf
            else:
                assert blk == 0
