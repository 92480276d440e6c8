"""The README's adapter flow, end to end on the CPU."""

import torch

from kv import KVGeometry, PagedKVCache, Residency, plan_capacity
from kv.paged_attention import paged_attention


def test_readme_flow():
    torch.manual_seed(0)
    g = KVGeometry(num_layers=2, kv_heads=3, head_dim=16, tokens_per_frame=8, block_size=8,
                   sink_frames=1, window_frames=3, dtype=torch.float32)
    plan = plan_capacity(g, available_bytes=1 << 20, fraction=1.0, requested_sessions=2,
                         ticks_in_flight=2)
    assert plan.capacity == 2
    cache = PagedKVCache.from_plan(g, plan, "cpu")
    released = []
    residency = Residency(cache, host_budget_bytes=1 << 20, on_drop=released.append)
    w = torch.randn(g.num_layers, 48, 3 * 48) * 0.1
    for sid in ("s1", "s2"):
        assert residency.open(sid) == []

    def tick(session_ids, x):
        residency.ensure_resident(session_ids)
        batch = cache.begin_batch(session_ids)
        assert batch is not None
        try:
            for layer in range(g.num_layers):
                q, k, v = (x @ w[layer]).view(batch.size, 8, 3, 3, 16).unbind(2)
                x = x + paged_attention(q, k, v, cache, layer, batch).reshape(batch.size, 8, 48)
            cache.commit_batch(batch)
        except Exception:
            cache.abort_batch(batch)
            raise
        return x

    for _ in range(6):
        x = tick(["s1", "s2"], torch.randn(2, 8, 48))
    assert x.shape == (2, 8, 48) and torch.isfinite(x).all()
    assert cache.committed_frames("s1") == 6
    assert [b == 0 for b in cache.table("s1").positional()] == [False, True, True, False, False, False]
    residency.open("s3")                      # capacity 2: the LRU idle session goes to the host
    assert residency.metrics()["swapped_sessions"] == 1 and released == []
    residency.close("s3")
    tick(["s1", "s2"], torch.randn(2, 8, 48))
    assert cache.committed_frames("s2") == 7
