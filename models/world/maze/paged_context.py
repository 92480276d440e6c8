"""``forward_frame``'s attention through kv/'s paged cache (the eager serving path).

A generated frame is ``steps`` denoising passes plus one clean pass, each attending
the row's held pages (sink + window) plus the frame's own page: every pass writes
the frame's K/V into its page and calls ``kv.paged_attention``, which gathers the
held pages again. Gathering them once per frame instead (one buffer per layer kept
across the passes) was measured on CPU and gained nothing: the per-pass gather
leaves the keys hot in cache right before attention reads them, the kept buffers
(19 MB a session) are cold by the next pass (bench/results/maze_cpu_ab_shared.json,
variant ``gather_once=0``, at the commit that had it).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from kv import PagedKVCache
from kv.paged_attention import paged_attention
from models.world.maze.model import FrameContext


class LayerGate:
    """Which layers of a frame's clean pass are done (its K/V written, its reads of older pages over).

    The clean pass of a lone session's frame runs on a CPU lane while the engine starts the
    session's next tick (``MazeWorld``, "clean pass ahead"): that tick's first pass waits here
    before each layer's attention, so it reads the frame's K/V only once written and writes its
    own page (maybe the block of the page the clean pass still reads, freed by the commit)
    only after the clean pass is through that layer.
    """

    def __init__(self, layers: int) -> None:
        self._done = [threading.Event() for _ in range(layers)]
        self.error: BaseException | None = None

    def done(self, layer: int) -> None:
        self._done[layer].set()

    def fail(self, error: BaseException) -> None:
        """The clean pass failed: every waiter wakes and raises."""
        self.error = error
        for e in self._done:
            e.set()

    def close(self, done: Any) -> None:
        """The clean pass ended (``done``: its Future, whose done-callback this is): wake every
        waiter, with an error unless it got through every layer."""
        error = done.exception()
        if error is not None or not all(e.is_set() for e in self._done):
            self.fail(error or RuntimeError("it ended before its last layer"))

    def wait(self, layer: int) -> None:
        self._done[layer].wait()
        if self.error is not None:
            raise RuntimeError(f"the previous frame's clean pass failed: {self.error}") from self.error


class PagedContext(FrameContext):
    """``forward_frame``'s attention through kv/: write the frame's K/V into its page, attend.

    ``after``: wait for that gate's layer before each layer's write and attention; ``marks``:
    mark each layer done on this gate once its K/V is written and attended (``LayerGate``)."""

    def __init__(self, cache: PagedKVCache, batch: Any, *, after: LayerGate | None = None,
                 marks: LayerGate | None = None) -> None:
        self.cache, self.batch = cache, batch
        self.after, self.marks = after, marks
        self.own = [None] * cache.geometry.num_layers  # type: ignore[list-item]

    def keep(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.after is not None:
            self.after.wait(layer)
        self.cache.write(layer, self.batch, k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())
        if self.marks is not None:
            self.marks.done(layer)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.after is not None:
            self.after.wait(layer)
        # model: [B, H, n, hd]; kv: [R, n, H, hd]
        o = paged_attention(q.transpose(1, 2), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(),
                            self.cache, layer, self.batch)
        if self.marks is not None:
            self.marks.done(layer)
        return o.transpose(1, 2)
