"""kv.triton_paged: host-side choices and checks in process; the kernels under the Triton
interpreter in a subprocess (fp32 vs a float64 reference); bf16 + CUDA-graph replay on CUDA."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from kv.triton_paged import (  # noqa: E402
    TMA_TILES, Tiles, choose_splits, choose_tiles, paged_attention_triton, triton_available, use_tma)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
HELPER = os.path.join(HERE, "triton_paged_cases.py")
_spec = importlib.util.spec_from_file_location("triton_paged_cases", HELPER)
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)


def test_triton_available():
    assert triton_available()


def test_default_tiles():
    maze = choose_tiles(256, 64, 256)
    assert maze == Tiles(block_m=64, block_n=64, num_warps=4, num_stages=4)
    assert choose_tiles(4680, 128, 1560) == Tiles(128, 64, 8, 2)      # LingBot: last tile of a page masked
    assert [choose_tiles(lq, 16, 32).block_m for lq in (1, 16, 17, 40, 64, 65)] == [16, 16, 32, 64, 64, 64]
    assert [choose_tiles(lq, 128, 256).block_m for lq in (16, 65)] == [16, 128]
    assert [choose_tiles(256, 32, bs).block_n for bs in (256, 96, 32, 48, 24, 1560)] == [64, 32, 32, 16, 32, 64]


def test_split_heuristic_on_an_h200():
    # 2 query tiles x 3 heads per row, 17 pages x 4 KV tiles, 132 SMs (the docstring's table)
    assert [choose_splits(2, 3 * b, 68, 132) for b in (1, 32, 128)] == [17, 2, 1]
    # the maze's default 64-row tiles: 4 query tiles per row and head
    assert [choose_splits(4, 3 * b, 68, 132) for b in (1, 32, 128)] == [10, 1, 1]
    assert choose_splits(37, 40, 27 * 25, 132) == 1            # LingBot: 11 waves already
    assert choose_splits(2, 3, 68, 1) == 1                     # one "SM" (CPU): never split
    assert choose_splits(1, 1, 3, 132) == 1                    # too little work to pay for a combine
    assert choose_splits(1, 1, 12, 132) == 6                   # 2 tiles each + the combine beats 1 or 3
    assert choose_splits(1, 1, 1000, 132, max_splits=8) == 8


def test_tma_kernel_only_where_it_was_measured_and_can_run():
    maze = dict(capability=(9, 0), dtype=torch.bfloat16, head_dim=64, num_splits=1, block_size=256,
                block_n=TMA_TILES.block_n, table_width=17, pool_rows=4354 * 256, aligned=True)
    assert TMA_TILES == Tiles(64, 128, 4, 3)
    assert use_tma(**maze)
    assert use_tma(**{**maze, "capability": (10, 0), "dtype": torch.float16})
    for change in (dict(capability=(8, 0)), dict(capability=None), dict(dtype=torch.float32),
                   dict(head_dim=128), dict(num_splits=10), dict(block_size=1560), dict(table_width=65),
                   dict(pool_rows=2**31), dict(aligned=False)):
        assert not use_tma(**{**maze, **change}), change


def _inputs(R=2, Lq=8, Hq=2, Hkv=1, D=16, bs=16, W=2):
    q = torch.zeros(R, Lq, Hq, D)
    pool = torch.zeros(4, bs, Hkv, D)
    return q, pool, pool, torch.zeros(R, W, dtype=torch.int32), torch.ones(R, dtype=torch.int32)


@pytest.mark.parametrize("change, message", [
    (dict(D=48), "head_dim in"),
    (dict(Hq=3, Hkv=2), "multiple of KV heads"),
    (dict(block_m=48), "block_m must be a power of two"),
    (dict(block_n=8), "block_n must be a power of two"),
    (dict(bs=8, block_n=64), "over twice block_size"),
    (dict(tables=torch.int64), "must be int32"),
    (dict(v_dtype=torch.float16), "share a dtype"),
    (dict(), "needs CUDA tensors"),          # valid shapes, but CPU tensors without the interpreter
    (dict(tma=True, splits=2), "runs one split"),
    (dict(tma=True, bs=24, block_n=16), "a multiple of block_n"),
])
def test_refuses_what_it_cannot_run(change, message, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if change.get("tma"):  # past the CPU check (nothing is launched: the TMA checks refuse first)
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    shape = {k: v for k, v in change.items() if k in ("D", "Hq", "Hkv", "bs")}
    q, k, v, tables, lengths = _inputs(**shape)
    if "tables" in change:
        tables = tables.to(change["tables"])
    if "v_dtype" in change:
        v = v.to(change["v_dtype"])
    kw = {k: change[k] for k in ("block_m", "block_n", "tma") if k in change}
    if "splits" in change:
        kw["num_splits"] = change["splits"]
    with pytest.raises(ValueError, match=message):
        paged_attention_triton(q, k, v, tables, lengths, **kw)


@pytest.fixture(scope="module")
def interpreted():
    """Every case of triton_paged_cases.py, run once by the interpreter (a few seconds).

    For machines without a GPU (CI); where CUDA is present the compiled kernel is tested
    below instead (the GPU machines' triton 3.6 interpreter did not run these cases).
    """
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the compiled kernel is tested instead")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, HELPER], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(cases.CASES))
def test_interpreted_kernel_matches_dense_reference(interpreted, name):
    case, res = cases.CASES[name], interpreted[name]
    assert res["shape"] == [case["R"], case["Lq"], case["Hq"], case["D"]]
    assert res["dtype"] == "torch.float32"
    assert not res["nan"]                     # nothing past lengths[r], nor the null block, was read
    assert res["max_abs_err"] < 2e-6, res


def test_interpreted_maze_frame_path_equals_masked_sdpa(interpreted):
    res = interpreted["frame_graph"]
    assert res["shape"] == [2, 4, 2, 16, 16] and not res["nan"]
    assert res["pools_equal"]                 # the frame's own K/V written the same way
    assert res["max_abs_err"] < 2e-6, res


def test_imports_without_triton():
    """The server imports kv/ (and the maze frame path) where triton is absent."""
    code = ("import sys; sys.modules['triton'] = None\n"
            "from kv.triton_paged import triton_available\n"
            "from kv import paged_attention as pa\n"
            "import models.world.maze.frame_graph\n"
            "print(triton_available(), 'triton' in pa.CUDA_CANDIDATES, 'triton' in pa._IMPLS)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["False", "False", "True"]


# -- CUDA ----------------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _maze(R, seed=0, dtype=torch.bfloat16):
    """Maze geometry: 3 heads x 64, 256-token pages, 17 pages per row, scattered over a pool."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    W, bs = 17, 256
    nb = 2 + R * W
    k_pool = torch.randn(nb, bs, 3, 64, device="cuda", dtype=dtype, generator=g)
    v_pool = torch.randn(nb, bs, 3, 64, device="cuda", dtype=dtype, generator=g)
    tables = (torch.randperm(nb - 2, device="cuda", generator=g)[:R * W] + 2).view(R, W).int()
    lengths = torch.full((R,), W, dtype=torch.int32, device="cuda")
    n_short = len(range(0, R, 3))
    lengths[::3] = torch.arange(n_short, device="cuda", dtype=torch.int32) % W + 1   # 1, 2, .. W, 1, ..
    tables[torch.arange(W, device="cuda")[None, :] >= lengths[:, None]] = 0
    q = torch.randn(R, 3, 256, 64, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
    return q, k_pool, v_pool, tables, lengths


def _rel_err(out, q, k_pool, v_pool, tables, lengths):
    ref = cases.reference(q.float().cpu(), k_pool.float().cpu(), v_pool.float().cpu(), tables.cpu(),
                          lengths.cpu())
    return ((out.double().cpu() - ref).norm() / ref.norm()).item()


@cuda
@pytest.mark.parametrize("R", [1, 32])
@pytest.mark.parametrize("splits", [None, 1, 4])
def test_cuda_bf16_maze_geometry(R, splits):
    args = _maze(R)
    out = paged_attention_triton(*args, num_splits=splits)
    assert out.dtype == torch.bfloat16 and out.shape == (R, 256, 3, 64)
    assert _rel_err(out, *args) < 1e-2


@cuda
@pytest.mark.parametrize("R", [1, 32, 128])
def test_cuda_tma_kernel_matches_the_pointer_kernel(R):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the TMA kernel needs sm_90+")
    args = _maze(R)
    tma = paged_attention_triton(*args, tma=True)
    pointers = paged_attention_triton(*args, num_splits=1, tma=False)
    assert _rel_err(tma, *args) < 1e-2
    assert (tma.float() - pointers.float()).abs().max().item() < 2e-2


@cuda
def test_cuda_graph_capture_and_replay():
    q, k_pool, v_pool, tables, lengths = _maze(8)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        paged_attention_triton(q, k_pool, v_pool, tables, lengths)      # compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_attention_triton(q, k_pool, v_pool, tables, lengths)
    q2, _, _, tables2, lengths2 = _maze(8, seed=1)
    for qq, tt, ll in ((q, tables, lengths), (q2, tables2, lengths2)):   # new values, same buffers
        q.copy_(qq)
        tables.copy_(tt)
        lengths.copy_(ll)
        graph.replay()
        torch.cuda.synchronize()
        eager = paged_attention_triton(q, k_pool, v_pool, tables, lengths)
        assert torch.equal(out, eager)
        assert _rel_err(out, q, k_pool, v_pool, tables, lengths) < 1e-2
