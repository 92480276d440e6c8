"""Paged attention against a dense reference built from what each session wrote."""

import warnings

import pytest
import torch

from kv import retention
from kv.cache import PagedKVCache
from kv.capacity import pool_blocks
from kv.geometry import KVGeometry
from kv.paged_attention import AttentionDispatch, paged_attention

warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")


def dense(q, k, v, scale):
    """q [Lq, Hq, D], k/v [S, Hkv, D] -> [Lq, Hq, D], in float64."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    p = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) * scale, dim=-1)
    return torch.einsum("hqk,khd->qhd", p, v)


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def drive(device, backend, dtype, *, branches=("main",), frames_per_tick=1, chunk=1, sink=1,
          window=2, tpf=256, ticks=(("a",), ("a", "b"), ("a", "b", "c"), ("b", "c"), ("a", "b", "c"),
                           ("a", "b", "c"), ("c",))):
    torch.manual_seed(0)
    hq, hkv, d = 4, 2, 16
    g = KVGeometry(num_layers=2, kv_heads=hkv, head_dim=d, tokens_per_frame=tpf, block_size=128,
                   sink_frames=sink, window_frames=window, chunk_frames=chunk,
                   frames_per_tick=frames_per_tick, dtype=dtype, branches=branches)
    c = PagedKVCache(g, pool_blocks(g, 3, 3), device, max_sessions=3, attention_backend=backend)
    for sid in "abc":
        c.open(sid)
    written = {}  # (sid, branch, layer) -> {frame: (k, v)}
    scale = d ** -0.5
    worst = 0.0
    for ids in ticks:
        batch = c.begin_batch(list(ids))
        lq = frames_per_tick * tpf
        for layer in range(2):
            q = torch.randn(batch.size, lq, hq, d, device=device, dtype=dtype)
            k = torch.randn(batch.size, lq, hkv, d, device=device, dtype=dtype)
            v = torch.randn(batch.size, lq, hkv, d, device=device, dtype=dtype)
            out = paged_attention(q, k, v, c, layer, batch)
            assert out.shape == q.shape and out.dtype == dtype
            for r, (sid, branch) in enumerate(batch.rows):
                start = batch.start_frames[r]
                frames = written.setdefault((sid, branch, layer), {})
                kept = retention.kept_frames(start, sink, window, chunk)
                ks = [frames[f][0] for f in kept] + [k[r]]
                vs = [frames[f][1] for f in kept] + [v[r]]
                ref = dense(q[r].cpu(), torch.cat(ks).cpu(), torch.cat(vs).cpu(), scale)
                worst = max(worst, rel_err(out[r].cpu(), ref))
                for i in range(frames_per_tick):
                    frames[start + i] = (k[r, i * tpf:(i + 1) * tpf], v[r, i * tpf:(i + 1) * tpf])
        c.commit_batch(batch)
    return worst, c


TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("backend", ["gather_sdpa", "flex"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_dense_reference(device, backend, dtype):
    worst, _ = drive(device, backend, dtype)
    assert worst < TOL[dtype]


@pytest.mark.parametrize("backend", ["gather_sdpa", "flex"])
def test_branches_and_multi_frame_chunks(device, backend):
    # CFG branches, 2-frame ticks, window 3 with chunk 2 (window rounds up to 4)
    worst, c = drive(device, backend, torch.float32, branches=("positive", "negative"),
                     frames_per_tick=2, chunk=2, sink=1, window=3, tpf=128,
                     ticks=(("a",), ("a", "b"), ("a", "b", "c"), ("a", "c"), ("a",)))
    assert worst < TOL[torch.float32]
    assert c.committed_frames("a") == 10


def test_auto_is_gather_on_cpu():
    worst, c = drive(torch.device("cpu"), "auto", torch.float32)
    assert worst < TOL[torch.float32]
    assert c.attention.choices == {}


def test_unknown_backend():
    with pytest.raises(ValueError):
        AttentionDispatch("nope")


def test_auto_tuner_measures_checks_and_keeps_a_choice():
    torch.manual_seed(0)
    g = KVGeometry(num_layers=1, kv_heads=2, head_dim=16, tokens_per_frame=128, block_size=128,
                   sink_frames=1, window_frames=1, dtype=torch.float32)
    c = PagedKVCache(g, pool_blocks(g, 2, 2), max_sessions=2)
    c.attention = AttentionDispatch("auto", warmup=0, reps=1, tune_on_cpu=True)
    for sid in "ab":
        c.open(sid)
    batch = c.begin_batch(["a", "b"])
    q = torch.randn(2, 128, 2, 16)
    k = torch.randn(2, 128, 2, 16)
    out = paged_attention(q, k, k, c, 0, batch)
    ref = paged_attention(q, None, None, c, 0, batch, backend="gather_sdpa")
    assert torch.allclose(out, ref, atol=1e-5)
    (key, choice), = c.attention.choices.items()
    assert key[0] == 2                                  # batch-size bucket
    times = choice["times_ms"]
    assert set(times) == {"gather_sdpa", "gather_flash", "gather_cudnn", "flex"}
    assert isinstance(times["gather_sdpa"], float)
    assert str(times["gather_cudnn"]).startswith("error")  # no cuDNN on the CPU
    assert choice["backend"] in {n for n, t in times.items() if isinstance(t, float)}
    paged_attention(q, None, None, c, 0, batch)         # second call: no new measurement
    assert len(c.attention.choices) == 1
