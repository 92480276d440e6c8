"""One frame of a maze batch from static buffers: fixed-width masked paged attention, CUDA graphs.

Eager serving costs ~2,200 kernel launches per frame (``steps`` denoising passes
+ the clean pass, 8 layers each), so on a fast GPU the host is the bottleneck.
``FrameRunner`` runs the same passes on tensors whose shapes and addresses never
change, so on CUDA the whole frame is captured once per batch-size bucket and
replayed with one launch. kv/ still owns the pages: ``begin_batch`` allocates
the frame's page before the replay and commit / abort / prune stay outside it.

Every row attends a fixed ``W = sink + window + 1`` pages, read from the batch's
null-padded block table (kv's ``KVBatch.index``); pages it does not hold yet are
the null block, masked out. Pad rows (the batch padded up to its bucket) write
and attend kv's pad block only; their outputs are dropped::

    row   block table (W = 6)          key mask          chunk (written)
    0     [s, w1, w2, w3, w4, c0]      1 1 1 1 1 1       c0
    1     [s, w1, c1, 0, 0, 0]         1 1 1 0 0 0       c1
    pad   [pad, 0, 0, 0, 0, 0]         1 0 0 0 0 0       pad

(each mask entry covers one page's ``block_size`` keys). The unmasked keys are
the eager path's keys in the same order, so the result equals
``kv.paged_attention``'s up to float rounding.

On CUDA with triton, attention is ``kv.triton_paged`` instead: it reads each
row's first ``lengths[r]`` pages straight from the pool (same table, no gather,
no mask), split over the pages when the batch is small. Its split count and
tiles depend on shapes only, so it is captured like the rest. The gather +
masked SDPA path stays for CPU, for machines without triton and as
``attention="sdpa"``.

On CPU (and in tests) the same code runs without capture.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from kv.triton_paged import HEAD_DIMS, paged_attention_triton, triton_available
from models.maze.sim import H, W
from models.world.maze.model import FrameContext, MazeDiT
from models.world.maze.rollout import SamplerConfig, denoise_frame, frame_noise, to_u8

log = logging.getLogger(__name__)


def graph_buckets(max_batch: int) -> tuple[int, ...]:
    """Padded batch sizes: powers of two below ``max_batch``, then ``max_batch`` (1, 2, 4, ..., 32)."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    out.append(max_batch)
    return tuple(out)


def bucket_for(rows: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket holding ``rows`` rows; None when none does (run eagerly)."""
    for b in buckets:
        if b >= rows:
            return b
    return None


class StaticPagedContext(FrameContext):
    """``forward_frame``'s attention over fixed-width page tables with a key mask (graph-safe).

    ``index``: a ``KVBatch.index`` layout ``[lengths (R) | cross slots (R) | tables (R x W)]``
    int32 on the device; each frame is one page (``block_size == tokens``). Everything is
    derived on the device, so nothing here reads back to the host.

    ``attention``: ``"triton"`` (``kv.triton_paged`` on the pool), ``"sdpa"`` (gather +
    masked SDPA) or ``"auto"``: triton on CUDA when it imports and supports the head dim, else sdpa.
    """

    def __init__(self, k_pool: list[torch.Tensor], v_pool: list[torch.Tensor], index: torch.Tensor,
                 rows: int, *, attention: str = "auto") -> None:
        if attention == "auto":
            fits = index.is_cuda and triton_available() and k_pool[0].shape[-1] in HEAD_DIMS
            attention = "triton" if fits else "sdpa"
        if attention not in ("triton", "sdpa"):
            raise ValueError(f"attention must be auto, triton or sdpa, got {attention!r}")
        self.attention = attention
        self.k_pool, self.v_pool = k_pool, v_pool            # per layer [num_blocks, bs, H, D]
        bs = k_pool[0].shape[1]
        W = index.numel() // rows - 2
        self.lengths = index[:rows]                          # int32 views of the static index
        self.page_tables = index[2 * rows:].view(rows, W)
        lengths = self.lengths.long()
        tables = self.page_tables.long()
        self.chunk = tables.gather(1, (lengths - 1)[:, None]).reshape(rows)   # the frame's own page
        if attention == "sdpa":
            self.tables = tables.reshape(-1)                 # [R * W]
            valid = torch.arange(W, device=index.device)[None, :] < lengths[:, None]
            self.mask = valid.repeat_interleave(bs, 1)[:, None, None, :]     # [R, 1, 1, W * bs]
        self.own = [None] * len(k_pool)  # type: ignore[list-item]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # model layout [R, H, n, D]; pool layout [blocks, n, H, D]
        R, H, n, D = k.shape
        kp, vp = self.k_pool[layer], self.v_pool[layer]
        kp.index_copy_(0, self.chunk, k.transpose(1, 2).reshape(R, n, H, D))
        vp.index_copy_(0, self.chunk, v.transpose(1, 2).reshape(R, n, H, D))
        if self.attention == "triton":
            # [R, n, H, D] views in and out: the caller's transpose + reshape back is free.
            return paged_attention_triton(q.transpose(1, 2), kp, vp, self.page_tables,
                                          self.lengths).transpose(1, 2)
        keys = kp.index_select(0, self.tables).view(R, -1, H, D).transpose(1, 2)
        vals = vp.index_select(0, self.tables).view(R, -1, H, D).transpose(1, 2)
        return F.scaled_dot_product_attention(q, keys, vals, attn_mask=self.mask)


class FrameRunner:
    """Makes one frame for a batch padded to ``rows`` rows, from static input and output buffers.

    ``run`` fills the inputs, then runs the passes: eagerly when ``capture`` is False, else
    through a CUDA graph captured on first use (warmed up on a side stream first; ``pool`` is
    shared by every bucket's graph). ``attention``: see ``StaticPagedContext``.

    The inputs (frame indexes, seeds, actions, kv's index) are views of one device block,
    filled from one pinned host block in a single copy. Every torch call before the replay
    drops and retakes the GIL; while the event loop sends the last batch's chunks each
    retake waits for the loop, up to a switch interval, so the served tick paid the loop's
    whole send time before its graph started (bench/world/host_maze.py measures it on CPU).
    One copy instead of eight ``copy_``/``zero_`` calls on slices, and the noise made inside
    the passes from the rows' seeds and frame indexes (``rollout.frame_noise``): no draw,
    and no generator state, outside the graph.
    """

    def __init__(self, model: MazeDiT, cache: Any, sampler: SamplerConfig, rows: int, dtype: torch.dtype,
                 *, capture: bool, pool: Any = None, attention: str = "auto") -> None:
        dev = cache.device
        self.model, self.cache, self.sampler, self.rows, self.dtype = model, cache, sampler, rows, dtype
        self.capture, self.pool, self.attention = capture, pool, attention
        width = cache.max_held_pages + 1
        n_index = rows * (2 + width)
        self._nbytes = _input_bytes(rows, n_index)
        self.inputs = torch.zeros(self._nbytes, dtype=torch.uint8, device=dev)
        self.frames, self.seeds, self.actions, self.index = _input_views(self.inputs, rows, n_index)
        cuda = dev.type == "cuda"
        self.staging = torch.zeros(self._nbytes, dtype=torch.uint8, pin_memory=cuda)
        self._host = [t.numpy() for t in _input_views(self.staging, rows, n_index)]
        self._copied: Any = torch.cuda.Event() if cuda else None  # the staging block is free again
        self.out = torch.zeros(rows, H, W, 3, dtype=torch.uint8, device=dev)
        self.graph: Any = None

    def _body(self) -> None:
        st = self.cache.storage
        ctx = StaticPagedContext(st.k, st.v, self.index, self.rows, attention=self.attention)
        noise = frame_noise(self.seeds, self.frames)  # pad rows: seed 0, frame 0, dropped
        x0 = denoise_frame(self.model, ctx, self.actions, self.frames, self.sampler, noise=noise)
        if not self.sampler.kv_from_last:  # else the last denoising pass's K/V stay in the page
            zeros = torch.zeros(self.rows, device=self.frames.device)
            self.model.forward_frame(x0.to(self.dtype), zeros, self.actions, self.frames, self.frames == 0, ctx)
        self.out.copy_(to_u8(x0))

    def _capture(self) -> None:  # pragma: no cover - CUDA only
        # Warm-up passes write the in-flight frames' pages, which the replay overwrites.
        side = torch.cuda.Stream(self.index.device)
        side.wait_stream(torch.cuda.current_stream(self.index.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._body()
        torch.cuda.current_stream(self.index.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self._body()
        self.graph = graph
        log.info("maze frame graph captured for %d rows", self.rows)

    @torch.no_grad()
    def run(self, batch: Any, actions: np.ndarray, frames: np.ndarray, seeds: np.ndarray) -> torch.Tensor:
        """``batch``: kv's ``KVBatch`` padded to ``rows`` (its ``host_index`` is what is read);
        actions float32 [B, 8], frame indexes [B] and the sessions' seeds [B] (int64, the
        noise's) on the host.

        Returns the frames [B, 64, 64, 3] uint8: a view of the output buffer, valid until the next run.
        """
        B = len(frames)
        h_frames, h_seeds, h_actions, h_index = self._host
        if batch.host_index.shape != h_index.shape:
            raise ValueError(f"a batch of {batch.size} rows for a runner of {self.rows}")
        if self._copied is not None:
            self._copied.synchronize()  # the last run's copy has left the staging block
        h_frames[:B] = frames
        h_frames[B:] = 0
        h_seeds[:B] = seeds
        h_seeds[B:] = 0
        h_actions[:B] = actions
        h_actions[B:] = 0
        h_index[:] = batch.host_index
        self.inputs.copy_(self.staging, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        if not self.capture:
            self._body()
        else:  # pragma: no cover - CUDA only
            if self.graph is None:
                self._capture()
            self.graph.replay()
        return self.out[:B]


# Each input starts on this boundary in the block, as a fresh allocation would (kernels that
# vectorise their loads check the alignment).
_ALIGN = 256


def _offsets(rows: int, n_index: int) -> tuple[int, int, int, int]:
    """Byte offsets of the seeds, the actions and the kv index in the input block, and its size."""
    up = lambda n: -(-n // _ALIGN) * _ALIGN  # noqa: E731
    s = up(rows * 8)
    a = s + up(rows * 8)
    b = a + up(rows * 8 * 4)
    return s, a, b, b + up(n_index * 4)


def _input_bytes(rows: int, n_index: int) -> int:
    return _offsets(rows, n_index)[3]


def _input_views(block: torch.Tensor, rows: int, n_index: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``block``'s frame indexes int64 [rows], seeds int64 [rows], actions float32 [rows, 8],
    kv index int32 [n_index]."""
    s, a, b, _ = _offsets(rows, n_index)
    return (block[:rows * 8].view(torch.int64), block[s:s + rows * 8].view(torch.int64),
            block[a:a + rows * 32].view(torch.float32).view(rows, 8),
            block[b:b + n_index * 4].view(torch.int32))
