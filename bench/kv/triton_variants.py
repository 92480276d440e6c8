#!/usr/bin/env python3
"""Experiment: candidate variants of the Triton paged attention kernel vs contiguous SDPA (maze geometry).

    python3 bench/kv/triton_variants.py --out $OUT/kv_triton_variants.json          # H200, < 3 min
    TRITON_INTERPRET=1 python bench/kv/triton_variants.py --smoke --out /tmp/tv.json  # CPU, correctness only

Why: ``kv.triton_paged``'s pointer kernel reached 0.77x / 0.69x of contiguous cuDNN SDPA at
batch 32 / 128 (3 heads x 64, 256-token pages, 17 pages per row, 256 queries per row, bf16).
This script measured what might close the gap, each idea a separate row, apart from the
kernel the server ships; the winner (TMA + Q/O descriptors + table in registers + rotated
loop, 64 x 128 tiles, 3 stages) became ``_paged_fwd_tma`` there (kv_triton_variants*.json):

* ``current_*``: the shipped entry point (``paged_attention_triton``) with its default choices
  (since the TMA kernel landed: that kernel at batch >= 8 on sm_90), and its pointer kernel at
  other tile / warp / stage configurations (the baseline row is also timed at batch 1,
  where its split-KV must keep beating SDPA);
* ``v_*``: one experimental kernel (``_variant_fwd``, one split only) with constexpr
  switches, each variant a combination:

  ==============  ==============================================================================
  PRESCALE        q multiplied by ``scale * log2(e)`` once, so the loop does ``qk - m`` (no
                  per-element scale before max / exp2)
  TABLE_REGS      the row's page table loaded into registers once; each tile picks its page id
                  with a masked sum instead of a global load in the address chain
  PAGE_LOOP       pages outer, ``tl.static_range(TILES_PER_PAGE)`` inner: one page-id look-up
                  per page
  OVERLAP         QK^T of tile j+1 issued before the softmax of tile j (FA3's intra-warpgroup
                  overlap, written as a hand-rotated loop; the last tile's extra QK^T is a
                  repeat of the last tile, thrown away)
  LOAD            0: pointer loads (cp.async); 1: host-side TMA descriptors for K/V over the
                  pool viewed 2-D as ``[num_blocks * block_size, kv_heads * head_dim]``, a
                  ``[BLOCK_N, D]`` box at row ``block * block_size + off``, column ``hk * D``;
                  2: the same built in the kernel (``tl.make_tensor_descriptor``)
  QO_DESC         Q loaded / O stored through 4-D host descriptors over ``[R, Lq, H, D]``
  WS              ``tl.range(..., warp_specialize=True)`` (Hopper automatic warp specialization)
  ==============  ==============================================================================

Every variant's output is checked against an fp32 reference (short rows: a null-padded
table, as ``check_triton_paged.Case(short=True)``; and the full rows that are timed).
Times are medians of CUDA-graph replays (``bench_kv.graph_ms``), full rows, against
contiguous SDPA (``[R, H, S, D]``, default dispatch) on the same data;
``speed_vs_sdpa`` = sdpa_ms / variant_ms (goal >= 0.9). Warp-specialized variants run in a
child process with a timeout (a compiler bug there could hang the GPU); each variant's
exception is recorded, and the JSON is rewritten after every variant.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_kv  # noqa: E402  (the kv benches' timers)
import check_triton_paged as ctp  # noqa: E402  (Case, errors, environment)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kv.triton_paged import LOG2E, paged_attention_triton, triton_available  # noqa: E402

try:
    import triton
    import triton.language as tl
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:  # older triton: the TMA variants fail and say so
        TensorDescriptor = None
except ImportError:
    triton = tl = TensorDescriptor = None

SMOKE_MAZE = dict(H=3, D=16, bs=64, W=3, Lq=40)   # tiles / 4 in smoke: 64 -> 16 keys, 4 tiles a page
REL_OK = 2e-2          # bf16 on the GPU (check_triton_paged's bar)
SMOKE_REL_OK = 1e-4    # fp32 "ieee" dots under the interpreter
RISKY_TIMEOUT_S = 100  # a warp-specialized child process gets this long


def log(msg: str) -> None:
    print(f"[variants {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the experimental kernel -----------------------------------------------------------------------

def _jit(fn):
    return fn if triton is None else triton.jit(fn)


@_jit
def _page_block(table, tbl, offs_w, page, TABLE_REGS: tl.constexpr):
    """Page id of the row's ``page``-th page: from registers (TABLE_REGS) or one global load."""
    if TABLE_REGS:
        b = tl.sum(tl.where(offs_w == page, tbl, 0), axis=0)
    else:
        b = tl.load(table + page)
    return b.to(tl.int64)


@_jit
def _load_k(K, k_tile, block, off, col, stride_kb, stride_kt,
            BLOCK_SIZE: tl.constexpr, LOAD: tl.constexpr):
    if LOAD == 0:
        k = tl.load(k_tile + block * stride_kb + off * stride_kt)
    else:
        k = K.load([(block * BLOCK_SIZE + off).to(tl.int32), col])
    return k


@_jit
def _update(qk, v, m_i, l_i, acc, qk_scale, PRESCALE: tl.constexpr, PRECISION: tl.constexpr):
    """One online-softmax step (base 2) over a tile of scores; returns (m, l, acc)."""
    if PRESCALE:  # q already carries scale * log2(e)
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        qk -= m_new[:, None]
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_new[:, None]
    p = tl.math.exp2(qk)
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
    return m_new, l_i, acc


@_jit
def _tile(q, K, V, k_tile, v_tile, table, tbl, offs_w, j, col, m_i, l_i, acc, qk_scale,
          stride_kb, stride_kt, stride_vb, stride_vt,
          BLOCK_SIZE: tl.constexpr, TILES_PER_PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
          TABLE_REGS: tl.constexpr, PRESCALE: tl.constexpr, LOAD: tl.constexpr, PRECISION: tl.constexpr):
    """Flat-loop body: tile ``j`` of the row (page ``j // TILES_PER_PAGE``)."""
    page = j // TILES_PER_PAGE
    off = (j - page * TILES_PER_PAGE) * BLOCK_N
    block = _page_block(table, tbl, offs_w, page, TABLE_REGS)
    k = _load_k(K, k_tile, block, off, col, stride_kb, stride_kt, BLOCK_SIZE, LOAD)
    v = _load_k(V, v_tile, block, off, col, stride_vb, stride_vt, BLOCK_SIZE, LOAD)
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    return _update(qk, v, m_i, l_i, acc, qk_scale, PRESCALE, PRECISION)


@_jit
def _variant_fwd(Q, K, V, Out, Tables, Lengths, qk_scale, Lq, W, n_kv_rows,
                 stride_qr, stride_qm, stride_qh,
                 stride_kb, stride_kt, stride_kh,
                 stride_vb, stride_vt, stride_vh,
                 stride_tr,
                 stride_or, stride_om, stride_oh,
                 HQ: tl.constexpr, GROUP: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr, TILES_PER_PAGE: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, W_PAD: tl.constexpr,
                 PRESCALE: tl.constexpr, TABLE_REGS: tl.constexpr, PAGE_LOOP: tl.constexpr,
                 OVERLAP: tl.constexpr, LOAD: tl.constexpr, QO_DESC: tl.constexpr, WS: tl.constexpr,
                 PRECISION: tl.constexpr):
    # Program (m, r*Hq + h): query tile m of row r, head h, over all of the row's keys
    # (one split; block_size % BLOCK_N == 0, so no key masking).
    pid_m = tl.program_id(0)
    pid_rh = tl.program_id(1)
    r = (pid_rh // HQ).to(tl.int64)
    h = pid_rh % HQ
    hk = h // GROUP
    n_pages = tl.minimum(tl.load(Lengths + r), W)
    total = n_pages * TILES_PER_PAGE

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    m_valid = offs_m < Lq
    if QO_DESC:  # 4-D box [1, BLOCK_M, 1, D]; rows past Lq read as zeros
        q = Q.load([r.to(tl.int32), pid_m * BLOCK_M, h, 0]).reshape([BLOCK_M, D])
    else:
        q = tl.load(Q + r * stride_qr + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                    mask=m_valid[:, None], other=0.0)
    in_dtype = q.dtype
    if PRESCALE:
        q = (q.to(tl.float32) * qk_scale).to(in_dtype)

    table = Tables + r * stride_tr
    offs_w = tl.arange(0, W_PAD)
    if TABLE_REGS:
        tbl = tl.load(table + offs_w, mask=offs_w < n_pages, other=0)
    else:
        tbl = offs_w  # unused
    col = (hk * D).to(tl.int32)
    if LOAD == 0:
        k_tile = K + hk * stride_kh + offs_n[:, None] * stride_kt + offs_d[None, :]
        v_tile = V + hk * stride_vh + offs_n[:, None] * stride_vt + offs_d[None, :]
        kd = K
        vd = V
    else:
        k_tile = 0  # unused
        v_tile = 0
        if LOAD == 2:
            kd = tl.make_tensor_descriptor(K, shape=[n_kv_rows, HKV * D], strides=[HKV * D, 1],
                                           block_shape=[BLOCK_N, D])
            vd = tl.make_tensor_descriptor(V, shape=[n_kv_rows, HKV * D], strides=[HKV * D, 1],
                                           block_shape=[BLOCK_N, D])
        else:
            kd = K
            vd = V

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    if PAGE_LOOP:
        for page in range(0, n_pages):
            block = _page_block(table, tbl, offs_w, page, TABLE_REGS)
            for t in tl.static_range(TILES_PER_PAGE):
                k = _load_k(kd, k_tile, block, t * BLOCK_N, col, stride_kb, stride_kt, BLOCK_SIZE, LOAD)
                v = _load_k(vd, v_tile, block, t * BLOCK_N, col, stride_vb, stride_vt, BLOCK_SIZE, LOAD)
                qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
                m_i, l_i, acc = _update(qk, v, m_i, l_i, acc, qk_scale, PRESCALE, PRECISION)
    elif OVERLAP:
        # Rotated loop: S_{j+1} = Q K_{j+1}^T is issued before softmax(S_j) and P_j V_j, so the
        # tensor cores work while the softmax runs. total >= 1 (lengths >= 1).
        block = _page_block(table, tbl, offs_w, 0, TABLE_REGS)
        k = _load_k(kd, k_tile, block, 0, col, stride_kb, stride_kt, BLOCK_SIZE, LOAD)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        for j in range(0, total):
            page = j // TILES_PER_PAGE
            off = (j - page * TILES_PER_PAGE) * BLOCK_N
            block = _page_block(table, tbl, offs_w, page, TABLE_REGS)
            v = _load_k(vd, v_tile, block, off, col, stride_vb, stride_vt, BLOCK_SIZE, LOAD)
            jn = tl.minimum(j + 1, total - 1)
            page_n = jn // TILES_PER_PAGE
            off_n = (jn - page_n * TILES_PER_PAGE) * BLOCK_N
            block_n = _page_block(table, tbl, offs_w, page_n, TABLE_REGS)
            k = _load_k(kd, k_tile, block_n, off_n, col, stride_kb, stride_kt, BLOCK_SIZE, LOAD)
            qk_next = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            m_i, l_i, acc = _update(qk, v, m_i, l_i, acc, qk_scale, PRESCALE, PRECISION)
            qk = qk_next
    elif WS:
        for j in tl.range(0, total, warp_specialize=True):
            m_i, l_i, acc = _tile(q, kd, vd, k_tile, v_tile, table, tbl, offs_w, j, col, m_i, l_i, acc,
                                  qk_scale, stride_kb, stride_kt, stride_vb, stride_vt,
                                  BLOCK_SIZE, TILES_PER_PAGE, BLOCK_N, TABLE_REGS, PRESCALE, LOAD, PRECISION)
    else:
        for j in range(0, total):
            m_i, l_i, acc = _tile(q, kd, vd, k_tile, v_tile, table, tbl, offs_w, j, col, m_i, l_i, acc,
                                  qk_scale, stride_kb, stride_kt, stride_vb, stride_vt,
                                  BLOCK_SIZE, TILES_PER_PAGE, BLOCK_N, TABLE_REGS, PRESCALE, LOAD, PRECISION)

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = (acc / l_safe[:, None]).to(in_dtype)
    if QO_DESC:  # the box's rows past Lq are clipped by the TMA unit
        Out.store([r.to(tl.int32), pid_m * BLOCK_M, h, 0], out.reshape([1, BLOCK_M, 1, D]))
    else:
        tl.store(Out + r * stride_or + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
                 out, mask=m_valid[:, None])


# -- variants --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    """One row of the experiment: the shipped kernel with overrides, or ``_variant_fwd`` with switches."""
    name: str
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    shipped: bool = False      # kv.triton_paged.paged_attention_triton (default split count)
    default_tiles: bool = False  # shipped kernel with its own tile choice (the baseline)
    prescale: bool = False
    table_regs: bool = False
    page_loop: bool = False
    overlap: bool = False
    load: int = 0              # 0 pointers, 1 host TMA descriptors, 2 device TMA descriptors
    qo_desc: bool = False
    ws: bool = False
    note: str = ""

    @property
    def risky(self) -> bool:
        return self.ws


def _cur(bm, bn, w, s, note=""):
    return Variant(f"current_bm{bm}_bn{bn}_w{w}_s{s}", bm, bn, w, s, shipped=True, note=note)


def _var(name, bm=64, bn=64, w=4, s=4, **kw):
    return Variant(name, bm, bn, w, s, **kw)


# Ordered cheapest / safest first: the JSON keeps whatever finished if the run is cut short.
VARIANTS = [
    Variant("current_default", 64, 64, 4, 4, shipped=True, default_tiles=True,
            note="the shipped kernel and its choices (64x64, 4 warps, 4 stages; split-KV at batch 1)"),
    _cur(128, 64, 4, 3, "tutorial 06's usual Hopper config"),
    _cur(128, 64, 8, 3, "two warpgroups of 64 query rows"),
    _cur(128, 128, 8, 2),
    _cur(64, 128, 4, 3),
    _var("v_prescale", prescale=True, note="q * scale*log2e once; qk -= m"),
    _var("v_prescale_table_regs", prescale=True, table_regs=True),
    _var("v_prescale_page_loop", s=2, prescale=True, page_loop=True,
         note="pages x static_range(4): the outer iteration holds 4 tiles, so 2 stages"),
    _var("v_prescale_overlap", prescale=True, overlap=True),
    _var("v_prescale_overlap_bm128_w8_s3", bm=128, w=8, s=3, prescale=True, overlap=True),
    _var("v_tma", prescale=True, table_regs=True, load=1, note="host TensorDescriptor for K/V"),
    _var("v_tma_bm128_w8_s3", bm=128, w=8, s=3, prescale=True, table_regs=True, load=1),
    _var("v_tma_qo_overlap", prescale=True, table_regs=True, load=1, qo_desc=True, overlap=True),
    _var("v_tma_overlap_bm128_bn128_w8_s2", bm=128, bn=128, w=8, s=2, prescale=True, table_regs=True,
         load=1, overlap=True),
    _var("v_tma_device", prescale=True, table_regs=True, load=2, note="tl.make_tensor_descriptor"),
    # Second sweep (after the first H200 run: TMA + Q/O descriptors + overlap led at 1.14x / 0.87x).
    _var("v_tma_qo", prescale=True, table_regs=True, load=1, qo_desc=True),
    _var("v_tma_overlap", prescale=True, table_regs=True, load=1, overlap=True),
    _var("v_tma_qo_overlap_s2", s=2, prescale=True, table_regs=True, load=1, qo_desc=True, overlap=True),
    _var("v_tma_qo_overlap_s3", s=3, prescale=True, table_regs=True, load=1, qo_desc=True, overlap=True),
    _var("v_tma_qo_overlap_s5", s=5, prescale=True, table_regs=True, load=1, qo_desc=True, overlap=True),
    _var("v_tma_qo_overlap_bn128_s2", bn=128, s=2, prescale=True, table_regs=True, load=1, qo_desc=True,
         overlap=True),
    _var("v_tma_qo_overlap_bn128_s3", bn=128, s=3, prescale=True, table_regs=True, load=1, qo_desc=True,
         overlap=True),
    _var("v_tma_qo_overlap_bm128_w8_s3", bm=128, w=8, s=3, prescale=True, table_regs=True, load=1,
         qo_desc=True, overlap=True),
    _var("v_tma_qo_overlap_bm128_w8_s4", bm=128, w=8, s=4, prescale=True, table_regs=True, load=1,
         qo_desc=True, overlap=True),
    _var("v_tma_device_qo_overlap", prescale=True, table_regs=True, load=2, qo_desc=True, overlap=True),
    _var("v_tma_qo_overlap_w8", w=8, prescale=True, table_regs=True, load=1, qo_desc=True, overlap=True),
    _var("v_ws_bm128_w4_s3", bm=128, w=4, s=3, prescale=True, table_regs=True, load=2, ws=True,
         note="warp_specialize=True, device descriptors (as tutorial 06 does on Hopper)"),
    _var("v_ws_bm128_w8_s2", bm=128, w=8, s=2, prescale=True, table_regs=True, load=2, ws=True),
]


def _smoke_tiles(v: Variant) -> Variant:
    """The same structure at a quarter of the tile sizes (smoke pages are 64 keys)."""
    return dataclasses.replace(v, block_m=v.block_m // 4, block_n=v.block_n // 4)


def _alloc(size: int, alignment: int, stream) -> torch.Tensor:
    """Global scratch for device-side TMA descriptors (``triton.set_allocator``)."""
    return torch.empty(size, device="cuda", dtype=torch.int8)


def run_variant(v: Variant, q, k_pool, v_pool, tables, lengths) -> torch.Tensor:
    """One call of variant ``v``: ``[R, Lq, Hq, D]`` out. Shapes-only host logic (graph capturable)."""
    if v.shipped:
        if v.default_tiles:
            return paged_attention_triton(q, k_pool, v_pool, tables, lengths)
        return paged_attention_triton(q, k_pool, v_pool, tables, lengths, block_m=v.block_m,
                                      block_n=v.block_n, num_warps=v.num_warps, num_stages=v.num_stages,
                                      tma=False)   # the pointer kernel at these tiles
    R, Lq, Hq, D = q.shape
    nb, bs, Hkv, _ = k_pool.shape
    W = tables.shape[1]
    if bs % v.block_n:
        raise ValueError(f"_variant_fwd needs block_size % block_n == 0, got {bs} % {v.block_n}")
    if v.load and not (k_pool.is_contiguous() and v_pool.is_contiguous()):
        raise ValueError("TMA variants view the pools as 2-D: they must be contiguous")
    out = q.new_empty(R, Lq, Hq, D)
    kk, vv = k_pool, v_pool
    if v.load == 1:
        if TensorDescriptor is None:
            raise RuntimeError("triton.tools.tensor_descriptor is missing")
        kk, vv = (TensorDescriptor(p.view(nb * bs, Hkv * D), [nb * bs, Hkv * D], [Hkv * D, 1], [v.block_n, D])
                  for p in (k_pool, v_pool))
    qq, oo = q, out
    if v.qo_desc:
        qq = TensorDescriptor(q, list(q.shape), list(q.stride()), [1, v.block_m, 1, D])
        oo = TensorDescriptor(out, list(out.shape), list(out.stride()), [1, v.block_m, 1, D])
    scale = 1.0 / math.sqrt(D)
    _variant_fwd[(-(-Lq // v.block_m), R * Hq)](
        qq, kk, vv, oo, tables, lengths, scale * LOG2E, Lq, W, nb * bs,
        q.stride(0), q.stride(1), q.stride(2),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        tables.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        HQ=Hq, GROUP=Hq // Hkv, HKV=Hkv, D=D, BLOCK_SIZE=bs, TILES_PER_PAGE=bs // v.block_n,
        BLOCK_M=v.block_m, BLOCK_N=v.block_n, W_PAD=max(2, 1 << (W - 1).bit_length()),
        PRESCALE=v.prescale, TABLE_REGS=v.table_regs, PAGE_LOOP=v.page_loop, OVERLAP=v.overlap,
        LOAD=v.load, QO_DESC=v.qo_desc, WS=v.ws,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=v.num_warps, num_stages=v.num_stages)
    return out


# -- the run ---------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="32,128", help="batches every variant is timed at (full rows)")
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    ap.add_argument("--budget-s", type=float, default=170.0,
                    help="skip the variants left once this much time has passed")
    ap.add_argument("--no-isolate", action="store_true",
                    help="run warp-specialized variants in this process too (no child / timeout)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny fp32 shapes on CPU under TRITON_INTERPRET=1: every variant's correctness")
    args = ap.parse_args()
    t_start = time.perf_counter()
    variants = VARIANTS
    if args.only:
        names = set(args.only.split(","))
        unknown = names - {v.name for v in VARIANTS}
        if unknown:
            ap.error(f"unknown variants {sorted(unknown)}; known: {[v.name for v in VARIANTS]}")
        variants = [v for v in VARIANTS if v.name in names]

    ctp.DEVICE, ctp.DTYPE = ("cpu", torch.float32) if args.smoke else ("cuda", torch.bfloat16)
    geo = SMOKE_MAZE if args.smoke else ctp.MAZE
    batches = [1, 4] if args.smoke else [int(b) for b in args.batches.split(",")]
    device = torch.device(ctp.DEVICE)
    out = {"experiment": "kv triton paged attention variants vs contiguous SDPA (maze geometry)",
           "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
           "environment": ctp.environment() | {"cudnn": torch.backends.cudnn.version()}, "smoke": args.smoke, "geometry": geo,
           "dtype": str(ctp.DTYPE), "goal": "speed_vs_sdpa = sdpa_ms / variant_ms >= 0.9 at batch 32 and 128",
           "variants": {}, "sdpa": {}, "failures": {}}

    def save():
        out["elapsed_s"] = round(time.perf_counter() - t_start, 2)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2, default=str)

    usable = triton_available() and (
        torch.cuda.is_available() if not args.smoke else os.environ.get("TRITON_INTERPRET") == "1")
    if not usable:
        out["failures"]["setup"] = "needs triton and CUDA (--smoke: TRITON_INTERPRET=1 set before python starts)"
        save()
        log(out["failures"]["setup"])
        sys.exit(1)
    log(f"{out['environment']}")
    if not args.smoke:
        triton.set_allocator(_alloc)

    # Cases: short rows (correctness with null-padded tables) and full rows per timed batch.
    check_r = 4 if args.smoke else 32
    short = ctp.Case(geo, check_r, short=True, seed=1)
    short_ref = short.reference()
    full, full_ref, sdpa_fns = {}, {}, {}
    need_b1 = not args.smoke and any(v.default_tiles for v in variants)
    for R in ([1] if need_b1 else []) + batches:
        c = ctp.Case(geo, R, short=False)
        k, v = c.gathered(0, R)
        qh = c.q.transpose(1, 2).contiguous()
        full[R] = c
        full_ref[R] = F.scaled_dot_product_attention(qh.float(), k.float(), v.float()).transpose(1, 2)
        sdpa_fns[R] = lambda qh=qh, k=k, v=v: F.scaled_dot_product_attention(qh, k, v)
        row = {"rows": R, "pages_per_row": geo["W"]}
        if not args.smoke:
            row["graph_ms"] = bench_kv.graph_ms(sdpa_fns[R], device, bench_kv.time_ms)
            flop = 4 * R * geo["H"] * geo["Lq"] * geo["W"] * geo["bs"] * geo["D"]
            row["tflops"] = round(flop / row["graph_ms"] / 1e9, 1)
        row.update({"bf16_vs_fp32_ref": ctp.errors(sdpa_fns[R](), full_ref[R].transpose(1, 2))}
                   if not args.smoke else {})
        out["sdpa"][f"b{R}"] = row
        log(f"sdpa b{R}: {row}")
    save()

    def one(v: Variant) -> dict:
        vr = _smoke_tiles(v) if args.smoke else v
        res = {"config": {k: val for k, val in dataclasses.asdict(vr).items() if val not in (False, "")}}
        t0 = time.perf_counter()
        o = run_variant(vr, short.q, short.k_pool, short.v_pool, short.tables, short.lengths)
        if ctp.DEVICE == "cuda":
            torch.cuda.synchronize()
        res["first_call_s"] = round(time.perf_counter() - t0, 2)
        res["short_rows"] = ctp.errors(o, short_ref)
        timed = ([1] if v.default_tiles and not args.smoke else []) + batches
        for R in timed:
            c = full[R]
            fn = lambda c=c: run_variant(vr, c.q, c.k_pool, c.v_pool, c.tables, c.lengths)  # noqa: E731
            row = {"full_rows": ctp.errors(fn(), full_ref[R])}
            if not args.smoke:
                row["graph_ms"] = bench_kv.graph_ms(fn, device, bench_kv.time_ms)
                row["speed_vs_sdpa"] = round(out["sdpa"][f"b{R}"]["graph_ms"] / row["graph_ms"], 4)
            res[f"b{R}"] = row
        bar = SMOKE_REL_OK if args.smoke else REL_OK
        res["ok"] = all(e["finite"] and e["rel_err"] < bar for e in
                        [res["short_rows"]] + [res[f"b{R}"]["full_rows"] for R in timed])
        return res

    def in_child(v: Variant) -> dict:
        """Run ``v`` in a child process with a timeout; its JSON row, or the reason there is none."""
        child_out = os.path.abspath(args.out) + f".{v.name}.json"
        cmd = [sys.executable, os.path.abspath(__file__), "--only", v.name, "--no-isolate",
               "--batches", args.batches, "--out", child_out]
        try:
            p = subprocess.run(cmd, timeout=RISKY_TIMEOUT_S, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            return {"error": f"child process timed out after {RISKY_TIMEOUT_S} s (hang?)", "ok": False}
        try:
            with open(child_out) as f:
                child = json.load(f)
            os.remove(child_out)
        except (OSError, ValueError):
            return {"error": f"child rc {p.returncode}, no JSON; stderr tail: {p.stderr[-1500:]}", "ok": False}
        row = child["variants"].get(v.name, {"error": f"child rc {p.returncode}: {child.get('failures')}"})
        row["child_process"] = True
        return row

    for v in variants:
        if time.perf_counter() - t_start > args.budget_s:
            out["variants"][v.name] = {"skipped": f"--budget-s {args.budget_s} spent"}
            log(f"{v.name}: skipped (budget)")
            continue
        try:
            if v.risky and not args.smoke and not args.no_isolate:
                res = in_child(v)
            else:
                res = one(v)
        except Exception as exc:
            traceback.print_exc()
            res = {"error": f"{type(exc).__name__}: {exc}"[:2000], "ok": False}
        out["variants"][v.name] = res
        log(f"{v.name}: " + json.dumps({k: val for k, val in res.items() if k != "config"}, default=str)[:400])
        if ctp.DEVICE == "cuda":
            torch.cuda.empty_cache()
        save()

    out["summary"] = {name: {key: row[key].get("speed_vs_sdpa", row[key]["full_rows"]["rel_err"])
                             for key in row if key.startswith("b") and isinstance(row[key], dict)}
                      | {"ok": row.get("ok")} for name, row in out["variants"].items() if "error" not in row
                      and "skipped" not in row}
    out["errors"] = {name: row["error"] for name, row in out["variants"].items() if "error" in row}
    out["all_ok"] = all(row.get("ok") for row in out["variants"].values() if "skipped" not in row)
    save()
    print(json.dumps({"summary": out["summary"], "errors": out["errors"], "all_ok": out["all_ok"]}, indent=1))
    log(f"done in {time.perf_counter() - t_start:.1f} s -> {args.out}")
    if args.smoke and not out["all_ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
