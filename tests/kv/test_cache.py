import pytest
import torch

from kv.block_pool import NULL_BLOCK
from kv.cache import PagedKVCache
from kv.geometry import KVGeometry


def geometry(**kw):
    base = dict(num_layers=2, kv_heads=2, head_dim=4, tokens_per_frame=4, block_size=2,
                sink_frames=1, window_frames=2, frames_per_tick=1, dtype=torch.float32,
                cross_tokens=3)
    base.update(kw)
    return KVGeometry(**base)


def test_reserved_blocks_and_open():
    c = PagedKVCache(geometry(), 16, max_sessions=2, worker_blocks=3)
    assert c.pad_block == 1
    assert c.worker_blocks == (2, 3, 4)
    assert c.num_free_blocks == 11
    assert c.open("a") and c.open("b")
    assert not c.open("c")                 # all session slots taken: shortage, not an error
    with pytest.raises(ValueError):
        c.open("a")
    assert c.session("a").cross_slots == {"main": 0}
    assert c.session("b").cross_slots == {"main": 1}


def test_begin_commit_abort_chunk():
    c = PagedKVCache(geometry(), 16, max_sessions=2)
    c.open("a")
    slots = c.begin_chunk("a")
    assert slots.blocks == {"main": (2, 3)} and slots.start_frame == 0 and slots.frames == 1
    with pytest.raises(RuntimeError):
        c.begin_chunk("a")
    c.commit_chunk("a")
    for expect in ((4, 5), (6, 7)):
        assert c.begin_chunk("a").blocks["main"] == expect
        c.commit_chunk("a")
    assert c.table("a").positional() == [2, 3, 4, 5, 6, 7]
    s = c.begin_chunk("a")
    assert s.blocks["main"] == (8, 9) and s.start_frame == 3
    c.abort_chunk("a")                     # failed forward: scratch back, committed untouched
    assert c.table("a").positional() == [2, 3, 4, 5, 6, 7]
    assert c.pool.free_ids()[-2:] == [8, 9]
    c.begin_chunk("a")                     # reuses the free queue from the front
    c.commit_chunk("a")                    # frame 1 (blocks 4, 5) leaves the window
    assert c.table("a").positional() == [2, 3, 0, 0, 6, 7, 10, 11]
    assert c.pool.free_ids()[-2:] == [4, 5]


def test_begin_returns_none_and_changes_nothing():
    c = PagedKVCache(geometry(), 7, max_sessions=2)   # 5 allocatable blocks
    c.open("a")
    c.open("b")
    batch = c.begin_batch(["a", "b"])
    assert batch.size == 2
    c.commit_batch(batch)
    free_before = c.pool.free_ids()
    assert free_before == [6]
    assert c.begin_batch(["a", "b"]) is None
    assert c.begin_chunk("a") is None
    assert c.pool.free_ids() == free_before
    assert not c.in_flight("a") and not c.in_flight("b")


def test_branches_have_their_own_tables():
    g = geometry(branches=("positive", "negative"))
    c = PagedKVCache(g, 32, max_sessions=2)
    c.open("a")
    c.open("b", branches=("positive",))
    batch = c.begin_batch(["a", "b"])
    assert batch.rows == (("a", "positive"), ("a", "negative"), ("b", "positive"))
    assert batch.chunk_blocks.tolist() == [[2, 3], [4, 5], [6, 7]]
    assert batch.lengths.tolist() == [2, 2, 2]
    assert batch.cross_slots.tolist() == [0, 1, 2]
    c.commit_batch(batch)
    assert c.table("a", "negative").positional() == [4, 5]
    assert c.session("a").held_blocks() == [2, 3, 4, 5]


def test_batch_tables_are_fixed_width_and_null_padded():
    c = PagedKVCache(geometry(), 32, max_sessions=2)
    c.open("a")
    c.open("b")
    c.commit_batch(c.begin_batch(["a"]))
    batch = c.begin_batch(["a", "b"], pad_to=3)
    width = c.max_held_pages + 2
    assert width == 8
    assert batch.block_tables.tolist() == [
        [2, 3, 4, 5, 0, 0, 0, 0],
        [6, 7, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],          # pad row: writes and reads the pad block
    ]
    assert batch.lengths.tolist() == [4, 2, 2]
    assert batch.chunk_blocks.tolist() == [[4, 5], [6, 7], [1, 1]]
    assert batch.start_frames == (1, 0, 0)
    assert batch.session_ids == ("a", "b")
    assert batch.rows[2] == ("", "")
    c.commit_batch(batch)
    assert c.committed_frames("a") == 2 and c.committed_frames("b") == 1


@pytest.mark.parametrize("fast_path", [True, False])
def test_begin_batch_without_upload_leaves_the_index_on_the_host(device, fast_path):
    """upload=False: the same batch, its index a host tensor over ``host_index`` (the caller copies it)."""
    tables = []
    for upload in (True, False):
        c = PagedKVCache(geometry(), 32, device, max_sessions=2, fast_path=fast_path)
        c.open("a")
        c.open("b")
        c.commit_batch(c.begin_batch(["a"]))
        batch = c.begin_batch(["a", "b"], pad_to=3, upload=upload)
        assert batch.index.device.type == (device.type if upload else "cpu")   # cuda:0 vs the fixture's cuda
        assert batch.index.tolist() == batch.host_index.tolist()
        tables.append((batch.host_index.tolist(), batch.start_frames, batch.session_ids, batch.size))
        c.commit_batch(batch)
        assert c.committed_frames("a") == 2 and c.committed_frames("b") == 1
    assert tables[0] == tables[1]
    assert tables[0][0][:3] == [4, 2, 2] and tables[0][1:] == ((1, 0, 0), ("a", "b"), 3)


def test_write_puts_the_chunk_in_its_blocks(device):
    g = geometry()
    c = PagedKVCache(g, 16, device, max_sessions=2)
    c.open("a")
    c.open("b")
    batch = c.begin_batch(["a", "b"])
    k = torch.randn(2, 4, 2, 4, device=device)
    v = torch.randn(2, 4, 2, 4, device=device)
    c.write(1, batch, k, v)
    assert torch.equal(c.storage.k[1][2:4].reshape(4, 2, 4), k[0])
    assert torch.equal(c.storage.v[1][4:6].reshape(4, 2, 4), v[1])
    assert torch.count_nonzero(c.storage.k[0]) == 0
    assert torch.count_nonzero(c.storage.k[1][NULL_BLOCK]) == 0


def test_write_through_chunk_slots():
    c = PagedKVCache(geometry(), 16, max_sessions=1)
    c.open("a")
    slots = c.begin_chunk("a")
    k = torch.arange(32, dtype=torch.float32).view(1, 4, 2, 4)
    c.write(0, slots, k, -k)
    assert torch.equal(c.storage.k[0][2:4].reshape(1, 4, 2, 4), k)
    assert torch.equal(c.storage.v[0][2:4].reshape(1, 4, 2, 4), -k)


def test_cross_cache_populated_once_and_reset_keeps_or_clears():
    c = PagedKVCache(geometry(), 16, max_sessions=2)
    c.open("a")
    assert not c.has_cross("a")
    ck = torch.randn(2, 3, 2, 4)
    for layer in range(2):
        c.write_cross("a", layer, ck[layer], -ck[layer])
    assert c.has_cross("a")
    batch = c.begin_batch(["a"])
    k, v = c.cross_kv(1, batch)
    assert torch.equal(k[0], ck[1]) and torch.equal(v[0], -ck[1])
    c.reset("a", keep_cross=True)          # drops the in-flight chunk and all frames
    assert c.has_cross("a") and c.committed_frames("a") == 0 and not c.in_flight("a")
    assert c.num_free_blocks == 14
    c.reset("a")
    assert not c.has_cross("a")


def test_close_returns_everything():
    c = PagedKVCache(geometry(), 16, max_sessions=2)
    free = c.pool.free_ids()
    c.open("a")
    for _ in range(5):
        c.commit_batch(c.begin_batch(["a"]))
    c.begin_batch(["a"])
    c.close("a")
    assert sorted(c.pool.free_ids()) == sorted(free)
    assert c.num_resident == 0
    assert c.open("a")


def test_chunks_must_be_whole_spans():
    c = PagedKVCache(geometry(span_frames=2, frames_per_tick=2), 16, max_sessions=1)
    c.open("a")
    with pytest.raises(ValueError):
        c.begin_chunk("a", frames=1)
    assert c.begin_chunk("a", frames=4).frames == 4
