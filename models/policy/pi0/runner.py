"""One pi0 call for a batch of robots: the prefix once, then the Euler loop (a CUDA graph on CUDA).

Batches are padded up to a bucket (1, 2, 4, 8, then every 8 up to ``max_batch``: the
prefix's arithmetic grows with the padded batch, so 17 robots pay for 24, not 32) so
that every shape in a call is fixed per bucket: the prefix is always
``cameras * 256 + 48`` tokens (the prompt is padded to 48) and the suffix 51. Each
bucket owns static buffers (the per-layer K/V of prefix + suffix, the prefix's
padding mask, the state, the noise); the prefix runs eagerly and writes its K/V
into the bucket's buffer, and the 10 expert passes (18 layers each, bound by kernel
launches when run eagerly) replay as one captured graph per (bucket, steps) that
reads those buffers. The graphs share one memory pool: they never run at once.

With ``graph_prefix`` (the default on CUDA) the prefix joins the graph too: the
bucket then also holds static images, tokens and their mask, a call copies its
inputs in and replays one graph. The prefix is some 800 kernels (SigLIP's 27
layers over every camera, Gemma-2B's 18), so at one robot its launch time is
comparable to its arithmetic. If the prefix cannot be captured (a library change),
it falls back to eager and says so once.

With ``compile`` (the default with graphs) the layers of both Gemma stacks and of SigLIP
run as ``torch.compile``d functions (layers.py) inside those graphs: inductor fuses each
layer's element-wise kernels, the graph removes the launches. Compilation happens in
the warm-up runs before a capture (two traces per layer function: batch 1, then one
symbolic in the batch for every larger bucket). If compiling or capturing the compiled layers
fails, the runner says so once and carries on with the eager layers in its graphs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from models.policy.pi0 import layers
from models.policy.pi0.model import Pi0Model, suffix_ar

log = logging.getLogger(__name__)

# Distinct (bucket, steps) graphs kept; robots asking for unusual step counts run eagerly beyond this.
MAX_GRAPHS = 24


def buckets_for(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then multiples of 8 below ``max_batch``, then ``max_batch``:
    12 -> (1, 2, 4, 8, 12); 32 -> (1, 2, 4, 8, 16, 24, 32)."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b = b * 2 if b < 8 else b + 8
    return (*out, max_batch)


@dataclass
class _Bucket:
    size: int
    kv: torch.Tensor
    prefix_pad: torch.Tensor
    state: torch.Tensor
    noise: torch.Tensor
    ar: torch.Tensor
    graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = field(default_factory=dict)  # loop only
    whole: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = field(default_factory=dict)  # prefix + loop
    # Static prefix inputs (graph_prefix only): images, tokens, token mask.
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


class Pi0Runner:
    """Owns the device buffers; ``run`` is called by the engine thread only."""

    def __init__(self, model: Pi0Model, device: torch.device, max_batch: int, *, use_graphs: bool | None = None,
                 graph_prefix: bool = True, compile: bool | None = None, weight_stream: bool = True) -> None:
        self.model, self.device = model, device
        self.buckets = buckets_for(max_batch)
        self.use_graphs = device.type == "cuda" if use_graphs is None else use_graphs
        self.graph_prefix = graph_prefix and self.use_graphs
        want_compile = self.use_graphs if compile is None else compile
        # weight_stream=False: F.linear for every Gemma matmul (skinny_linear.py; the benchmarks' cuBLAS row).
        self.weight_stream = weight_stream
        self.fns: layers.LayerFns = (layers.compiled(weight_stream=weight_stream) if want_compile
                                     else layers.eager(weight_stream))
        self._buckets: dict[int, _Bucket] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.graph_count = 0
        # Filled by run(): milliseconds of the last call's prefix and expert loop (CUDA events
        # on CUDA, so the split is measured without an extra synchronisation).
        self.last_split_ms: tuple[float, float] | None = None
        self.time_split = False

    def bucket_of(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"batch of {n} is over max_batch {self.buckets[-1]}")

    def _bucket(self, size: int) -> _Bucket:
        bk = self._buckets.get(size)
        if bk is None:
            cfg, dev = self.model.cfg, self.device
            ar = torch.tensor([0] * cfg.prefix_len + suffix_ar(cfg.chunk_size), device=dev)[None].expand(size, -1)
            bk = _Bucket(
                size=size,
                kv=self.model.kv_buffer(size, dev),
                prefix_pad=torch.zeros(size, cfg.prefix_len, dtype=torch.bool, device=dev),
                state=torch.zeros(size, cfg.max_state_dim, dtype=torch.float32, device=dev),
                noise=torch.zeros(size, cfg.chunk_size, cfg.max_action_dim, dtype=torch.float32, device=dev),
                ar=ar.contiguous(),
            )
            self._buckets[size] = bk
        return bk

    def _loop(self, bk: _Bucket, steps: int, present: tuple[int, ...] | None = None) -> torch.Tensor:
        m = self.model
        if present is not None and bk.inputs is not None:
            embs, pad = m.embed_prefix(bk.inputs[0], present, bk.inputs[1], bk.inputs[2], self.fns)
            m.prefix_kv(embs, pad, bk.kv, self.fns)
            bk.prefix_pad.copy_(pad)
        state_emb, mask, cos, sin = m.suffix_inputs(bk.state, bk.prefix_pad, bk.ar)
        return m.sample(bk.noise, steps, state_emb, bk.kv, mask, cos, sin, self.fns)

    def _graph(self, bk: _Bucket, steps: int,
               present: tuple[int, ...] | None) -> tuple[torch.cuda.CUDAGraph, torch.Tensor] | None:
        table = bk.graphs if present is None else bk.whole
        hit = table.get(steps)
        if hit is not None or not self.use_graphs or self.graph_count >= MAX_GRAPHS:
            return hit
        try:
            return self._capture(bk, steps, present, table)
        except Exception as exc:  # noqa: BLE001 - any compiler failure: keep serving with eager layers
            if not self.fns.compiled:
                raise
            log.warning("pi0: compiled layers failed (%s: %s); graphs use the eager layers from now on",
                        type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            self._drop_compiled()
            return self._capture(bk, steps, present, table)

    def _drop_compiled(self) -> None:
        torch.cuda.synchronize(self.device)
        self.fns = layers.eager(self.weight_stream)
        for bucket in self._buckets.values():
            bucket.graphs.clear()
            bucket.whole.clear()
        self.graph_count = 0

    def _capture(self, bk: _Bucket, steps: int, present: tuple[int, ...] | None,
                 table: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        self.model.time_bias(steps)  # cached outside the capture, so the graph reads a fixed tensor
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: cuBLAS handles and workspaces before capture
                self._loop(bk, steps, present)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._loop(bk, steps, present)
        table[steps] = (graph, out)
        self.graph_count += 1
        log.info("pi0: captured %s for batch %d, %d steps (%d graphs, %s layers)",
                 "the whole call" if present is not None else "the expert loop", bk.size, steps, self.graph_count,
                 "compiled" if self.fns.compiled else "eager")
        return table[steps]

    def run(self, images: torch.Tensor, present: tuple[int, ...], tokens: torch.Tensor, token_valid: torch.Tensor,
            state: torch.Tensor, noise: torch.Tensor, steps: list[int]) -> torch.Tensor:
        """Inputs already padded to a bucket size, on the device -> actions [B, chunk, max_action_dim] float32.

        images [B, C, 3, H, W] in [-1, 1] for the cameras in ``present``; ``steps`` per row."""
        m, b = self.model, tokens.shape[0]
        bk = self._bucket(b)
        distinct = sorted(set(steps))
        if self.graph_prefix and len(distinct) == 1 and not self.time_split:
            out = self._whole(bk, images, present, tokens, token_valid, state, noise, distinct[0])
            if out is not None:
                return out
        timing = self.time_split and self.device.type == "cuda"
        if timing:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            ev[0].record()
        embs, pad = m.embed_prefix(images, present, tokens, token_valid, self.fns)
        m.prefix_kv(embs, pad, bk.kv, self.fns)
        bk.prefix_pad.copy_(pad)
        bk.state.copy_(state)
        bk.noise.copy_(noise)
        if timing:
            ev[1].record()
        if len(distinct) == 1:
            graph = self._graph(bk, distinct[0], None)
            if graph is not None:
                graph[0].replay()
                out = graph[1].clone()
            else:
                out = self._loop(bk, distinct[0])
        else:
            # Robots asked for different step counts: one eager loop per count over its rows.
            out = torch.empty_like(bk.noise)
            state_emb, mask, cos, sin = m.suffix_inputs(bk.state, bk.prefix_pad, bk.ar)
            for s in distinct:
                rows = torch.tensor([i for i, x in enumerate(steps) if x == s], device=self.device)
                kv = bk.kv.index_select(2, rows)
                out[rows] = m.sample(bk.noise[rows], s, state_emb[rows], kv, mask[rows], cos[rows], sin[rows],
                                     self.fns)
        if timing:
            ev[2].record()
            ev[2].synchronize()
            self.last_split_ms = (ev[0].elapsed_time(ev[1]), ev[1].elapsed_time(ev[2]))
        return out

    def _whole(self, bk: _Bucket, images: torch.Tensor, present: tuple[int, ...], tokens: torch.Tensor,
               token_valid: torch.Tensor, state: torch.Tensor, noise: torch.Tensor, steps: int) -> torch.Tensor | None:
        """Prefix and loop as one graph; None (and eager from then on) if capture fails."""
        if bk.inputs is None:
            bk.inputs = (torch.empty_like(images), torch.empty_like(tokens), torch.empty_like(token_valid))
        for dst, src in zip(bk.inputs, (images, tokens, token_valid)):
            dst.copy_(src)
        bk.state.copy_(state)
        bk.noise.copy_(noise)
        try:
            graph = self._graph(bk, steps, present)
        except RuntimeError as exc:  # capture refused by some kernel: keep serving, eagerly
            log.warning("pi0: cannot capture the prefix in a CUDA graph (%s); prefix runs eagerly", exc)
            self.graph_prefix = False
            bk.whole.clear()
            torch.cuda.synchronize(self.device)
            return None
        if graph is None:
            return self._loop(bk, steps, present)
        graph[0].replay()
        return graph[1].clone()
