"""A chunk that restarts its session's sequence (kept only at commit), a first chunk of one frame
then chunks of two, and attention over a batch's pages plus transient K/V the pool never holds:
the three things DreamZero's window needs from kv/."""

import pytest
import torch
import torch.nn.functional as F

from kv.cache import PagedKVCache
from kv.geometry import KVGeometry
from kv.residency import Residency

BRANCHES = ("conditional", "negative")
# DreamZero's walk at a small size: sink 1, then chunks of 2, restart when the window is full.
G = KVGeometry(num_layers=2, kv_heads=2, head_dim=4, tokens_per_frame=2, block_size=2,
               sink_frames=1, window_frames=4, frames_per_tick=2, dtype=torch.float32,
               branches=BRANCHES)


def make(fast_path=True, num_blocks=24):
    return PagedKVCache(G, num_blocks, "cpu", max_sessions=2, attention_backend="gather_sdpa",
                        fast_path=fast_path)


def tick(c, sid, frames, restart=False, commit=True):
    batch = c.begin_batch([sid], frames=frames, restart=restart)
    assert batch is not None
    (c.commit_batch if commit else c.abort_batch)(batch)
    return batch


def three_frames(c):
    """``c`` with session "s" open and holding 3 frames: a chunk of one, then one of two."""
    c.open("s")
    tick(c, "s", 1)
    tick(c, "s", 2)
    return c


@pytest.mark.parametrize("fast_path", [True, False])
def test_one_frame_then_two_frames_a_chunk(fast_path):
    c = make(fast_path)
    c.open("s")
    # Blocks 0 (null) and 1 (pad) are taken; one page a frame, one row a branch.
    b = c.begin_batch(["s"], frames=1)
    assert b.chunk_pages == 1 and b.num_pages == (1, 1) and b.block_tables.tolist() == [[2] + [0] * 5,
                                                                                        [3] + [0] * 5]
    c.commit_batch(b)
    b = c.begin_batch(["s"], frames=2)
    assert b.num_pages == (3, 3) and b.block_tables[:, :3].tolist() == [[2, 4, 5], [3, 6, 7]]
    c.commit_batch(b)
    assert c.committed_frames("s") == 3
    assert c.table("s", "conditional").held == [2, 4, 5] and c.table("s", "negative").held == [3, 6, 7]


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_restart_attends_its_chunk_alone_and_frees_the_old_pages_at_commit(fast_path):
    c = three_frames(make(fast_path))
    free_before = c.num_free_blocks
    b = c.begin_batch(["s"], frames=1, restart=True)
    # The old 3 pages a branch stay allocated while the restart is in flight.
    assert c.restarting("s") and c.num_free_blocks == free_before - 2
    assert b.num_pages == (1, 1) and b.block_tables[:, 0].tolist() == [8, 9]
    assert b.start_frames == (0, 0)
    c.commit_batch(b)
    assert not c.restarting("s") and c.committed_frames("s") == 1
    assert c.table("s", "conditional").held == [8] and c.table("s", "negative").held == [9]
    assert c.num_free_blocks == free_before + 6 - 2
    assert c.pool.num_free == 24 - 2 - 2      # null, pad and the two new pages


@pytest.mark.parametrize("fast_path", [True, False])
def test_an_aborted_restart_leaves_the_session_as_it_was(fast_path):
    c = three_frames(make(fast_path))
    held = {b: c.table("s", b).held for b in BRANCHES}
    free_before = c.num_free_blocks
    tick(c, "s", 1, restart=True, commit=False)
    assert not c.restarting("s") and c.committed_frames("s") == 3 and c.num_free_blocks == free_before
    assert {b: c.table("s", b).held for b in BRANCHES} == held
    b = c.begin_batch(["s"], frames=2)            # the next chunk continues after frame 2
    assert b.start_frames == (3, 3) and b.num_pages == (5, 5)
    c.abort_batch(b)


def test_close_and_reset_during_a_restart_free_every_page():
    c = make()
    total_free = c.num_free_blocks
    for end in ("close", "reset"):
        three_frames(c)
        c.begin_batch(["s"], frames=1, restart=True)
        if end == "close":
            c.close("s")
        else:
            c.reset("s")
            assert c.committed_frames("s") == 0
            c.close("s")
        assert c.num_free_blocks == total_free and not c.restarting("s")


def test_a_restarted_session_swaps_out_and_back_bit_exactly():
    c = PagedKVCache(G, 24, "cpu", max_sessions=1, attention_backend="gather_sdpa")
    r = Residency(c, host_budget_bytes=1 << 20)
    r.open("s")
    gen = torch.Generator().manual_seed(0)
    for frames, restart in ((1, False), (2, False), (1, True), (2, False)):
        b = c.begin_batch(["s"], frames=frames, restart=restart)
        for layer in range(G.num_layers):
            k = torch.randn(2, frames * 2, 2, 4, generator=gen)
            c.write(layer, b, k, -k)
        c.commit_batch(b)
    assert c.committed_frames("s") == 3

    def held():
        return [c.storage.k[layer][c.table("s", br).held].clone() for layer in range(2) for br in BRANCHES]
    before = held()
    assert r.open("t") == [] and r.is_swapped("s")   # one resident slot: s goes to the host
    r.ensure_resident(["s"])                          # and back, t to the host
    assert r.is_swapped("t") and c.committed_frames("s") == 3
    for x, y in zip(before, held()):
        assert torch.equal(x, y)


def test_transient_attention_is_sdpa_over_the_pages_then_the_extra_tokens():
    c = make()
    c.open("a")
    c.open("b")
    gen = torch.Generator().manual_seed(1)
    tick(c, "a", 1)                               # a holds 1 frame, b none: rows of 2 page counts
    b = c.begin_batch(["a", "b"], frames=2)
    R = 4                                         # (a, cond), (a, neg), (b, cond), (b, neg)
    q = torch.randn(R, 5, 2, 4, generator=gen)
    k_new, v_new = torch.randn(R, 4, 2, 4, generator=gen), torch.randn(R, 4, 2, 4, generator=gen)
    c.write(0, b, k_new, v_new)
    ke, ve = torch.randn(R, 3, 2, 4, generator=gen), torch.randn(R, 3, 2, 4, generator=gen)
    got = c.attend_with(q, 0, b, ke, ve)
    tables, lengths = b.block_tables.long(), b.lengths.tolist()
    for r in range(R):
        pages = tables[r, :lengths[r]]
        k = torch.cat([c.storage.k[0][pages].reshape(-1, 2, 4), ke[r]])
        v = torch.cat([c.storage.v[0][pages].reshape(-1, 2, 4), ve[r]])
        want = F.scaled_dot_product_attention(q[r].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
        torch.testing.assert_close(got[r], want.transpose(0, 1), rtol=0, atol=1e-6)
    # Nothing was written: the pool holds the chunk's K/V only.
    assert c.num_free_blocks == 24 - 2 - 2 - 8
    with pytest.raises(ValueError, match="extra K/V"):
        c.attend_with(q, 0, b, ke[:2], ve[:2])
    c.abort_batch(b)
