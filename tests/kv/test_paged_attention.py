"""Paged attention against a dense reference built from what each session wrote."""

import warnings

import pytest
import torch

from kv import retention
from kv.cache import PagedKVCache
from kv.capacity import pool_blocks
from kv.geometry import KVGeometry
from kv import paged_attention as pa
from kv.paged_attention import AttentionDispatch, flex_backend, paged_attention, triton_backend
from kv.triton_paged import triton_available

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


def drive(device, backend, dtype, *, branches=("main",), frames_per_tick=1, span=1, sink=1,
          window=2, tpf=256, ticks=(("a",), ("a", "b"), ("a", "b", "c"), ("b", "c"), ("a", "b", "c"),
                           ("a", "b", "c"), ("c",))):
    torch.manual_seed(0)
    hq, hkv, d = 4, 2, 16
    g = KVGeometry(num_layers=2, kv_heads=hkv, head_dim=d, tokens_per_frame=tpf, block_size=128,
                   sink_frames=sink, window_frames=window, span_frames=span,
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
                kept = retention.kept_frames(start, sink, window, span)
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
    # CFG branches, 2-frame ticks, window 3 with span 2 (window rounds up to 4)
    worst, c = drive(device, backend, torch.float32, branches=("positive", "negative"),
                     frames_per_tick=2, span=2, sink=1, window=3, tpf=128,
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
    assert set(times) == {"gather_sdpa", "gather_flash", "gather_cudnn", "flex",
                          "flex:BLOCK_M=64,BLOCK_N=64,num_stages=3,num_warps=4"} | (
                              {"triton"} if triton_available() else set())
    assert isinstance(times["gather_sdpa"], float)
    assert str(times["gather_cudnn"]).startswith("error")  # no cuDNN on the CPU
    if triton_available():   # a clear refusal on CPU tensors (no interpreter in this process)
        assert times["triton"].startswith("error: ValueError: the triton paged kernel needs CUDA")
    assert choice["backend"] in {n for n, t in times.items() if isinstance(t, float)}
    paged_attention(q, None, None, c, 0, batch)         # second call: no new measurement
    assert len(c.attention.choices) == 1


# Triton kernel options do nothing on the CPU (eager flex), but the backend
# built from them must still be the same attention, and its name stable.
FLEX_OPTS = {"num_warps": 4, "BLOCK_N": 64, "BLOCK_M": 64, "num_stages": 3}


def test_flex_backend_names_and_registers_once():
    name = flex_backend(FLEX_OPTS)
    assert name == "flex:BLOCK_M=64,BLOCK_N=64,num_stages=3,num_warps=4"
    impl = pa._IMPLS[name]
    assert flex_backend(dict(reversed(list(FLEX_OPTS.items())))) == name
    assert pa._IMPLS[name] is impl
    assert flex_backend({}) == "flex"
    assert pa.is_flex(name) and pa.is_flex("flex") and not pa.is_flex("gather_flash")


def test_triton_backend_names_and_registers_once():
    name = triton_backend({"num_splits": 4, "block_m": 64})
    assert name == "triton:block_m=64,num_splits=4"
    impl = pa._IMPLS[name]
    assert triton_backend({"block_m": 64, "num_splits": 4}) == name and pa._IMPLS[name] is impl
    assert impl.keywords["options"] == {"block_m": 64, "num_splits": 4}
    assert triton_backend({}) == "triton"
    assert pa.is_triton(name) and pa.is_triton("triton") and not pa.is_triton("flex")
    with pytest.raises(ValueError, match="unknown triton options"):
        triton_backend({"BLOCK_M": 64})
    assert ("triton" in pa.CUDA_CANDIDATES) == triton_available()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flex_with_kernel_options_matches_dense_reference(device, dtype):
    worst, _ = drive(device, flex_backend(FLEX_OPTS), dtype)
    assert worst < TOL[dtype]


@pytest.mark.parametrize("backend", ["gather_flash", "gather_cudnn"])
def test_pinned_gather_backends_match_dense_reference(device, backend):
    # GQA here, so even on CUDA these take the SDPA-pinned fallback; the CPU has
    # a flash kernel but no cuDNN one.
    if device.type == "cpu" and backend == "gather_cudnn":
        with pytest.raises(RuntimeError):
            drive(device, backend, torch.float32)
        return
    worst, _ = drive(device, backend, torch.bfloat16)
    assert worst < TOL[torch.bfloat16]


def test_auto_candidates_are_configurable_and_checked():
    d = AttentionDispatch("auto", candidates=("gather_sdpa",))
    assert d.candidates == ("gather_sdpa",)
    with pytest.raises(ValueError):
        AttentionDispatch("auto", candidates=("gather_sdpa", "nope"))
    default = AttentionDispatch("auto")
    assert default.candidates == pa.CUDA_CANDIDATES + tuple(flex_backend(o) for o in pa.FLEX_CONFIGS)


def test_gather_plan_is_built_once_per_batch():
    # Every layer of a tick reuses the batch's plans: the second layer finds them.
    torch.manual_seed(0)
    g = KVGeometry(num_layers=2, kv_heads=2, head_dim=16, tokens_per_frame=128, block_size=128,
                   sink_frames=1, window_frames=1, dtype=torch.float32)
    c = PagedKVCache(g, pool_blocks(g, 2, 2), max_sessions=2, attention_backend="gather_sdpa")
    for sid in "ab":
        c.open(sid)
    batch = c.begin_batch(["a", "b"])
    q = torch.randn(2, 128, 2, 16)
    paged_attention(q, q, q, c, 0, batch)
    plan = batch.plans["gather"]
    paged_attention(q, q, q, c, 1, batch)
    assert batch.plans["gather"] is plan
    flex_out = paged_attention(q, None, None, c, 1, batch, backend="flex")
    bm = batch.plans[("flex", 128)]
    paged_attention(q, None, None, c, 0, batch, backend="flex")
    assert batch.plans[("flex", 128)] is bm
    ref = paged_attention(q, None, None, c, 1, batch, backend="gather_sdpa")
    assert torch.allclose(flex_out, ref, atol=1e-5)
