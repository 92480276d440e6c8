"""Paged flash-attention forward in Triton: reads K/V pages straight from the pool.

``paged_attention_triton(q, k_pool, v_pool, tables, lengths)`` is non-causal
attention of each row's queries over every key of the row's first
``lengths[r]`` pages, listed in ``tables[r]``. Nothing is gathered: each program
looks its pages up in the table and loads K/V tiles from wherever they lie.

Split-KV ("flash-decoding"). A row's key range is cut into ``num_splits``
contiguous, near-equal ranges of KV tiles; program ``(m, r*Hq + h, s)`` runs the
online softmax of query tile ``m`` of row ``r``, head ``h``, over range ``s``::

    pages of row r (lengths[r] = 3, 4 KV tiles of BLOCK_N per page, 3 splits)
    table  [ 7       | 2       | 9       | 0 0 0 ... ]   null-padded past lengths[r]
    tiles   0 1 2 3   4 5 6 7   8 9 10 11                 12 tiles
    split   0 0 0 0   1 1 1 1   2 2 2  2                  tiles [s*12//3, (s+1)*12//3)

With one split the program normalises and writes the output. With more, each
writes its unnormalised partial ``acc`` with its running max ``m`` and sum ``l``
(fp32, base 2) to a workspace, and a second kernel combines them::

    M = max_s m_s,   w_s = 2^(m_s - M),   out = sum_s w_s acc_s / sum_s w_s l_s

A split with no tiles (a short row) writes ``m = -inf``, ``l = 0`` and weighs
nothing. The split count and the tiles are chosen on the host from shapes only
(``choose_splits`` / ``choose_tiles``), never from tensor values, so a call
makes no device-to-host sync and allocates the same sizes every time: it can be
captured in a CUDA graph. There is no ``triton.autotune`` for the same reason.

Two forward kernels. ``_paged_fwd`` (above) loads tiles through pointers: it runs
anywhere Triton does, splits, and masks a page's overhanging last tile. With one
split on Hopper (sm_90+), ``_paged_fwd_tma`` does the same arithmetic faster, as
measured on the H200 for the maze geometry (bench/results/kv_triton_variants*.json):
K/V tiles come through the tensor-memory accelerator (a descriptor over the pool
seen as ``[num_blocks * block_size, Hkv * D]``; a page's tile is the box at row
``block * block_size + off``, column ``hk * D``), Q and O through 4-D descriptors,
the row's page table sits in registers, q is pre-scaled once, and the loop is
rotated so tile j+1's Q K^T is issued before tile j's softmax::

    prologue:   S_0 = Q K_0^T
    step j:     load V_j, K_{j+1};  S_{j+1} = Q K_{j+1}^T;  softmax(S_j), acc += P_j V_j

(the last step recomputes the last tile's S and drops it). ``use_tma`` says when.

Triton is optional: without it this module imports, ``triton_available()`` is
False and the kernels are never launched. With ``TRITON_INTERPRET=1`` set before
triton is imported, the kernels run on CPU tensors (how the tests check them).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:  # an older triton: the pointer kernel only
        TensorDescriptor = None
except ImportError:  # the server runs without triton; the kernels below are then plain functions
    triton = None
    TensorDescriptor = None

    class tl:  # noqa: N801 - just what the kernel signatures evaluate at import
        constexpr = None

LOG2E = 1.4426950408889634
HEAD_DIMS = (16, 32, 64, 128)
MAX_SPLITS = 128


def triton_available() -> bool:
    """True when triton imports (CUDA tensors are still needed unless interpreting)."""
    return triton is not None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _jit(fn):
    return fn if triton is None else triton.jit(fn)


# -- kernels ---------------------------------------------------------------------------------------

@_jit
def _paged_fwd(Q, K, V, Tables, Lengths, Out, WsAcc, WsM, WsL,
               qk_scale, Lq, W, split_stride,
               stride_qr, stride_qm, stride_qh,
               stride_kb, stride_kt, stride_kh,
               stride_vb, stride_vt, stride_vh,
               stride_tr,
               stride_or, stride_om, stride_oh,
               HQ: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
               BLOCK_SIZE: tl.constexpr, TILES_PER_PAGE: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               NUM_SPLITS: tl.constexpr, MASK_N: tl.constexpr, PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_rh = tl.program_id(1)
    pid_s = tl.program_id(2)
    r = (pid_rh // HQ).to(tl.int64)
    h = pid_rh % HQ
    hk = h // GROUP

    # This program's KV tiles: a near-equal share of the row's, in page order.
    n_pages = tl.minimum(tl.load(Lengths + r), W)
    total = n_pages * TILES_PER_PAGE
    lo = total * pid_s // NUM_SPLITS
    hi = total * (pid_s + 1) // NUM_SPLITS

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    m_valid = offs_m < Lq
    q = tl.load(Q + r * stride_qr + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=m_valid[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    table = Tables + r * stride_tr
    k_tile = K + hk * stride_kh + offs_n[:, None] * stride_kt + offs_d[None, :]
    v_tile = V + hk * stride_vh + offs_n[:, None] * stride_vt + offs_d[None, :]
    # One flat loop over tiles (not pages x tiles) so the pipeliner can prefetch
    # across page boundaries.
    for j in range(lo, hi):
        page = j // TILES_PER_PAGE
        off = (j - page * TILES_PER_PAGE) * BLOCK_N
        block = tl.load(table + page).to(tl.int64)
        if MASK_N:  # the page's last tile overhangs it: mask the keys past the page
            n_valid = (off + offs_n) < BLOCK_SIZE
            k = tl.load(k_tile + block * stride_kb + off * stride_kt, mask=n_valid[:, None], other=0.0)
            v = tl.load(v_tile + block * stride_vb + off * stride_vt, mask=n_valid[:, None], other=0.0)
        else:
            k = tl.load(k_tile + block * stride_kb + off * stride_kt)
            v = tl.load(v_tile + block * stride_vb + off * stride_vt)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if MASK_N:
            qk = tl.where(n_valid[None, :], qk, float("-inf"))
        # Base-2 online softmax: qk_scale = scale * log2(e), so exp2 gives exp(scale * qk).
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new

    if NUM_SPLITS == 1:
        l_safe = tl.where(l_i > 0, l_i, 1.0)  # only a row with no pages has l == 0: it gets zeros
        out = acc / l_safe[:, None]
        tl.store(Out + r * stride_or + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
                 out.to(Out.dtype.element_ty), mask=m_valid[:, None])
    else:
        # workspace [S, R*Hq, Lq] (+ [D]); split_stride = R*Hq*Lq, from the host so that it is 64-bit when large
        row = pid_s.to(tl.int64) * split_stride + pid_rh.to(tl.int64) * Lq + offs_m
        tl.store(WsM + row, m_i, mask=m_valid)
        tl.store(WsL + row, l_i, mask=m_valid)
        tl.store(WsAcc + row[:, None] * D + offs_d[None, :], acc, mask=m_valid[:, None])


@_jit
def _paged_combine(WsAcc, WsM, WsL, Out, Lq, split_stride,
                   stride_or, stride_om, stride_oh,
                   HQ: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                   NUM_SPLITS: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_rh = tl.program_id(1)
    r = (pid_rh // HQ).to(tl.int64)
    h = pid_rh % HQ
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)  # a slice of the head dim
    m_valid = offs_m < Lq
    base = pid_rh.to(tl.int64) * Lq + offs_m
    # Running int64 offsets, not s * split_stride: that product could pass 2**31.
    m_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row = base
    for s in range(NUM_SPLITS):
        m_max = tl.maximum(m_max, tl.load(WsM + row, mask=m_valid, other=float("-inf")))
        row += split_stride
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # all splits empty: every weight is 0
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    row = base
    for s in range(NUM_SPLITS):
        w = tl.exp2(tl.load(WsM + row, mask=m_valid, other=float("-inf")) - m_max)
        l_sum += w * tl.load(WsL + row, mask=m_valid, other=0.0)
        acc += w[:, None] * tl.load(WsAcc + row[:, None] * D + offs_d[None, :], mask=m_valid[:, None], other=0.0)
        row += split_stride
    l_sum = tl.where(l_sum > 0, l_sum, 1.0)
    tl.store(Out + r * stride_or + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
             (acc / l_sum[:, None]).to(Out.dtype.element_ty), mask=m_valid[:, None])


@_jit
def _page_of(tbl, offs_w, page):
    """The row's ``page``-th page id, picked from the table held in registers (no memory load)."""
    return tl.sum(tl.where(offs_w == page, tbl, 0), axis=0)


@_jit
def _paged_fwd_tma(Q, K, V, Out, Tables, Lengths, qk_scale, W, stride_tr,
                   HQ: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
                   BLOCK_SIZE: tl.constexpr, TILES_PER_PAGE: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, W_PAD: tl.constexpr,
                   PRECISION: tl.constexpr):
    # Program (m, r*Hq + h): query tile m of row r, head h, over all of the row's keys (one
    # split; block_size % BLOCK_N == 0, so no key is masked). Q, O: descriptors over
    # [R, Lq, Hq, D] with [1, BLOCK_M, 1, D] boxes (rows past Lq read as 0, stores clipped);
    # K, V: descriptors over [num_blocks * block_size, Hkv * D] with [BLOCK_N, D] boxes.
    pid_m = tl.program_id(0)
    pid_rh = tl.program_id(1)
    r = pid_rh // HQ
    h = pid_rh % HQ
    col = (h // GROUP) * D
    n_pages = tl.minimum(tl.load(Lengths + r), W)
    total = n_pages * TILES_PER_PAGE

    q = Q.load([r, pid_m * BLOCK_M, h, 0]).reshape([BLOCK_M, D])
    q = (q.to(tl.float32) * qk_scale).to(q.dtype)        # scores come out in base-2 units
    offs_w = tl.arange(0, W_PAD)
    tbl = tl.load(Tables + r.to(tl.int64) * stride_tr + offs_w, mask=offs_w < n_pages, other=0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    k = K.load([_page_of(tbl, offs_w, 0) * BLOCK_SIZE, col])
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    for j in range(0, total):
        page = j // TILES_PER_PAGE
        row = _page_of(tbl, offs_w, page) * BLOCK_SIZE + (j - page * TILES_PER_PAGE) * BLOCK_N
        v = V.load([row, col])
        jn = tl.minimum(j + 1, total - 1)
        page_n = jn // TILES_PER_PAGE
        k = K.load([_page_of(tbl, offs_w, page_n) * BLOCK_SIZE + (jn - page_n * TILES_PER_PAGE) * BLOCK_N, col])
        qk_next = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new
        qk = qk_next

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    Out.store([r, pid_m * BLOCK_M, h, 0], (acc / l_safe[:, None]).to(q.dtype).reshape([1, BLOCK_M, 1, D]))


# -- host side -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tiles:
    """One kernel configuration: query and key tile sizes, warps, pipeline stages."""
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


@functools.lru_cache(maxsize=256)
def choose_tiles(lq: int, head_dim: int, block_size: int) -> Tiles:
    """The default tiles for these shapes (a fixed table, no autotuning).

    ========================  ===========================================================
    ``block_m``               64 for ``head_dim`` <= 64, else 128; 16 / 32 / 64 for fewer
                              queries (``lq`` <= 16 / 32 / 64)
    ``block_n``               64 when it divides ``block_size``, else 32 or 16 when one does,
                              else 64 (or the page rounded up to a power of two, if smaller)
                              with the keys past the page masked in each page's last tile
    ``num_warps``             8 when ``block_m * head_dim`` >= 128 * 128, else 4
    ``num_stages``            4 for ``head_dim`` <= 64, else 2 (shared memory for K/V tiles)
    ========================  ===========================================================

    At head_dim 64 the H200 measured 64 x 64 tiles with 4 stages fastest at batch 1, 32
    and 128 of the maze geometry; the split count (``choose_splits``) is what fills the
    machine at small batches.
    """
    # Measured on the H200 (bench/results/kv_attention_tune.json): at head_dim 64,
    # 64-row query tiles with 4 stages beat 128 x 64 / 3 stages at every batch.
    block_m = 64 if head_dim <= 64 else 128
    for m in (16, 32, 64):
        if lq <= m:
            block_m = m
            break
    block_n = 64
    if block_size % 64:
        # a smaller tile that divides the page, else one masked tile per page's tail
        fallback = 64 if block_size > 64 else max(16, 1 << (block_size - 1).bit_length())
        block_n = next((n for n in (32, 16) if block_size % n == 0), fallback)
    num_warps = 8 if block_m * head_dim >= 128 * 128 else 4
    num_stages = 4 if head_dim <= 64 else 2
    return Tiles(block_m, block_n, num_warps, num_stages)


# The TMA kernel's tiles at head_dim 64, measured on the H200 for the maze geometry at batch
# 32 / 128 (bench/results/kv_triton_variants2.json): 64 x 128 with 3 stages was the only
# configuration at >= 0.9x of cuDNN at both (1.01x / 0.95x); 64 x 64 / 4 stages led at 32 alone.
TMA_TILES = Tiles(block_m=64, block_n=128, num_warps=4, num_stages=3)
TMA_HEAD_DIMS = (64,)       # measured there; other head dims keep the pointer kernel
TMA_MAX_PAGES = 64          # the row's table is held in registers


def use_tma(*, capability: tuple[int, int] | None, dtype: torch.dtype, head_dim: int, num_splits: int,
            block_size: int, block_n: int, table_width: int, pool_rows: int, aligned: bool) -> bool:
    """Whether ``_paged_fwd_tma`` runs this call (shapes and the device only, so graph-safe).

    ``capability``: the CUDA device's (major, minor), None off CUDA. ``aligned``: every
    tensor the descriptors cover starts on 16 bytes with 16-byte strides (the TMA rule).
    """
    return (TensorDescriptor is not None and capability is not None and capability[0] >= 9
            and dtype in (torch.float16, torch.bfloat16) and head_dim in TMA_HEAD_DIMS
            and num_splits == 1 and block_size % block_n == 0 and table_width <= TMA_MAX_PAGES
            and pool_rows < 2**31 and aligned)


def _tma_aligned(*tensors: torch.Tensor) -> bool:
    """16-byte aligned starts and strides, last dimension contiguous (what a TMA descriptor needs)."""
    for t in tensors:
        size = t.element_size()
        if t.data_ptr() % 16 or t.stride(-1) != 1 or any((st * size) % 16 for st in t.stride()[:-1]):
            return False
    return True


@functools.lru_cache(maxsize=1024)   # pure; called per layer, so the loop runs once per shape
def choose_splits(query_tiles: int, rows_heads: int, kv_tiles: int, sms: int,
                  max_splits: int = MAX_SPLITS) -> int:
    """Split count for ``query_tiles * rows_heads`` programs over ``kv_tiles`` KV tiles each.

    A cost model in units of "one KV tile of one program": with ``s`` splits there
    are ``P = query_tiles * rows_heads * s`` programs in ``ceil(P / sms)`` waves,
    each program doing ``ceil(kv_tiles / s)`` tiles plus ~2 tiles' worth of
    prologue / epilogue (load Q, write the partials); more than one split adds the
    combine kernel, ~2 + a quarter tile per partial it reads. The smallest ``s``
    of least cost wins. From 4 waves at ``s = 1`` on there is no split: programs
    do not run in lockstep, so the tail of the last wave matters little. Maze
    geometry on 132 SMs (its default 64 x 64 tiles, 17 pages of 4 tiles)::

        batch   programs at s=1   waves   chosen s   programs
        1       12                0.09    10         120
        32      384               2.9     1          384
        128     1536              11.6    1          1536
    """
    base = max(1, query_tiles * rows_heads)
    if base >= 4 * sms:
        return 1
    best, best_cost = 1, math.inf
    for s in range(1, max(1, min(kv_tiles, max_splits)) + 1):
        waves = -(-base * s // sms)
        cost = waves * (-(-kv_tiles // s) + 2)
        if s > 1:
            cost += -(-base // sms) * s / 4 + 2
        if cost < best_cost:
            best, best_cost = s, cost
    return best


_SM_COUNT: dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (cached); 1 elsewhere (no splitting)."""
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    n = _SM_COUNT.get(index)
    if n is None:
        n = _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return n


def _check(q, k_pool, v_pool, tables, lengths, tiles: Tiles) -> None:
    if q.dim() != 4 or k_pool.dim() != 4 or v_pool.shape != k_pool.shape:
        raise ValueError(f"expected q [R, Lq, Hq, D] and K/V pools [blocks, block_size, Hkv, D] of one "
                         f"shape, got {tuple(q.shape)}, {tuple(k_pool.shape)}, {tuple(v_pool.shape)}")
    R, _, Hq, D = q.shape
    Hkv = k_pool.shape[2]
    if k_pool.shape[3] != D:
        raise ValueError(f"head_dim of q ({D}) and the pool ({k_pool.shape[3]}) differ")
    if D not in HEAD_DIMS:
        raise ValueError(f"the triton paged kernel supports head_dim in {HEAD_DIMS}, got {D}")
    if Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of KV heads ({Hkv})")
    if q.dtype != k_pool.dtype or v_pool.dtype != k_pool.dtype:
        raise ValueError(f"q, K and V must share a dtype, got {q.dtype}, {k_pool.dtype}, {v_pool.dtype}")
    if tables.dim() != 2 or tables.shape[0] != R or tuple(lengths.shape) != (R,):
        raise ValueError(f"expected tables [R={R}, W] and lengths [R={R}], got "
                         f"{tuple(tables.shape)} and {tuple(lengths.shape)}")
    if tables.dtype != torch.int32 or lengths.dtype != torch.int32:
        raise ValueError(f"tables and lengths must be int32, got {tables.dtype} and {lengths.dtype}")
    if tables.stride(1) != 1 or k_pool.stride(3) != 1 or v_pool.stride(3) != 1:
        raise ValueError("tables rows and the pools' head_dim must be contiguous")
    for name, n in (("block_m", tiles.block_m), ("block_n", tiles.block_n)):
        if n < 16 or n & (n - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {n}")
    if k_pool.shape[1] % tiles.block_n and k_pool.shape[1] < tiles.block_n // 2:
        # Allowed (the tail is masked), but more than half of every tile would be padding.
        raise ValueError(f"block_n={tiles.block_n} is over twice block_size={k_pool.shape[1]}; "
                         f"use block_n <= block_size")
    devices = {t.device for t in (q, k_pool, v_pool, tables, lengths)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")
    if q.device.type != "cuda" and not _interpreting():
        raise ValueError("the triton paged kernel needs CUDA tensors (or TRITON_INTERPRET=1 on CPU)")
    if triton is None:
        raise RuntimeError("triton is not installed")


def paged_attention_triton(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                           tables: torch.Tensor, lengths: torch.Tensor, *, scale: float | None = None,
                           num_splits: int | None = None, block_m: int | None = None,
                           block_n: int | None = None, num_warps: int | None = None,
                           num_stages: int | None = None, tma: bool | None = None) -> torch.Tensor:
    """Non-causal attention of each row's queries over its first ``lengths[r]`` pages, from the pool.

    ``q``: ``[R, Lq, Hq, D]`` (head_dim contiguous, other strides free);
    ``k_pool`` / ``v_pool``: ``[num_blocks, block_size, Hkv, D]``; ``tables``: ``[R, W]``
    int32 page ids in page order (entries at or past ``lengths[r]`` are never read);
    ``lengths``: ``[R]`` int32, each >= 1 (values above ``W`` count as ``W``).
    Returns ``[R, Lq, Hq, D]`` in ``q``'s dtype (fp32 accumulation).

    ``num_splits`` (default: ``choose_splits``) and the tile keywords (default:
    ``choose_tiles``, or ``TMA_TILES`` on the TMA kernel) override the host's choices;
    all depend on shapes only, so the call is CUDA-graph capturable. ``tma``: None
    picks the TMA kernel where ``use_tma`` allows it; True forces it (one split, pages
    a multiple of ``block_n``, contiguous pools: how the interpreter tests run it);
    False keeps the pointer kernel.
    """
    R, Lq, Hq, D = q.shape
    _, bs, Hkv, _ = k_pool.shape
    W = tables.shape[1] if tables.dim() == 2 else 0
    t = choose_tiles(Lq, D, bs)
    tiles = Tiles(block_m or t.block_m, block_n or t.block_n, num_warps or t.num_warps,
                  num_stages or t.num_stages)
    _check(q, k_pool, v_pool, tables, lengths, tiles)
    if q.stride(3) != 1:
        q = q.contiguous()
    if lengths.stride(0) != 1:
        lengths = lengths.contiguous()
    out = q.new_empty(R, Lq, Hq, D)
    if R == 0 or Lq == 0 or W == 0:
        return out.zero_()
    tiles_per_page = -(-bs // tiles.block_n)
    q_tiles = -(-Lq // tiles.block_m)
    if num_splits is None and tma:
        num_splits = 1
    if num_splits is None:
        num_splits = choose_splits(q_tiles, R * Hq, W * tiles_per_page, sm_count(q.device))
    num_splits = max(1, min(int(num_splits), W * tiles_per_page, MAX_SPLITS))
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if tma is not False and num_splits == 1:
        tma_tiles = Tiles(block_m or min(TMA_TILES.block_m, t.block_m), block_n or TMA_TILES.block_n,
                          num_warps or TMA_TILES.num_warps, num_stages or TMA_TILES.num_stages)
        contiguous = k_pool.is_contiguous() and v_pool.is_contiguous()
        if tma is None:
            cap = torch.cuda.get_device_capability(q.device) if q.device.type == "cuda" else None
            tma = contiguous and use_tma(
                capability=cap, dtype=q.dtype, head_dim=D, num_splits=1, block_size=bs,
                block_n=tma_tiles.block_n, table_width=W, pool_rows=k_pool.shape[0] * bs,
                aligned=_tma_aligned(q, k_pool, v_pool))
        elif TensorDescriptor is None or bs % tma_tiles.block_n or not contiguous or W > TMA_MAX_PAGES:
            raise ValueError(f"the TMA kernel needs triton's TensorDescriptor, block_size ({bs}) a multiple of "
                             f"block_n ({tma_tiles.block_n}), contiguous pools and at most {TMA_MAX_PAGES} pages")
        if tma:
            _check(q, k_pool, v_pool, tables, lengths, tma_tiles)
            return _launch_tma(q, k_pool, v_pool, tables, lengths, out, scale, tma_tiles)
    elif tma:
        raise ValueError(f"the TMA kernel runs one split, got num_splits={num_splits}")
    split_stride = R * Hq * Lq
    if num_splits > 1:
        ws_acc = torch.empty(num_splits, R * Hq, Lq, D, dtype=torch.float32, device=q.device)
        ws_m = torch.empty(num_splits, R * Hq, Lq, dtype=torch.float32, device=q.device)
        ws_l = torch.empty_like(ws_m)
    else:
        ws_acc = ws_m = ws_l = out  # not touched with one split
    _paged_fwd[(q_tiles, R * Hq, num_splits)](
        q, k_pool, v_pool, tables, lengths, out, ws_acc, ws_m, ws_l,
        float(scale) * LOG2E, Lq, W, split_stride,
        q.stride(0), q.stride(1), q.stride(2),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        tables.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        HQ=Hq, GROUP=Hq // Hkv, D=D, BLOCK_SIZE=bs, TILES_PER_PAGE=tiles_per_page,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, NUM_SPLITS=num_splits,
        MASK_N=bs % tiles.block_n != 0,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    if num_splits > 1:
        combine_splits(ws_acc, ws_m, ws_l, out)
    return out


def combine_splits(ws_acc: torch.Tensor, ws_m: torch.Tensor, ws_l: torch.Tensor, out: torch.Tensor) -> None:
    """Normalise split-KV partials into ``out`` ``[R, Lq, Hq, D]`` (D contiguous, other strides free).

    ``ws_acc`` ``[S, R * Hq, Lq, D]`` and ``ws_m`` / ``ws_l`` ``[S, R * Hq, Lq]``, fp32, base 2, as the
    module docstring says; any split-KV forward that writes that layout can use it."""
    splits, rows_heads, lq, d = ws_acc.shape
    # Small combine tiles when there are few of them (at batch 1 the maze geometry would
    # otherwise be 12 programs each reading 17 partials), and the head dim cut into
    # slices of 64: pi0's expert (head_dim 256, 408 rows, batch 1) took 10.7 us here with
    # whole rows, more than its forward (bench/results/pi0_expert_profile_h200.json).
    block_d = min(d, 64)
    slices = d // block_d
    bm = 32 if d > 64 else 64
    while bm > 16 and -(-lq // bm) * rows_heads * slices < sm_count(out.device):
        bm //= 2
    _paged_combine[(-(-lq // bm), rows_heads, slices)](
        ws_acc, ws_m, ws_l, out, lq, rows_heads * lq,
        out.stride(0), out.stride(1), out.stride(2),
        HQ=out.shape[2], D=d, BLOCK_M=bm, BLOCK_D=block_d, NUM_SPLITS=splits, num_warps=4)


def _launch_tma(q, k_pool, v_pool, tables, lengths, out, scale: float, tiles: Tiles) -> torch.Tensor:
    """``_paged_fwd_tma`` over descriptors built here (host-side: plain kernel arguments,
    so a CUDA graph captures them with the launch)."""
    R, Lq, Hq, D = q.shape
    nb, bs, Hkv, _ = k_pool.shape
    W = tables.shape[1]
    box = [1, tiles.block_m, 1, D]
    kv = [TensorDescriptor(p.view(nb * bs, Hkv * D), [nb * bs, Hkv * D], [Hkv * D, 1], [tiles.block_n, D])
          for p in (k_pool, v_pool)]
    _paged_fwd_tma[(-(-Lq // tiles.block_m), R * Hq)](
        TensorDescriptor(q, list(q.shape), list(q.stride()), box), *kv,
        TensorDescriptor(out, list(out.shape), list(out.stride()), box),
        tables, lengths, float(scale) * LOG2E, W, tables.stride(0),
        HQ=Hq, GROUP=Hq // Hkv, D=D, BLOCK_SIZE=bs, TILES_PER_PAGE=bs // tiles.block_n,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, W_PAD=max(2, 1 << (W - 1).bit_length()),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    return out
