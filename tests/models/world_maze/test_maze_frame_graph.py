"""The static-buffer frame path (what MazeWorld captures in a CUDA graph), run on CPU without capture."""

import numpy as np
import pytest
import torch

from kv import KVGeometry, PagedKVCache
from models.world.base import WorldTick
from models.world.maze.adapter import MazeWorld, PagedContext
from models.world.maze.frame_graph import StaticPagedContext, bucket_for, graph_buckets
from models.world.maze.model import MazeDiTConfig

TINY = MazeDiTConfig(dim=64, depth=2, heads=1)  # the config of conftest.py's `weights`


def test_buckets():
    assert graph_buckets(32) == (1, 2, 4, 8, 16, 32)
    assert graph_buckets(1) == (1,)
    assert graph_buckets(48) == (1, 2, 4, 8, 16, 32, 48)
    b = graph_buckets(128)
    assert [bucket_for(n, b) for n in (1, 2, 3, 5, 31, 33, 128, 129)] == [1, 2, 4, 8, 32, 64, 128, None]
    assert bucket_for(1, ()) is None


def _filled_cache() -> tuple[PagedKVCache, list[str]]:
    """Sessions holding 0, 2 and a full sink + window of frames (window 3), random K/V."""
    torch.manual_seed(0)
    g = KVGeometry(num_layers=2, kv_heads=2, head_dim=8, tokens_per_frame=16, block_size=16,
                   sink_frames=1, window_frames=3, frames_per_tick=1, dtype=torch.float32)
    cache = PagedKVCache(g, 64, "cpu", max_sessions=4, attention_backend="gather_sdpa")
    ids = ["empty", "two", "full"]
    for sid, frames in zip(ids, (0, 2, 6)):
        cache.open(sid)
        for _ in range(frames):
            b = cache.begin_batch([sid])
            for layer in range(2):
                cache.write(layer, b, torch.randn(1, 16, 2, 8), torch.randn(1, 16, 2, 8))
            cache.commit_batch(b)
    assert [len(cache.table(s).held) for s in ids] == [0, 2, 4]
    return cache, ids


def test_static_context_equals_paged_attention_with_pad_rows():
    cache, ids = _filled_cache()
    padded = cache.begin_batch(ids, pad_to=4)
    plain = cache.batch(ids)                       # the same in-flight pages, no pad row
    st = cache.storage
    static = StaticPagedContext(st.k, st.v, padded.index, 4)
    # key mask: pages held + the frame's own, per row (pad row: the pad block only)
    assert static.mask[:, 0, 0, ::16].int().tolist() == [
        [1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert static.chunk.tolist() == [padded.block_tables[r, n - 1].item()
                                     for r, n in enumerate(padded.num_pages)]
    assert static.chunk[3].item() == cache.pad_block
    eager = PagedContext(cache, plain)
    torch.manual_seed(1)
    for layer in range(2):
        q, k, v = (torch.randn(3, 2, 16, 8) for _ in range(3))    # model layout [R, H, n, D]
        want = eager.attend(layer, q, k, v)
        own = plain.chunk_blocks.reshape(-1)
        written = (st.k[layer][own].clone(), st.v[layer][own].clone())
        st.k[layer][own] = 0                       # the static path must write them itself
        st.v[layer][own] = 0
        pad = torch.randn(1, 2, 16, 8)
        got = static.attend(layer, torch.cat([q, pad]), torch.cat([k, pad]), torch.cat([v, pad]))
        assert torch.equal(st.k[layer][own], written[0]) and torch.equal(st.v[layer][own], written[1])
        assert torch.equal(st.k[layer][cache.pad_block], pad[0].transpose(0, 1))
        assert torch.allclose(got[:3], want, atol=1e-6, rtol=0), (got[:3] - want).abs().max()


def _tick(sid: str, ci: int, keys: str) -> WorldTick:
    return WorldTick(session_id=sid, request_id=f"{sid}-{ci}", chunk_index=ci, applied_event_ids=(ci,),
                     prompt=None, actions=(frozenset(keys),), seed=ord(sid[-1]))


@pytest.mark.parametrize("kv_from_last", [False, True])
def test_static_frame_path_matches_eager_adapter(weights, kv_from_last):
    """Same seed, same ticks: frames and kept K/V of the static path equal the eager path's
    (with the clean pass, and with the last denoising pass's K/V kept instead)."""
    # float32 on both: on a CPU with native bf16 each world would time its own number format
    # (cpu_dtype.py) and the two could pick differently.
    worlds = [MazeWorld(weights=weights, max_sessions=8, max_batch=8, cuda_graphs=flag, kv_from_last=kv_from_last,
                        dtype=torch.float32)
              for flag in (False, True)]
    assert [w.graph_buckets for w in worlds] == [(), (1, 2, 4, 8)]
    assert [w.describe()["static_frame_path"] for w in worlds] == [False, True]
    started: dict[str, int] = {}
    for step in range(7):
        sids = ["s0", "s1", "s2"][: 1 + step // 2]   # staggered: rows hold different page counts
        works = []
        for sid in sids:
            works.append(_tick(sid, started.get(sid, 0), "wjl"[step % 3]))
            started[sid] = started.get(sid, 0) + 1
        outs = []
        for w in worlds:
            chunks = w.run_batch(works)
            for c in chunks:
                w.end_tick(c.session_id, True)
            outs.append(np.stack([c.frames for c in chunks]))
        diff = np.abs(outs[0].astype(int) - outs[1])
        # The masked SDPA of the static path rounds differently; the kept K/V carry that into
        # later frames, where it can flip a pixel's rounding to uint8 (one level, rarely).
        assert diff.max() <= 1 and diff.mean() < 1e-3, (diff.max(), diff.mean())
    assert started == {"s0": 7, "s1": 5, "s2": 3}
    for sid in started:
        held = [w.cache.table(sid).held for w in worlds]
        assert held[0] == held[1]
        for layer in range(TINY.depth):
            a = worlds[0].cache.storage.k[layer][held[0]]
            b = worlds[1].cache.storage.k[layer][held[1]]
            assert torch.allclose(a, b, atol=1e-5, rtol=0), (a - b).abs().max()


def test_the_runner_sends_a_batch_s_inputs_in_one_copy(weights):
    """Before the frame's launch the runner makes two torch calls (each one a GIL hand-off while
    the loop sends): one copy of the whole input block and the output view; the noise is made
    inside the passes. The inputs land in the static views: frame indexes, seeds, actions, and
    kv's index (pad rows zero)."""
    from torch.overrides import TorchFunctionMode

    world = MazeWorld(weights=weights, max_sessions=8, max_batch=8, cuda_graphs=True)
    for ci in range(2):  # chunk 0 starts the worlds (eager); chunk 1 takes the static path
        chunks = world.run_batch([_tick(s, ci, "w") for s in ("s0", "s1", "s2")])
        for c in chunks:
            world.end_tick(c.session_id, True)
    runner = world._runners[4]
    batch = world.cache.begin_batch(["s0", "s1", "s2"], pad_to=4, upload=False)
    assert batch.index.device.type == "cpu"

    class Calls(TorchFunctionMode):
        names: list[str] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.names.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    runner._body = lambda: None  # the passes themselves are not what is counted
    acts = np.arange(24, dtype=np.float32).reshape(3, 8)
    with Calls() as calls:
        out = runner.run(batch, acts, np.array([2, 2, 2]), np.array([5, -1, 2**40]))
    assert [n for n in calls.names if n != "_set_grad_enabled"] == ["copy_", "__getitem__"]
    assert out.shape == (3, 64, 64, 3)
    assert runner.frames.tolist() == [2, 2, 2, 0]
    assert runner.seeds.tolist() == [5, -1, 2**40, 0]
    assert torch.equal(runner.actions[:3], torch.from_numpy(acts)) and not runner.actions[3].any()
    assert runner.index.tolist() == batch.host_index.tolist()
    world.cache.abort_batch(batch)
