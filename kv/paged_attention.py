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
    ``gather_sdpa`` with SDPA pinned to the flash or cuDNN kernel.

``auto`` times every applicable backend on the first batch of each shape (CUDA
events, median of a few runs) and keeps the fastest; on CPU it is
``gather_sdpa``. ``AttentionDispatch.choices`` records what was measured.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from kv.batch import KVBatch

log = logging.getLogger(__name__)

FLEX_TILE = 128
BACKENDS = ("gather_sdpa", "flex", "gather_flash", "gather_cudnn")


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


def gather_sdpa(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: KVBatch,
                scale: float | None = None, sdpa_backend=None) -> torch.Tensor:
    """Gather + SDPA; ``sdpa_backend`` pins one ``SDPBackend`` (default: PyTorch picks)."""
    if sdpa_backend is not None:
        from torch.nn.attention import sdpa_kernel
        with sdpa_kernel([sdpa_backend]):
            return gather_sdpa(q, k_pool, v_pool, batch, scale)
    R, Lq, Hq, D = q.shape
    _, bs, Hkv, _ = k_pool.shape
    gqa = Hq != Hkv
    out = None
    for rows, n, idx in _gather_plan(batch):
        g = R if rows is None else rows.numel()
        k = k_pool.index_select(0, idx).view(g, n * bs, Hkv, D).transpose(1, 2)
        v = v_pool.index_select(0, idx).view(g, n * bs, Hkv, D).transpose(1, 2)
        qg = (q if rows is None else q.index_select(0, rows)).transpose(1, 2)
        o = F.scaled_dot_product_attention(qg, k, v, scale=scale, enable_gqa=gqa).transpose(1, 2)
        if rows is None:
            return o
        if out is None:
            out = q.new_empty(R, Lq, Hq, D)
        out.index_copy_(0, rows, o)
    return out


# -- FlexAttention on the pool ------------------------------------------------------

_compiled_flex: Callable | None = None


def _flex_fn(device: torch.device) -> Callable:
    from torch.nn.attention.flex_attention import flex_attention
    if device.type != "cuda":
        return flex_attention
    global _compiled_flex
    if _compiled_flex is None:
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
    # Like torch's own PagedAttention, the index rows span every tile of the pool
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


def flex(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: KVBatch,
         scale: float | None = None) -> torch.Tensor:
    R, Lq, Hq, D = q.shape
    nb, bs, Hkv, _ = k_pool.shape
    if not flex_supported(bs):
        raise ValueError(f"flex needs block_size % {FLEX_TILE} == 0, got {bs}")
    bm = _flex_block_mask(batch, Lq, nb, bs)
    k = k_pool.view(1, nb * bs, Hkv, D).transpose(1, 2)
    v = v_pool.view(1, nb * bs, Hkv, D).transpose(1, 2)
    out = _flex_fn(q.device)(q.transpose(1, 2), k, v, block_mask=bm, scale=scale,
                             enable_gqa=Hq != Hkv)
    return out.transpose(1, 2)


def _gather_flash(q, k_pool, v_pool, batch, scale=None):
    from torch.nn.attention import SDPBackend
    return gather_sdpa(q, k_pool, v_pool, batch, scale, SDPBackend.FLASH_ATTENTION)


def _gather_cudnn(q, k_pool, v_pool, batch, scale=None):
    from torch.nn.attention import SDPBackend
    return gather_sdpa(q, k_pool, v_pool, batch, scale, SDPBackend.CUDNN_ATTENTION)


_IMPLS: dict[str, Callable] = {"gather_sdpa": gather_sdpa, "flex": flex,
                               "gather_flash": _gather_flash, "gather_cudnn": _gather_cudnn}
# Candidates ``auto`` measures on CUDA (the pinned-SDPA variants only matter there).
_CUDA_CANDIDATES = ("gather_sdpa", "gather_flash", "gather_cudnn", "flex")


# -- choosing ----------------------------------------------------------------------

class AttentionDispatch:
    """Runs the configured backend; ``auto`` measures the candidates once per shape."""

    def __init__(self, backend: str = "auto", *, warmup: int = 2, reps: int = 5,
                 tune_on_cpu: bool = False) -> None:
        if backend != "auto" and backend not in _IMPLS:
            raise ValueError(f"unknown attention backend {backend!r}; choose auto or {BACKENDS}")
        self.backend = backend
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
            name = self._choose(q, k_pool, v_pool, batch, scale)
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
        for name in _CUDA_CANDIDATES:
            impl = _IMPLS[name]
            if name == "flex" and not flex_supported(k_pool.shape[1]):
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
