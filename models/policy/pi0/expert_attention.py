"""pi0's multi-query attention, the expert's and the prefix's: query heads folded into rows over one K/V head.

Its first use, and its name: the action expert's 51 tokens x 8 query heads over the whole
cache. Gemma-2B's prefix layers (816 tokens x 8 heads = 6,528 rows over the prefix's keys,
a bias per key) run it too: 38 vs 53 us a layer for ``scaled_dot_product_attention`` at one
robot, 163 vs 204 us at eight (bench/results/pi0_prefix_profile_h200.json).

Folded as in ``layers.attend`` (query heads into rows: row ``t * H + h`` is token t's
head h), one expert layer is one head of ``T * H = 408`` query rows over ``kv_len``
keys (~880), head_dim 256, with pi0's mask as an additive bias. That shape starves
the fused library kernels: ``scaled_dot_product_attention`` runs it as some 7 query
tiles on a 132-SM H200 and took 54-80 us a layer, 14 of the 23 ms of a one-robot
expert loop (bench/results/pi0_expert_profile_h200.json), against ~4-7 us for each of
the layer's matmuls.

``expert_attention`` is a custom op (so ``torch.compile`` keeps it whole):

* on CUDA with Triton, a split-KV flash forward (``_expert_fwd``): program
  ``(m, b, s)`` runs the online softmax of query tile m of robot b over the s-th
  contiguous range of keys; Q K^T accumulates in fp32 from bf16, P is rounded to
  bf16 for P V (what flash attention does); the partials are combined by
  ``kv.triton_paged.combine_splits``. The key tile and split count are timed once
  per shape among a few candidates (``tuned``), before any capture, so that a
  captured call launches fixed kernels;
* elsewhere, the same maths with two batched matmuls, scores in fp32.
"""

from __future__ import annotations

import math

import torch

from kv.triton_paged import LOG2E, choose_splits, combine_splits, sm_count, triton_available

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the math path runs instead
    triton = None

    class tl:  # noqa: N801 - just what the kernel signature evaluates at import
        constexpr = None

BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES = 64, 32, 4, 2


def _jit(fn):
    return fn if triton is None else triton.jit(fn)


@_jit
def _expert_fwd(Q, K, V, Bias, Out, WsAcc, WsM, WsL,
                qk_scale, bias_scale, Rq, L, split_stride,
                stride_qb, stride_qt, stride_qh, stride_kb, stride_kn, stride_vb, stride_vn,
                stride_bb, stride_br, stride_ob, stride_or,
                H: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                N_TILES: tl.constexpr, NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    s = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    m_valid = offs_m < Rq
    # Row t * H + h of the folded query is token t's head h: q is [B, T, H, D] with free strides.
    q_rows = (offs_m // H) * stride_qt + (offs_m % H) * stride_qh
    q = tl.load(Q + b * stride_qb + q_rows[:, None] + offs_d[None, :], mask=m_valid[:, None], other=0.0)

    # This program's key tiles: a near-equal share of the N_TILES, as kv.triton_paged splits pages
    # (N_TILES is a constant of the model's cache length: a runtime int made Triton 3.6's
    # interpreter build the loop bounds as arrays).
    lo = N_TILES * s // NUM_SPLITS
    hi = N_TILES * (s + 1) // NUM_SPLITS
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for j in range(lo, hi):
        offs_n = j * BLOCK_N + tl.arange(0, BLOCK_N)
        n_valid = offs_n < L
        k = tl.load(K + b * stride_kb + offs_n[:, None] * stride_kn + offs_d[None, :], mask=n_valid[:, None],
                    other=0.0)
        bias = tl.load(Bias + b * stride_bb + offs_m[:, None] * stride_br + offs_n[None, :],
                       mask=m_valid[:, None] & n_valid[None, :], other=float("-inf"))
        # Base 2: both scales carry log2(e), so exp2 gives exp(scale * qk + bias).
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale + bias.to(tl.float32) * bias_scale
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # every key so far hidden: weights stay 0
        p = tl.exp2(qk - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + b * stride_vb + offs_n[:, None] * stride_vn + offs_d[None, :], mask=n_valid[:, None],
                    other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new

    if NUM_SPLITS == 1:
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        tl.store(Out + b * stride_ob + offs_m[:, None] * stride_or + offs_d[None, :],
                 (acc / l_safe[:, None]).to(Out.dtype.element_ty), mask=m_valid[:, None])
    else:
        # combine_splits' layout: [S, B, Rq] (+ [D]), split_stride = B * Rq.
        row = s.to(tl.int64) * split_stride + b * Rq + offs_m
        tl.store(WsM + row, m_i, mask=m_valid)
        tl.store(WsL + row, l_i, mask=m_valid)
        tl.store(WsAcc + row[:, None] * D + offs_d[None, :], acc, mask=m_valid[:, None])


def expert_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, *,
                            num_splits: int | None = None, block_m: int = BLOCK_M, block_n: int = BLOCK_N,
                            num_warps: int = NUM_WARPS, num_stages: int = NUM_STAGES) -> torch.Tensor:
    """q [B, T, H, D], k / v [B, L, D], bias [B, 1, T * H or 1, L] -> [B, T, H * D] (see the module docstring)."""
    b, t, h, d = q.shape
    rq, length = t * h, k.shape[1]
    if q.stride(3) != 1:
        q = q.contiguous()
    bias = _rows(bias, b, rq, length)
    out = q.new_empty(b, rq, d)
    q_tiles, kv_tiles = -(-rq // block_m), -(-length // block_n)
    if num_splits is None:
        num_splits = choose_splits(q_tiles, b, kv_tiles, sm_count(q.device))
    num_splits = max(1, min(num_splits, kv_tiles))
    if num_splits > 1:
        ws_acc = torch.empty(num_splits, b, rq, d, dtype=torch.float32, device=q.device)
        ws_m = torch.empty(num_splits, b, rq, dtype=torch.float32, device=q.device)
        ws_l = torch.empty_like(ws_m)
    else:
        ws_acc = ws_m = ws_l = out  # not touched with one split
    _expert_fwd[(q_tiles, b, num_splits)](
        q, k, v, bias, out, ws_acc, ws_m, ws_l,
        LOG2E / math.sqrt(d), LOG2E, rq, length, b * rq,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        bias.stride(0), bias.stride(1), out.stride(0), out.stride(1),
        H=h, D=d, BLOCK_M=block_m, BLOCK_N=block_n, N_TILES=kv_tiles, NUM_SPLITS=num_splits,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=num_warps, num_stages=num_stages)
    if num_splits > 1:
        combine_splits(ws_acc, ws_m, ws_l, out.view(b, rq, 1, d))
    return out.view(b, t, h * d)


def expert_attention_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The same attention as two batched matmuls, scores in fp32 (CPU, or CUDA without Triton)."""
    b, t, h, d = q.shape
    rows = q.reshape(b, t * h, d).float()
    scores = torch.baddbmm(_rows(bias, b, t * h, k.shape[1]).float(), rows, k.float().transpose(1, 2), alpha=d ** -0.5)
    return torch.bmm(scores.softmax(-1).to(v.dtype), v).view(b, t, h * d)


def _rows(bias: torch.Tensor, b: int, rows: int, length: int) -> torch.Tensor:
    """bias [B, 1, rows or 1, L] -> [B, rows, L]; a bias per key only (the prefix's padding) is
    broadcast with a zero row stride, not copied."""
    return bias.expand(b, 1, rows, length)[:, 0]


# Candidates the first call of a shape times (``tuned``): (block_m, block_n, num_splits or None for
# choose_splits, num_warps). The 64-row tiles suit the expert's 408 rows; the 128-row ones the
# prefix's 6,528 (816 tokens x 8 heads), where there are query tiles enough for every SM.
CANDIDATES = ((64, 32, None, 4), (64, 64, None, 4), (64, 64, 1, 4), (64, 64, 2, 4), (64, 64, 4, 4), (64, 32, 8, 4),
              (128, 32, 1, 8), (128, 64, 1, 8), (128, 64, None, 8), (64, 64, 1, 8))
_TUNED: dict[tuple, dict[str, int | None]] = {}


def tuned(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> dict[str, int | None]:
    """The fastest of ``CANDIDATES`` for this shape on this device, timed once per shape.

    No ``triton.autotune``: the choice must not be made while a CUDA graph is being
    captured, so a call under capture that finds no choice for its shape takes the
    defaults (the runner's warm-up calls come first, outside the capture)."""
    key = (q.device.index, tuple(q.shape), tuple(k.shape), tuple(bias.shape), q.dtype)
    hit = _TUNED.get(key)
    if hit is not None:
        return hit
    if torch.cuda.is_current_stream_capturing():
        return {}
    best, best_ms = {}, float("inf")
    for block_m, block_n, splits, warps in CANDIDATES:
        opts = {"block_m": block_m, "block_n": block_n, "num_splits": splits, "num_warps": warps}
        try:
            ms = graph_ms(lambda: expert_attention_triton(q, k, v, bias, **opts))
        except Exception:  # noqa: BLE001 - a variant this device cannot run (resources): skip it
            continue
        if ms < best_ms:
            best, best_ms = opts, ms
    _TUNED[key] = best
    return best


def graph_ms(fn, reps: int = 20) -> float:
    """GPU milliseconds of ``reps`` calls replayed from one CUDA graph (a call is a few
    microseconds of kernels: timed from the host, the launches would be measured instead)."""
    fn()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    best = float("inf")
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


@torch.library.custom_op("pi0::expert_attention", mutates_args=())
def expert_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Multi-query attention of folded rows: q [B, T, H, D] over k / v [B, L, D] with ``bias``
    [B, 1, T * H, L], or [B, 1, 1, L] for a bias per key (0 visible, -inf hidden) -> [B, T, H * D]."""
    if q.is_cuda and triton_available():
        return expert_attention_triton(q, k, v, bias, **tuned(q, k, v, bias))
    return expert_attention_math(q, k, v, bias)


@expert_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    b, t, h, d = q.shape
    return q.new_empty(b, t, h * d)
