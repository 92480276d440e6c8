"""Two CFG branches plus model-owned state: LRU swap moves all of a session together, bit-exactly."""

import pytest
import torch

from kv.cache import PagedKVCache
from kv.geometry import KVGeometry
from kv.model_state import ModelState, TensorState
from kv.residency import Residency

BRANCHES = ("positive", "negative")
STATE_BYTES = 100  # 20 float32 + 20 int8
G = KVGeometry(num_layers=2, kv_heads=2, head_dim=4, tokens_per_frame=4, block_size=2,
               sink_frames=1, window_frames=2, dtype=torch.bfloat16, cross_tokens=3,
               branches=BRANCHES, model_state_bytes=STATE_BYTES)
# One branch after >= 3 ticks: 3 frames * 2 pages * 2 layers * 2 (K, V) * 2*2*4*2 bytes = 768,
# plus its cross cache 2 layers * 2 * 3*2*4*2 = 192; two branches and the state:
SESSION_BYTES = 2 * (768 + 192) + STATE_BYTES
assert SESSION_BYTES == 2020


def make(device, host_budget, max_sessions=2, num_blocks=40):
    c = PagedKVCache(G, num_blocks, device, max_sessions=max_sessions)
    dropped = []
    return c, Residency(c, host_budget_bytes=host_budget, on_drop=dropped.append), dropped


def new_state(device, gen):
    return TensorState([torch.randn(20, generator=gen).to(device),
                        torch.randint(-100, 100, (20,), generator=gen, dtype=torch.int8).to(device)])


def open_with_state(c, r, sid, gen):
    dropped = r.open(sid)
    r.attach_state(sid, new_state(c.device, gen))
    for layer in range(G.num_layers):
        for b in BRANCHES:
            c.write_cross(sid, layer, torch.randn(3, 2, 4, generator=gen).to(c.device, G.dtype),
                          torch.randn(3, 2, 4, generator=gen).to(c.device, G.dtype), branch=b)
    return dropped


def tick(c, r, ids, gen):
    r.ensure_resident(ids)
    batch = c.begin_batch(ids)
    assert batch.size == 2 * len(ids)      # one row per branch
    for layer in range(G.num_layers):
        shape = (batch.size, 4, 2, 4)      # each branch row gets its own values
        c.write(layer, batch, torch.randn(shape, generator=gen).to(c.device, G.dtype),
                torch.randn(shape, generator=gen).to(c.device, G.dtype))
    c.commit_batch(batch)


def snapshot(c, r, sid):
    """Both branches' held K/V and cross caches, the tables' null pattern, and the state."""
    s = c.session(sid)
    parts = []
    for b in s.branches:
        ids = torch.tensor(list(c.table(sid, b).held), dtype=torch.long, device=c.device)
        for layer in range(G.num_layers):
            for pool in (c.storage.k[layer], c.storage.v[layer]):
                parts.append(pool.index_select(0, ids).cpu())
            for cross in (c.storage.cross_k[layer], c.storage.cross_v[layer]):
                parts.append(cross[s.cross_slots[b]].cpu())
    parts += [t.cpu() for t in r.state(sid).tensors]
    nulls = [[blk == 0 for blk in c.table(sid, b).positional()] for b in s.branches]
    return parts, nulls, c.committed_frames(sid)


def same(a, b):
    return (len(a[0]) == len(b[0]) and all(torch.equal(x, y) for x, y in zip(a[0], b[0]))
            and a[1:] == b[1:])


def test_both_branches_and_the_state_swap_together_bit_exact(device):
    gen = torch.Generator().manual_seed(0)
    c, r, dropped = make(device, host_budget=10 * SESSION_BYTES)
    assert isinstance(TensorState([]), ModelState)
    assert open_with_state(c, r, "a", gen) == [] and open_with_state(c, r, "b", gen) == []
    for _ in range(4):
        tick(c, r, ["a"], gen)
    tick(c, r, ["b"], gen)                    # b ticked last: a is the LRU
    assert c.table("a", "positive").held != c.table("a", "negative").held
    before = snapshot(c, r, "a")
    assert r.metrics()["model_state_bytes"] == 2 * STATE_BYTES
    assert r.open("c") == []                  # needs a slot: a, both branches and its state, to the host
    assert r.is_swapped("a") and r.state("a").device.type == "cpu"
    if device.type == "cuda":
        assert all(t.is_pinned() for t in r.state("a").tensors)
    m = r.metrics()
    assert (m["swap_out_bytes"], m["host_bytes"]) == (SESSION_BYTES, SESSION_BYTES)
    tick(c, r, ["c"], gen)
    tick(c, r, ["c"], gen)
    assert r.ensure_resident(["a"]) == []     # a returns; b (LRU idle, with its state) leaves
    assert r.is_swapped("b") and c.is_resident("a")
    assert r.state("a").device.type == c.device.type and r.state("b").device.type == "cpu"
    assert same(snapshot(c, r, "a"), before)
    m = r.metrics()
    assert m["swap_in_bytes"] == SESSION_BYTES
    # b holds 1 frame per branch: 2 * (2 pages * 2 layers * K, V * 32 + cross 192) + state
    assert m["host_bytes"] == 2 * (256 + 192) + STATE_BYTES == 996
    assert dropped == []


def test_the_host_budget_counts_the_state():
    gen = torch.Generator().manual_seed(1)
    c, r, dropped = make("cpu", host_budget=SESSION_BYTES - 1)
    for sid in "ab":
        open_with_state(c, r, sid, gen)
        for _ in range(3):
            tick(c, r, [sid], gen)
    state_a = r.state("a")
    # a's KV alone (1920) would fit the host, with its state (2020) it does not: dropped
    assert r.open("c") == ["a"] and dropped == ["a"]
    assert "a" not in c and state_a.nbytes == 0 and r.state("a") is None
    assert r.metrics()["host_bytes"] == 0

    c, r, dropped = make("cpu", host_budget=SESSION_BYTES)
    for sid in "ab":
        open_with_state(c, r, sid, gen)
        for _ in range(3):
            tick(c, r, [sid], gen)
    assert r.open("c") == [] and r.is_swapped("a")
    assert r.metrics()["host_bytes"] == SESSION_BYTES


def test_attach_state_refuses_what_capacity_did_not_plan():
    gen = torch.Generator().manual_seed(2)
    c, r, _ = make("cpu", host_budget=10 * SESSION_BYTES)
    r.open("a")
    big = TensorState([torch.zeros(26)])      # 104 bytes > 100 declared
    with pytest.raises(ValueError, match="104 bytes exceeds the declared model_state_bytes 100"):
        r.attach_state("a", big)
    assert r.state("a") is None and big.nbytes == 104
    with pytest.raises(ValueError, match="not open"):
        r.attach_state("nobody", new_state("cpu", gen))
    first = new_state("cpu", gen)
    r.attach_state("a", first)
    r.attach_state("a", new_state("cpu", gen))  # replaces: the old one is freed
    assert first.nbytes == 0 and r.state("a").nbytes == STATE_BYTES


def test_close_frees_the_state_resident_or_swapped():
    gen = torch.Generator().manual_seed(3)
    c, r, _ = make("cpu", host_budget=10 * SESSION_BYTES)
    open_with_state(c, r, "a", gen)
    open_with_state(c, r, "b", gen)
    tick(c, r, ["a"], gen)
    tick(c, r, ["b"], gen)
    sa, sb = r.state("a"), r.state("b")
    r.open("c")
    assert r.is_swapped("a")
    r.close("a")                              # swapped: host bytes (KV + state) given back
    r.close("b")                              # resident
    assert sa.nbytes == 0 and sb.nbytes == 0
    m = r.metrics()
    assert (m["host_bytes"], m["model_state_bytes"], m["swapped_sessions"]) == (0, 0, 0)
    r.close("a")                              # idempotent
