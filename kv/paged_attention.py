"""Attention of a batch of chunks over their own paged KV.

Row ``r`` of a ``KVBatch`` has queries ``q[r]`` (``[Lq, Hq, D]``) for its
in-flight chunk. It attends to every token of the blocks in its block table:
its held sink and window pages and the chunk's own pages (written by
``PagedKVCache.write`` first). There is no mask inside the chunk (non-causal)
and none across pages, so the whole mask is "these pages, nothing else" and
attention is permutation-invariant over pages.

Backends:

``gather_sdpa``
    Gather each row's pages into contiguous ``[R, S, H, D]`` with one
    ``index_select`` per tensor, then ``scaled_dot_product_attention`` (flash /
    cuDNN / efficient on CUDA, math on CPU). Rows are grouped by page count, so
    no padding and no mask. Costs one extra read+write of the attended K/V.
``flex``
    ``torch.nn.attention.flex_attention`` directly on the pool, viewed as one
    batch-1 sequence ``[1, H, num_blocks * block_size, D]``; a ``BlockMask``
    lists for each row the 128-token KV tiles of its pages (all "full" tiles, so
    the kernel evaluates no mask function). No copy of the KV. Needs
    ``block_size % 128 == 0``. Compiled on CUDA; on CPU it runs eagerly with an
    equivalent ``mask_mod`` (page owner == row), which is how the tests check
    the block mask against a dense reference.

``gather_flash`` / ``gather_cudnn``
    ``gather_sdpa`` with the flash or cuDNN kernel called directly (the aten op,
    not ``sdpa_kernel`` + dispatch: at batch 1 the call is launch-bound and that
    Python is most of its cost). GQA or an unsupported head dim falls back to
    SDPA pinned to that kernel.
``triton``
    ``kv.triton_paged``: a Triton flash-attention forward that reads each row's
    pages straight from the pool (no gather, no copy), split over the KV range
    when the batch alone would leave SMs idle ("flash-decoding": at batch 1 the
    maze geometry is 6 programs of 128 queries on 132 SMs without it). Split
    count and tiles come from shapes only, so it is CUDA-graph capturable. Needs
    triton and head_dim in (16, 32, 64, 128); in ``CUDA_CANDIDATES`` only when
    triton imports.
``triton:<options>``
    ``triton`` with fixed ``block_m``, ``block_n``, ``num_warps``, ``num_stages``
    or ``num_splits``; ``triton_backend(options)`` registers one and returns its
    name (for the benchmark).
``flex:<options>``
    ``flex`` with Triton ``kernel_options`` (``BLOCK_M``, ``BLOCK_N``,
    ``num_warps``, ``num_stages``, ``USE_TMA``, ...); ``flex_backend(options)``
    registers one and returns its name. At head_dim 64 the default tile
    (128 x 128) leaves a batch of 32 sessions at 1.5 waves on an H200
    (2 q-tiles x 3 heads x 32 rows = 192 programs on 132 SMs); smaller tiles
    fill the machine.

``auto`` times every applicable backend (``CUDA_CANDIDATES`` plus a flex
backend for each entry of ``FLEX_CONFIGS``) on the first batch of each shape
(CUDA events, median of a few runs) and keeps the fastest; on CPU it is
``gather_sdpa``. ``AttentionDispatch.choices`` records what was measured.

Per-batch work (gather indices, the flex ``BlockMask``) is built once per
``KVBatch`` and kept in ``batch.plans``: every layer of a tick reuses it.
"""

from __future__ import annotations

import functools
import logging
import math
import statistics
import time
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F

from kv.batch import KVBatch
from kv.triton_paged import paged_attention_triton, triton_available

log = logging.getLogger(__name__)

FLEX_TILE = 128
BACKENDS = ("gather_sdpa", "flex", "gather_flash", "gather_cudnn", "triton")
# Flex kernel options ``auto`` tries on CUDA besides torch's defaults, best first.
# Each costs one compile (a few seconds) on the first batch; keep the list short.
# Picked by a tile sweep on an H200 (bench/results/kv_attention_tune.json); bench/kv/bench_kv.py
# times each entry beside the other backends.
FLEX_CONFIGS: tuple[Mapping[str, Any], ...] = (
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
)


def paged_attention(q: torch.Tensor, k_cur: torch.Tensor | None, v_cur: torch.Tensor | None,
                    cache, layer: int, batch: KVBatch, *, scale: float | None = None,
                    backend: str | None = None) -> torch.Tensor:
    """Write the chunk's ``k_cur``/``v_cur`` (unless None) into its blocks, then attend.

    ``q``: ``[R, Lq, Hq, D]``; ``k_cur``/``v_cur``: ``[R, chunk tokens, Hkv, D]``;
    ``cache``: a ``PagedKVCache``. Returns ``[R, Lq, Hq, D]``.
    """
    if k_cur is not None:
        cache.write(layer, batch, k_cur, v_cur)
    return cache.attend(q, layer, batch, scale=scale, backend=backend)


# -- gather + SDPA ----------------------------------------------------------------

def _gather_plan(batch: KVBatch) -> list[tuple[torch.Tensor | None, int, torch.Tensor]]:
    plan = batch.plans.get("gather")
    if plan is not None:
        return plan
    groups: dict[int, list[int]] = {}
    for r, n in enumerate(batch.num_pages):
        groups.setdefault(n, []).append(r)
    tables = batch.block_tables
    device = tables.device
    plan = []
    for n, rows in groups.items():
        if len(groups) == 1:
            plan.append((None, n, tables[:, :n].reshape(-1).long()))
        else:
            idx = torch.tensor(rows, dtype=torch.long, device=device)
            plan.append((idx, n, tables.index_select(0, idx)[:, :n].reshape(-1).long()))
    batch.plans["gather"] = plan
    return plan


def _sdpa(qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor, scale: float | None) -> torch.Tensor:
    return F.scaled_dot_product_attention(qh, kh, vh, scale=scale,
                                          enable_gqa=qh.shape[1] != kh.shape[1])


def _gathered(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: KVBatch,
              scale: float | None, attend: Callable,
              extra: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Gather each row group's pages to ``[g, H, S, D]`` views and ``attend`` them; ``extra``
    K/V ``[R, L, Hkv, D]`` follow each row's pages (``transient_attention``)."""
    R, Lq, Hq, D = q.shape
    _, bs, Hkv, _ = k_pool.shape
    out = None
    for rows, n, idx in _gather_plan(batch):
        g = R if rows is None else rows.numel()
        k = k_pool.index_select(0, idx).view(g, n * bs, Hkv, D)
        v = v_pool.index_select(0, idx).view(g, n * bs, Hkv, D)
        if extra is not None:
            ke, ve = extra if rows is None else (t.index_select(0, rows) for t in extra)
            k, v = torch.cat([k, ke.to(k.dtype)], 1), torch.cat([v, ve.to(v.dtype)], 1)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        qg = (q if rows is None else q.index_select(0, rows)).transpose(1, 2)
        o = attend(qg, k, v, scale).transpose(1, 2)
        if rows is None:
            return o
        if out is None:
            out = q.new_empty(R, Lq, Hq, D)
        out.index_copy_(0, rows, o)
    return out


def gather_sdpa(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: KVBatch,
                scale: float | None = None, sdpa_backend=None,
                extra: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Gather + SDPA; ``sdpa_backend`` pins one ``SDPBackend`` (default: PyTorch picks)."""
    if sdpa_backend is not None:
        from torch.nn.attention import sdpa_kernel
        with sdpa_kernel([sdpa_backend]):
            return _gathered(q, k_pool, v_pool, batch, scale, _sdpa, extra)
    return _gathered(q, k_pool, v_pool, batch, scale, _sdpa, extra)


def transient_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: KVBatch,
                        k_extra: torch.Tensor, v_extra: torch.Tensor, *,
                        scale: float | None = None) -> torch.Tensor:
    """Each row's queries over its pages (held + chunk, as ``KVBatch`` lists them) followed by
    ``k_extra``/``v_extra`` ``[R, L, Hkv, D]``: tokens a forward attends but the pool never
    holds (DreamZero's denoising passes: the noisy frames and the action/state tokens).
    Nothing is written. Gather + SDPA (the pages are copied next to the extra tokens)::

        row r keys:  [ page 0 | page 1 | ... | page n-1 | extra[r] ]
    """
    if k_extra.shape[0] != q.shape[0] or v_extra.shape != k_extra.shape:
        raise ValueError(f"extra K/V must be [{q.shape[0]}, L, heads, dim] alike, got "
                         f"{tuple(k_extra.shape)} and {tuple(v_extra.shape)}")
    return gather_sdpa(q, k_pool, v_pool, batch, scale, extra=(k_extra, v_extra))


def _direct_ok(q: torch.Tensor, k_pool: torch.Tensor) -> bool:
    # What the aten kernels take without SDPA's front end: same head count (the
    # front end expands GQA), 16-bit CUDA tensors, a head dim they support unpadded.
    D = q.shape[-1]
    return (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
            and q.shape[2] == k_pool.shape[2] and D % 8 == 0 and D <= 256)


def _flash_direct(qh, kh, vh, scale):
    return torch.ops.aten._scaled_dot_product_flash_attention.default(
        qh, kh, vh, 0.0, False, False, scale=scale)[0]


def _cudnn_direct(qh, kh, vh, scale):
    return torch.ops.aten._scaled_dot_product_cudnn_attention.default(
        qh, kh, vh, None, False, 0.0, False, False, scale=scale)[0]


def gather_flash(q, k_pool, v_pool, batch, scale=None):
    if _direct_ok(q, k_pool):
        return _gathered(q, k_pool, v_pool, batch, scale, _flash_direct)
    from torch.nn.attention import SDPBackend
    return gather_sdpa(q, k_pool, v_pool, batch, scale, SDPBackend.FLASH_ATTENTION)


def gather_cudnn(q, k_pool, v_pool, batch, scale=None):
    if _direct_ok(q, k_pool):
        return _gathered(q, k_pool, v_pool, batch, scale, _cudnn_direct)
    from torch.nn.attention import SDPBackend
    return gather_sdpa(q, k_pool, v_pool, batch, scale, SDPBackend.CUDNN_ATTENTION)


# -- FlexAttention on the pool ------------------------------------------------------

_compiled_flex: Callable | None = None
# Every row attends at least its own chunk, so no query row is fully masked and
# the kernel may skip its all-masked-row guard.
_FLEX_BASE_OPTIONS = {"ROWS_GUARANTEED_SAFE": True}


def _flex_fn(device: torch.device) -> Callable:
    from torch.nn.attention.flex_attention import flex_attention
    if device.type != "cuda":
        return flex_attention
    global _compiled_flex
    if _compiled_flex is None:
        # Each kernel_options dict is a separate specialisation of the same code
        # object; the default limit (8) would send later configs to eager flex,
        # which is dense and very slow. Only ever raised, never lowered.
        import torch._dynamo.config as dynamo_config
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
        # dynamic=None: the first recompile (a new batch size) makes the sizes
        # symbolic, so varying batches do not pile up recompiles.
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex


def flex_supported(block_size: int) -> bool:
    return block_size % FLEX_TILE == 0


def _flex_block_mask(batch: KVBatch, Lq: int, num_blocks: int, block_size: int):
    from torch.nn.attention.flex_attention import BlockMask, noop_mask
    key = ("flex", Lq)
    bm = batch.plans.get(key)
    if bm is not None:
        return bm
    tables = batch.block_tables.long()            # [R, P]
    R, P = tables.shape
    device = tables.device
    per = block_size // FLEX_TILE                 # flex tiles per page
    tiles = (tables[:, :, None] * per + torch.arange(per, device=device)).view(R, P * per)
    q_tiles = -(-Lq // FLEX_TILE)
    # Like torch's own PagedAttention, the index rows cover every tile of the pool
    # (entries past the count are ignored); some lowerings check that width.
    full_idx = torch.zeros((R, 1, q_tiles, num_blocks * per), dtype=torch.int32, device=device)
    full_idx[:, :, :, :P * per] = tiles.to(torch.int32)[:, None, None, :]
    full_num = (batch.lengths * per).to(torch.int32)[:, None, None].expand(R, 1, q_tiles).contiguous()
    part_num = torch.zeros_like(full_num)
    part_idx = torch.zeros_like(full_idx)
    if device.type == "cuda":
        mask_mod = noop_mask  # every listed tile is full: the compiled kernel skips mask_mod
    else:
        # Eager flex ignores block sparsity and applies mask_mod densely, so the
        # mask must say the same thing: a key is visible iff its page belongs to the row.
        owner = torch.full((num_blocks,), -1, dtype=torch.long, device=device)
        valid = torch.arange(P, device=device)[None, :] < batch.lengths[:, None]
        rows = torch.arange(R, device=device)[:, None].expand(R, P)
        owner[tables[valid]] = rows[valid]

        def mask_mod(b, h, q_idx, kv_idx):
            return owner[kv_idx // block_size] == b

    bm = BlockMask.from_kv_blocks(part_num, part_idx, full_num, full_idx, BLOCK_SIZE=FLEX_TILE,
                                  mask_mod=mask_mod, seq_lengths=(Lq, num_blocks * block_size),
                                  compute_q_blocks=False)
    batch.plans[key] = bm
    return bm


def _mark_batch_dynamic(qt: torch.Tensor, bm) -> None:
    # Compile once for every batch size >= 2 instead of once static, once
    # dynamic: only the grid depends on the batch. (Size 1 is always specialised.)
    # bench/results/kv_gpu.json: flex's first call took 12.3 s at batch 1, 3.5 s at
    # 32 and 0.001 s at 128. A torch that rejected the mark would fail flex, which
    # ``auto`` then does not choose.
    mark = torch._dynamo.maybe_mark_dynamic
    mark(qt, 0)
    for t in (bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices):
        if t is not None:
            mark(t, 0)


def flex(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: KVBatch,
         scale: float | None = None, kernel_options: Mapping[str, Any] | None = None) -> torch.Tensor:
    R, Lq, Hq, D = q.shape
    nb, bs, Hkv, _ = k_pool.shape
    if not flex_supported(bs):
        raise ValueError(f"flex needs block_size % {FLEX_TILE} == 0, got {bs}")
    bm = _flex_block_mask(batch, Lq, nb, bs)
    k = k_pool.view(1, nb * bs, Hkv, D).transpose(1, 2)
    v = v_pool.view(1, nb * bs, Hkv, D).transpose(1, 2)
    qt = q.transpose(1, 2)
    options = dict(_FLEX_BASE_OPTIONS)
    if kernel_options:
        options.update(kernel_options)
    if q.is_cuda and R > 1:
        _mark_batch_dynamic(qt, bm)
    out = _flex_fn(q.device)(qt, k, v, block_mask=bm, scale=scale, enable_gqa=Hq != Hkv,
                             kernel_options=options)
    return out.transpose(1, 2)


# -- Triton on the pool ------------------------------------------------------------------

TRITON_OPTIONS = ("block_m", "block_n", "num_warps", "num_stages", "num_splits")


def triton_paged(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: KVBatch,
                 scale: float | None = None, options: Mapping[str, int] | None = None) -> torch.Tensor:
    """``kv.triton_paged`` over the batch's block tables (every row's attended pages)."""
    return paged_attention_triton(q, k_pool, v_pool, batch.block_tables, batch.lengths, scale=scale,
                                  **(options or {}))


def triton_backend(options: Mapping[str, int]) -> str:
    """Register ``triton`` with fixed tiles / splits (keys of ``TRITON_OPTIONS``); returns its name.

    Like ``flex_backend``: ``triton:block_m=64,num_splits=4`` (keys sorted), one name per options.
    """
    if not options:
        return "triton"
    unknown = set(options) - set(TRITON_OPTIONS)
    if unknown:
        raise ValueError(f"unknown triton options {sorted(unknown)}; choose from {TRITON_OPTIONS}")
    opts = dict(sorted(options.items()))
    name = "triton:" + ",".join(f"{k}={v}" for k, v in opts.items())
    if name not in _IMPLS:
        _IMPLS[name] = functools.partial(triton_paged, options=opts)
    return name


def is_triton(name: str) -> bool:
    return name == "triton" or name.startswith("triton:")


_IMPLS: dict[str, Callable] = {"gather_sdpa": gather_sdpa, "flex": flex,
                               "gather_flash": gather_flash, "gather_cudnn": gather_cudnn,
                               "triton": triton_paged}
# Candidates ``auto`` measures on CUDA (the pinned-SDPA variants only matter there),
# before the ``FLEX_CONFIGS`` variants. ``triton`` only where triton imports.
CUDA_CANDIDATES = ("gather_sdpa", "gather_flash", "gather_cudnn", "flex") + (
    ("triton",) if triton_available() else ())


def flex_backend(kernel_options: Mapping[str, Any]) -> str:
    """Register ``flex`` with these Triton kernel options; returns the backend name.

    The name lists the options in key order, e.g. ``flex:BLOCK_M=64,BLOCK_N=64``,
    so the same options always give the same name.
    """
    if not kernel_options:
        return "flex"
    opts = dict(sorted(kernel_options.items()))
    name = "flex:" + ",".join(f"{k}={v}" for k, v in opts.items())
    if name not in _IMPLS:
        _IMPLS[name] = functools.partial(flex, kernel_options=opts)
    return name


def is_flex(name: str) -> bool:
    return name == "flex" or name.startswith("flex:")


# -- choosing ----------------------------------------------------------------------

class AttentionDispatch:
    """Runs the configured backend; ``auto`` measures the candidates once per shape."""

    def __init__(self, backend: str = "auto", *, warmup: int = 2, reps: int = 5,
                 tune_on_cpu: bool = False, candidates: tuple[str, ...] | None = None) -> None:
        if backend != "auto" and backend not in _IMPLS:
            raise ValueError(f"unknown attention backend {backend!r}; choose auto or "
                             f"{tuple(_IMPLS)} (flex_backend() registers more)")
        if candidates is None:
            candidates = CUDA_CANDIDATES + tuple(flex_backend(o) for o in FLEX_CONFIGS)
        unknown = [c for c in candidates if c not in _IMPLS]
        if unknown:
            raise ValueError(f"unknown attention candidates {unknown}")
        self.backend = backend
        self.candidates = tuple(dict.fromkeys(candidates))
        self.warmup = warmup
        self.reps = reps
        self.tune_on_cpu = tune_on_cpu  # tests exercise the tuner without a GPU
        # shape key -> {"backend": name, "times_ms": {name: ms or error string}}
        self.choices: dict[tuple, dict] = {}

    def __call__(self, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                 batch: KVBatch, *, scale: float | None = None,
                 backend: str | None = None) -> torch.Tensor:
        name = backend or self.backend
        if name == "auto":
            # Every layer of a tick has the same shapes: choose once per batch.
            memo = ("auto", q.shape, k_pool.shape, q.dtype)
            name = batch.plans.get(memo)
            if name is None:
                name = batch.plans[memo] = self._choose(q, k_pool, v_pool, batch, scale)
        return _IMPLS[name](q, k_pool, v_pool, batch, scale)

    def _choose(self, q, k_pool, v_pool, batch, scale) -> str:
        if q.device.type != "cuda" and not self.tune_on_cpu:
            return "gather_sdpa"
        R = q.shape[0]
        bucket = 1 << max(0, (R - 1).bit_length())
        key = (bucket, *q.shape[1:], *k_pool.shape[1:], q.dtype, max(batch.num_pages))
        hit = self.choices.get(key)
        if hit is not None:
            return hit["backend"]
        times: dict[str, float | str] = {}
        reference = gather_sdpa(q, k_pool, v_pool, batch, scale).float()
        for name in self.candidates:
            impl = _IMPLS[name]
            if is_flex(name) and not flex_supported(k_pool.shape[1]):
                times[name] = "unsupported block size"
                continue
            try:
                # A fast wrong answer is not a candidate: agree with gather + default SDPA.
                err = ((impl(q, k_pool, v_pool, batch, scale).float() - reference).norm()
                       / reference.norm()).item()
                if not err < 2e-2:
                    times[name] = f"disagrees with gather_sdpa: rel err {err:.3g}"
                    continue
                times[name] = _time_ms(lambda: impl(q, k_pool, v_pool, batch, scale),
                                       self.warmup, self.reps)
            except Exception as exc:  # a backend that fails here is simply not chosen
                log.warning("attention backend %s failed for shape %s: %s", name, key, exc)
                times[name] = f"error: {type(exc).__name__}: {exc}"[:300]
        ok = {n: t for n, t in times.items() if isinstance(t, float)}
        if not ok:
            raise RuntimeError(f"no attention backend works for {key}: {times}")
        best = min(ok, key=ok.get)
        self.choices[key] = {"backend": best, "times_ms": times}
        log.info("attention backend for %s: %s (%s)", key, best, times)
        return best


def _time_ms(fn: Callable[[], object], warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    if not torch.cuda.is_available():
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples)
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
