import pytest
import torch

from kv.cache import PagedKVCache
from kv.geometry import KVGeometry
from kv.residency import Residency, ResidencyError

G = KVGeometry(num_layers=2, kv_heads=2, head_dim=4, tokens_per_frame=4, block_size=2,
               sink_frames=1, window_frames=2, dtype=torch.bfloat16, cross_tokens=3)
# one session after >= 3 ticks: 3 frames * 2 pages * 2 layers * 2 (K, V) * 2*2*4*2 bytes
# = 768 bytes of blocks, plus cross 2 layers * 2 * 3*2*4*2 = 192 bytes
SESSION_BYTES = 768 + 192


def make(device, host_budget, max_sessions=2, num_blocks=24):
    c = PagedKVCache(G, num_blocks, device, max_sessions=max_sessions)
    dropped = []
    r = Residency(c, host_budget_bytes=host_budget, on_drop=dropped.append)
    return c, r, dropped


def tick(c, r, ids, gen):
    r.ensure_resident(ids)
    batch = c.begin_batch(ids)
    for layer in range(G.num_layers):
        shape = (batch.size, 4, 2, 4)
        c.write(layer, batch, torch.randn(shape, generator=gen).to(c.device, G.dtype),
                torch.randn(shape, generator=gen).to(c.device, G.dtype))
    c.commit_batch(batch)


def populate_cross(c, sid, gen):
    for layer in range(G.num_layers):
        c.write_cross(sid, layer, torch.randn(3, 2, 4, generator=gen).to(c.device, G.dtype),
                      torch.randn(3, 2, 4, generator=gen).to(c.device, G.dtype))


def fill(c, r, sids, gen):
    """Open each session with its cross cache and tick it to a full window (3 ticks)."""
    for sid in sids:
        r.open(sid)
        populate_cross(c, sid, gen)
        for _ in range(3):
            tick(c, r, [sid], gen)


def snapshot(c, sid):
    """Every byte the session owns, in positional order, plus the table's null pattern."""
    s = c.session(sid)
    parts = []
    for b in s.branches:
        ids = torch.tensor(list(c.table(sid, b).held), dtype=torch.long, device=c.device)
        for layer in range(G.num_layers):
            parts.append(c.storage.k[layer].index_select(0, ids).cpu().view(torch.uint8))
            parts.append(c.storage.v[layer].index_select(0, ids).cpu().view(torch.uint8))
            slot = s.cross_slots[b]
            parts.append(c.storage.cross_k[layer][slot].cpu().view(torch.uint8))
            parts.append(c.storage.cross_v[layer][slot].cpu().view(torch.uint8))
    nulls = [blk == 0 for b in s.branches for blk in c.table(sid, b).positional()]
    return parts, nulls, c.committed_frames(sid)


def same(a, b):
    return (len(a[0]) == len(b[0]) and all(torch.equal(x, y) for x, y in zip(a[0], b[0]))
            and a[1:] == b[1:])


def test_lru_swap_out_and_bit_exact_swap_in(device):
    gen = torch.Generator().manual_seed(0)
    c, r, dropped = make(device, host_budget=10 * SESSION_BYTES)
    assert r.open("a") == [] and r.open("b") == []
    populate_cross(c, "a", gen)
    populate_cross(c, "b", gen)
    for _ in range(4):
        tick(c, r, ["a"], gen)
    tick(c, r, ["b"], gen)                    # b ticked last: a is the LRU
    before = snapshot(c, "a")
    assert r.open("c") == []                  # needs a slot: a goes to the host
    assert r.is_swapped("a") and not c.is_resident("a")
    assert r.metrics()["swap_out_bytes"] == SESSION_BYTES
    tick(c, r, ["c"], gen)
    tick(c, r, ["c"], gen)                    # c keeps the blocks a gave back busy
    assert r.ensure_resident(["a"]) == []     # a returns; b (LRU idle) leaves
    assert r.is_swapped("b") and c.is_resident("a")
    assert same(snapshot(c, "a"), before)
    assert c.has_cross("a")
    assert dropped == []
    m = r.metrics()
    assert (m["resident_sessions"], m["swapped_sessions"], m["swap_outs"], m["swap_ins"]) == (2, 1, 2, 1)
    assert m["swap_in_bytes"] == SESSION_BYTES
    assert m["host_bytes"] == 256 + 192       # b holds 1 frame: 2 pages * 2 layers * K, V * 32
    assert m["swap_out_seconds"] > 0 and m["swap_in_seconds"] > 0


def test_a_session_in_flight_or_in_the_batch_is_never_evicted():
    gen = torch.Generator().manual_seed(1)
    c, r, _ = make("cpu", host_budget=10 * SESSION_BYTES)
    r.open("a")
    r.open("b")
    tick(c, r, ["a"], gen)
    tick(c, r, ["b"], gen)
    c.begin_chunk("a")                        # a is the LRU but has a tick in flight
    r.open("c")
    assert r.is_swapped("b") and c.is_resident("a")
    with pytest.raises(ResidencyError):
        r.ensure_resident(["b", "c"])         # only a could go, and it is in flight
    assert c.is_resident("a") and c.is_resident("c") and r.is_swapped("b")


def test_host_budget_full_drops_the_oldest_swapped_session():
    gen = torch.Generator().manual_seed(2)
    c, r, dropped = make("cpu", host_budget=SESSION_BYTES)
    fill(c, r, "ab", gen)
    assert r.open("c") == []                  # a -> host (fills the budget)
    tick(c, r, ["c"], gen)
    assert r.open("d") == ["a"]               # b needs host room: a, oldest, is dropped
    assert dropped == ["a"]
    assert "a" not in c and r.is_swapped("b")
    m = r.metrics()
    assert (m["drops"], m["swapped_sessions"], m["host_bytes"]) == (1, 1, SESSION_BYTES)


def test_no_host_budget_drops_the_victim():
    gen = torch.Generator().manual_seed(3)
    c, r, dropped = make("cpu", host_budget=0)
    r.open("a")
    r.open("b")
    tick(c, r, ["a", "b"], gen)
    tick(c, r, ["b"], gen)
    assert r.open("c") == ["a"] and dropped == ["a"]
    assert r.lru_order() == ["b", "c"]
    assert r.metrics()["swap_outs"] == 0


def test_blocks_shortage_also_evicts():
    gen = torch.Generator().manual_seed(4)
    # 24 blocks: 22 usable; each session holds up to 6 and a tick needs 2 more
    c, r, _ = make("cpu", host_budget=10 * SESSION_BYTES, max_sessions=4)
    for sid in "abcd":
        r.open(sid)
    for _ in range(3):
        for sid in "abc":
            tick(c, r, [sid], gen)
    assert c.num_free_blocks == 22 - 18
    tick(c, r, ["d"], gen)                    # 2 needed, 4 free: nobody moves
    assert r.metrics()["swap_outs"] == 0
    r.ensure_resident(["d", "c"])             # 4 needed, 2 free: a (LRU) swaps out
    assert r.is_swapped("a") and c.num_free_blocks == 8


def test_close_and_reset_of_a_swapped_session():
    gen = torch.Generator().manual_seed(5)
    c, r, _ = make("cpu", host_budget=10 * SESSION_BYTES)
    r.open("a")
    r.open("b")
    populate_cross(c, "a", gen)
    tick(c, r, ["a"], gen)
    tick(c, r, ["b"], gen)
    r.open("c")
    assert r.is_swapped("a")
    r.reset("a", keep_cross=True)             # swaps a back in (b leaves), keeps its text cache
    assert c.is_resident("a") and c.has_cross("a") and c.committed_frames("a") == 0
    assert r.is_swapped("b")
    r.close("b")
    assert r.metrics()["host_bytes"] == 0 and "b" not in c
    r.close("b")                              # idempotent


def test_a_swapped_session_coming_back_is_never_dropped_for_the_room_it_leaves():
    # The host holds one session. c's tick sent a there; a's tick now needs b's slot, and b
    # needs host room that a is about to leave: the exchange drops no one (a was dropped, and
    # its own tick failed on the id, KeyError on the wire).
    gen = torch.Generator().manual_seed(6)
    c, r, dropped = make("cpu", host_budget=SESSION_BYTES)
    fill(c, r, "ab", gen)
    assert r.open("c") == [] and r.is_swapped("a")
    populate_cross(c, "c", gen)
    tick(c, r, ["c"], gen)
    assert r.ensure_resident(["a"]) == [] and dropped == []
    assert not r.is_swapped("a") and r.is_swapped("b") and r.host_bytes <= SESSION_BYTES
    tick(c, r, ["a"], gen)
    assert dropped == [] and r.metrics()["drops"] == 0


def test_admission_counts_every_session_at_its_most_whatever_it_holds_now():
    from kv.capacity import session_bytes

    need = session_bytes(G)
    c, r, _ = make("cpu", host_budget=need, max_sessions=2)
    # Nothing opened yet: two pending fill the slots, the host's room takes a third.
    assert r.refusal(pending=2) is None
    refused = r.refusal(pending=3)
    assert refused is not None and "(3 sessions held, 2 resident slots)" in refused
    # Sessions that ticked once hold little, but they will grow: still three at most.
    gen = torch.Generator().manual_seed(7)
    for sid in "abc":
        r.open(sid)
        tick(c, r, [sid], gen)
    assert r.is_swapped("a") and r.host_bytes < need
    assert r.refusal() is not None and r.refusal(pending=0).startswith("no room for a new session")
