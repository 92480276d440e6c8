"""The action expert's matmuls at one robot: 51 rows against 2-16 MB of weights each.

At batch 1 every expert layer multiplies the suffix's 51 rows by four weights (q|k|v
2560 x 1024, o 1024 x 2048, gate|up 8192 x 1024, down 1024 x 4096): 34.6 MB of bf16
to read per layer-step, about 7 us at the H200's bandwidth, and next to no
arithmetic. cuBLAS took some 23 us for the four (bench/results/pi0_expert_profile_h200.json),
180 times a call. So at a few rows the matmul is a weight stream::

    program n:  y[:, n*BN:(n+1)*BN] = x[:M, :] @ w[n*BN:(n+1)*BN, :]^T
                (all M <= 64 rows at once, K walked in BK steps, fp32 accumulation)

``skinny_geglu`` streams gate|up's two halves side by side and writes
``gelu_tanh(gate) * up`` as its epilogue, so the [M, 2F] product never reaches memory
and the element-wise kernel after it is gone.

Both are custom ops (``torch.compile`` keeps them whole) used only where they apply
(``applies``: CUDA, Triton, at most ``MAX_ROWS`` rows) and the caller asks for the stream
(``stream``: ``Pi0Runner(weight_stream=...)``, off for the benchmarks' cuBLAS row); anything
else is ``F.linear``.
The tile is timed once per shape among ``CANDIDATES`` (those that divide its sizes)
before any capture (``tuned``), like ``expert_attention``'s, and the kernel must beat
``F.linear`` in that timing to be used at all, so a shape where cuBLAS is faster keeps
cuBLAS. On the H200 (bench/results/pi0_h200.json, per call, weights from memory):
gate|up + gelu 13.1 -> 7.8 us and o 7.4 -> 6.5 us took the kernel, q|k|v (4.8 us) and
down (7.3 us) kept cuBLAS; the one-robot call went from 19.49 to 19.32 ms.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from kv.triton_paged import triton_available
from models.policy.pi0.expert_attention import graph_ms

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: F.linear runs instead
    triton = None

    class tl:  # noqa: N801 - just what the kernel signature evaluates at import
        constexpr = None

BLOCK_M = 64         # one program holds every row: the expert's 51 at one robot
MAX_ROWS = BLOCK_M


def _jit(fn):
    return fn if triton is None else triton.jit(fn)


@_jit
def _skinny_fwd(X, W, Y, M, K, HALF, stride_xm, stride_wn, stride_ym,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GEGLU: tl.constexpr,
                PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    x_ptrs = X + offs_m[:, None] * stride_xm + offs_k[None, :]
    # w is [N, K] row-major: the tile [BK, BN] is w's rows offs_n, columns k..k+BK, transposed.
    w_ptrs = W + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):  # K % BLOCK_K == 0 (the wrapper's applies())
        x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
        acc = tl.dot(x, tl.load(w_ptrs), acc, input_precision=PRECISION)
        if GEGLU:
            up = tl.dot(x, tl.load(w_ptrs + HALF * stride_wn), up, input_precision=PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if GEGLU:
        # gelu_tanh(a) = 0.5 a (1 + tanh(u)) = a * sigmoid(2 u), u = sqrt(2 / pi) (a + 0.044715 a^3)
        # (a literal: a jit'ed function sees no module globals)
        acc = acc * tl.sigmoid(1.5957691216057308 * (acc + 0.044715 * acc * acc * acc)) * up
    tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(Y.dtype.element_ty), mask=m_ok[:, None])


def skinny_triton(x: torch.Tensor, w: torch.Tensor, *, geglu: bool = False, block_n: int = 32, block_k: int = 128,
                  num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """x [..., K] (at most ``MAX_ROWS`` rows) @ w [N, K]^T -> [..., N]; with ``geglu``,
    gelu_tanh(x @ gate^T) * (x @ up^T) -> [..., N / 2] where w = gate | up (rows)."""
    k = x.shape[-1]
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    n_out = w.shape[0] // 2 if geglu else w.shape[0]
    out = rows.new_empty(rows.shape[0], n_out)
    _skinny_fwd[(n_out // block_n,)](
        rows, w, out, rows.shape[0], k, n_out, rows.stride(0), w.stride(0), out.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k, GEGLU=geglu,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=num_warps, num_stages=num_stages)
    return out.view(*x.shape[:-1], n_out)


def reference(x: torch.Tensor, w: torch.Tensor, geglu: bool) -> torch.Tensor:
    """What the kernel computes, with torch ops (the path wherever the kernel does not apply)."""
    y = F.linear(x, w)
    if not geglu:
        return y
    gate, up = y.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


# (block_n, block_k, num_warps, num_stages) the first call of a shape times.
CANDIDATES = ((16, 128, 4, 4), (16, 256, 4, 3), (32, 128, 4, 4), (32, 256, 4, 3), (64, 128, 4, 3),
              (16, 512, 8, 2), (32, 64, 2, 6))
_TUNED: dict[tuple, dict[str, int] | None] = {}
_REPORT: list[dict] = []
L2_DEFEAT_BYTES = 128 << 20  # weight copies a timing cycles through: well above the H200's 50 MB L2


def _divides(opts: dict[str, int], k: int, n_out: int) -> bool:
    return k % opts["block_k"] == 0 and n_out % opts["block_n"] == 0


def tuned(x: torch.Tensor, w: torch.Tensor, geglu: bool) -> dict[str, int] | None:
    """The fastest candidate tile for this shape, or None when ``reference`` (cuBLAS) is
    faster or nothing fits; timed once per shape, never under a capture (then: None)."""
    key = (x.device.index, tuple(x.shape), tuple(w.shape), x.dtype, geglu)
    if key in _TUNED:
        return _TUNED[key]
    if torch.cuda.is_current_stream_capturing():
        return None
    n_out = w.shape[0] // 2 if geglu else w.shape[0]
    # In the loop each layer's weights come from memory (18 layers: 623 MB a step); timed
    # alone, one weight would sit in the 50 MB L2. So the timing cycles through copies.
    copies = [w] + [w.clone() for _ in range(min(31, -(-L2_DEFEAT_BYTES // (w.numel() * w.element_size())) - 1))]
    turn = itertools.cycle(copies)
    best: dict[str, int] | None = None
    reps = max(20, len(copies))
    best_ms = cublas_ms = graph_ms(lambda: reference(x, next(turn), geglu), reps)
    for block_n, block_k, warps, stages in CANDIDATES:
        opts = {"block_n": block_n, "block_k": block_k, "num_warps": warps, "num_stages": stages}
        if not _divides(opts, x.shape[-1], n_out):
            continue
        try:
            ms = graph_ms(lambda: skinny_triton(x, next(turn), geglu=geglu, **opts), reps)
        except Exception:  # noqa: BLE001 - a tile this device cannot run (shared memory): skip it
            continue
        if ms < best_ms:
            best, best_ms = opts, ms
    _TUNED[key] = best
    _REPORT.append({"rows": int(x.numel() // x.shape[-1]), "weight": list(w.shape), "geglu": geglu,
                    "cublas_us": round(cublas_ms * 1000 / reps, 2), "chosen": best or "cublas",
                    "chosen_us": round(best_ms * 1000 / reps, 2)})  # per call (graph_ms times all reps)
    return best


def tuning_report() -> list[dict]:
    """What ``tuned`` chose per shape and its timings (for the benchmarks' JSON)."""
    return list(_REPORT)


def applies(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``x @ w^T`` is a weight stream this module serves (decided at trace time)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return x.is_cuda and triton_available() and 0 < rows <= MAX_ROWS and x.dtype == w.dtype


def _run(x: torch.Tensor, w: torch.Tensor, geglu: bool) -> torch.Tensor:
    opts = tuned(x, w, geglu)
    return reference(x, w, geglu) if opts is None else skinny_triton(x, w, geglu=geglu, **opts)


@torch.library.custom_op("pi0::skinny_linear", mutates_args=())
def skinny_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, w)`` for a few rows (``applies``), as a weight stream when that is faster."""
    return _run(x, w, False)


@skinny_linear.register_fake
def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], w.shape[0])


@torch.library.custom_op("pi0::skinny_geglu", mutates_args=())
def skinny_geglu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up of ``F.linear(x, w)`` split in halves (gate | up), for a few rows."""
    return _run(x, w, True)


@skinny_geglu.register_fake
def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], w.shape[0] // 2)


def linear(x: torch.Tensor, w: torch.Tensor, stream: bool = True) -> torch.Tensor:
    """A layer's matmul: the weight stream for a few rows on CUDA, ``F.linear`` otherwise
    (and always with ``stream=False``)."""
    return skinny_linear(x, w) if stream and applies(x, w) else F.linear(x, w)


def geglu(x: torch.Tensor, w: torch.Tensor, stream: bool = True) -> torch.Tensor:
    """gelu_tanh(x @ gate^T) * (x @ up^T) for w = gate | up, fused for a few rows on CUDA
    (``reference`` elsewhere, and always with ``stream=False``)."""
    return skinny_geglu(x, w) if stream and applies(x, w) else reference(x, w, True)
