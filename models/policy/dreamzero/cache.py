"""DreamZero's kv/ geometry, its per-session model-owned state, and the DiT's view of the pool.

One kv *frame* is one latent frame (880 tokens at DROID's 352 x 640, one block), each session
has two *branches* (the task prompt and Wan's default negative prompt, CFG), and a call is one
kv tick. The window (``window.plan_call``) maps onto kv/'s sink + window like this, for DROID
(chunks of 2, ``local_attn_size`` 9)::

    call   kv chunk                         held after commit (each branch)
    0      frame 0, restart, 1 frame        [0]
    1      frames 1 2                       [0 | 1 2]
    2      frames 3 4                       [0 | 1 2 3 4]
    3      frames 5 6                       [0 | 1 2 3 4 5 6]            7 = sink 1 + window 6
    4      frame 0, restart, 1 frame        [0]      (the old 7 pages freed at commit)

so ``sink_frames`` = 1, ``window_frames`` = local_attn_size - 1 - num_frame_per_block = 6 (the
denoised chunk fills the attention window's last 2 frames and is never kept), nothing ever
leaves the window between restarts, and ``frames_per_tick`` = 2 (a restart writes 1).
A restart is ``begin_batch(restart=True)``: the old pages stay until the tick commits.

A call's passes attend the pool through ``KVBatch``es (``PagedRows``): one for its restarting
sessions and one for its continuing ones (a kv batch's chunks write one number of frames).
The ``t = 0`` pass of each writes its frames' K/V into the chunk's blocks and attends held +
chunk; each denoising pass, one forward over every session of the call, attends held + chunk
plus its own noisy frames and 24 action + 1 state tokens as transient K/V
(``PagedKVCache.attend_with``), which the pool never holds.

No worker slot: the denoising passes' own K/V are activations (one layer at a time), so
capacity counts none (``KVGeometry.worker_slot``). At DROID's size (40 layers, 40 heads of
128, bf16), a page (one frame, both K and V, every layer) is 720,896,000 bytes and a session
holds 2 branches x 7 pages + its state (1,262,464,000 bytes: 2 branches x 40 layers x K, V x
(512 + 257) tokens x 5120 x 2 bytes, and ``y``, 2,534,400 bytes in float32): 11,355,008,000
bytes, what ``kv.session_bytes`` counts and what a swap moves (``tests/kv/test_capacity.py``).

Cross-attention K/V (per branch: text_len text + 257 CLIP tokens, every layer) and the
window's I2V condition ``y`` are constant between restarts: ``SessionState``, model-owned
state (``kv.model_state``) that Residency swaps with the session's blocks.

Over two or more ranks (``models/world/parallel``) a rank's pool and state hold its share:
under Ulysses (``heads_split`` = N) its ``heads / N`` heads of both branches' pages and cross
K/V; under a CFG split (``branches`` of one) its branch's pages and cross K/V, every head. ``y``
is whole on every rank. The geometry says so, so capacity and admission count one rank's bytes.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from kv import KVBatch, KVGeometry, PagedKVCache, TensorState
from models.policy.dreamzero.config import DreamZeroConfig
from models.policy.dreamzero.model import CrossKV
from models.world.parallel.ulysses import check_heads

BRANCHES = ("conditional", "negative")


def window_frames(cfg: DreamZeroConfig) -> int:
    """Frames after the sink a session holds at most between calls (6 for DROID)."""
    return cfg.local_attn_size - 1 - cfg.num_frame_per_block


def state_shapes(cfg: DreamZeroConfig, image_tokens: int, latent_hw: tuple[int, int], *,
                 branches: int = len(BRANCHES), heads_split: int = 1) -> list[tuple[tuple[int, ...], bool]]:
    """``SessionState``'s tensors as ``(shape, in the DiT's dtype)`` (else float32): cross K, V
    of the text and of the image, ``[branches, layers, tokens, heads, head_dim]``, then ``y``
    (``heads_split``: ranks sharing the heads, each holding ``heads / heads_split``)."""
    B, L, H, D = branches, cfg.num_layers, check_heads(cfg.num_heads, heads_split), cfg.head_dim
    text, image = (B, L, cfg.text_len, H, D), (B, L, image_tokens, H, D)
    y = (1, cfg.in_dim - cfg.out_dim, cfg.condition_latents, *latent_hw)   # mask + first-frame latents
    return [(text, True), (text, True), (image, True), (image, True), (y, False)]


def state_bytes(cfg: DreamZeroConfig, image_tokens: int, latent_hw: tuple[int, int], dtype: torch.dtype, *,
                branches: int = len(BRANCHES), heads_split: int = 1) -> int:
    """Bytes of one session's ``SessionState`` (capacity's ``model_state_bytes``)."""
    item = torch.empty((), dtype=dtype).element_size()
    shapes = state_shapes(cfg, image_tokens, latent_hw, branches=branches, heads_split=heads_split)
    return sum(math.prod(shape) * (item if dit else 4) for shape, dit in shapes)


def kv_geometry(cfg: DreamZeroConfig, latent_hw: tuple[int, int], *, image_tokens: int,
                dtype: torch.dtype = torch.bfloat16, block_size: int | None = None,
                branches: tuple[str, ...] = BRANCHES, heads_split: int = 1) -> KVGeometry:
    """What kv/ plans and stores for DreamZero at one latent size (module docstring): one
    process's, or one rank's (``heads_split`` ranks sharing the heads, or ``branches`` the
    rank's CFG branch)."""
    ph, pw = cfg.patch_size[1:]
    tokens = (latent_hw[0] // ph) * (latent_hw[1] // pw)
    return KVGeometry(num_layers=cfg.num_layers, kv_heads=check_heads(cfg.num_heads, heads_split),
                      head_dim=cfg.head_dim, tokens_per_frame=tokens, block_size=block_size or tokens,
                      sink_frames=1, window_frames=window_frames(cfg), frames_per_tick=cfg.num_frame_per_block,
                      span_frames=1, dtype=dtype, branches=branches, worker_slot=False,
                      model_state_bytes=state_bytes(cfg, image_tokens, latent_hw, dtype, branches=len(branches),
                                                    heads_split=heads_split))


class SessionState(TensorState):
    """A window's cross K/V (both branches, every layer) and its I2V condition ``y``."""

    @classmethod
    def build(cls, branches: Sequence[list[CrossKV]], y: torch.Tensor) -> "SessionState":
        """``branches``: per branch, every layer's ``CrossKV`` of one row; ``y [1, C, F, h, w]``."""
        def stack(field: str) -> torch.Tensor:
            return torch.stack([torch.stack([getattr(c, field)[0] for c in layers]) for layers in branches])
        return cls([stack("k"), stack("v"), stack("k_img"), stack("v_img"), y.float()])

    @property
    def y(self) -> torch.Tensor:
        return self.tensors[4]

    def cross(self, branch: int) -> list[CrossKV]:
        """Every layer's cross K/V of ``branch``, one row (views, no copy)."""
        k, v, ki, vi = self.tensors[:4]
        return [CrossKV(k[branch, i][None], v[branch, i][None], ki[branch, i][None], vi[branch, i][None])
                for i in range(k.shape[1])]


def cross_rows(states: Sequence[SessionState], branch: int) -> list[CrossKV]:
    """One branch's cross K/V over several sessions: rows in ``states`` order."""
    per = [s.cross(branch) for s in states]
    if len(per) == 1:
        return per[0]
    return [CrossKV(*(torch.cat([getattr(p[i], f) for p in per]) for f in ("k", "v", "k_img", "v_img")))
            for i in range(len(per[0]))]


class PagedRows:
    """The self-attention of one call's forwards over kv/'s pool (``model.PagedSelfKV``).

    The DiT stacks its rows branch-major (every session's conditional row, then every
    negative one: ``denoise``'s CFG split); a ``KVBatch`` is session-major (each session's
    branches in turn). The forward's sessions are ``batches``' sessions in order: a call's
    restarting sessions and its continuing ones are two kv batches (their chunks write 1 and
    2 frames), and a denoising pass attends each batch's rows through it::

        model rows   [ cond: s0 s1 s2 | neg: s0 s1 s2 ]      batches (s0), (s1 s2)
        batch 0      s0c s0n                 <- model rows 0, 3
        batch 1      s1c s1n s2c s2n         <- model rows 1, 4, 2, 5

    Rows are reordered into each batch's order and back. Within a batch, rows may hold
    different numbers of pages (sessions at different window positions); kv/'s attention
    groups them. ``write=True`` is the ``t = 0`` pass (one batch): its video K/V go into the
    chunk's blocks. The branches are the pool's (one on a rank of a CFG split).
    """

    def __init__(self, cache: PagedKVCache, batches: KVBatch | Sequence[KVBatch], *, write: bool) -> None:
        batches = [batches] if isinstance(batches, KVBatch) else list(batches)
        if not batches or (write and len(batches) != 1):
            raise ValueError(f"a t = 0 pass writes one kv batch, a denoising pass attends one or more; "
                             f"got {len(batches)}")
        self.cache, self.write = cache, write
        B = cache.geometry.num_branches
        S = sum(len(b.session_ids) for b in batches)
        self._parts: list[tuple[KVBatch, torch.Tensor | None]] = []
        offset = 0
        for batch in batches:
            n = len(batch.session_ids)
            # batch row r = s * B + b holds model row b * S + offset + s
            order = [(r % B) * S + offset + r // B for r in range(n * B)]
            identity = order == list(range(S * B))
            self._parts.append((batch, None if identity else torch.tensor(order, device=cache.device)))
            offset += n
        self._to_model = None
        if len(self._parts) == 1 and self._parts[0][1] is not None:
            self._to_model = torch.argsort(self._parts[0][1])

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               video_tokens: int) -> torch.Tensor:
        if self.write:
            batch, to_batch = self._parts[0]
            if to_batch is not None:
                q, k, v = (t.index_select(0, to_batch) for t in (q, k, v))
            if k.shape[1] != video_tokens:
                raise ValueError("a t = 0 pass writes video tokens only")
            self.cache.write(layer, batch, k, v)
            o = self.cache.attend(q, layer, batch)
            return o if self._to_model is None else o.index_select(0, self._to_model)
        if len(self._parts) == 1:
            batch, to_batch = self._parts[0]
            if to_batch is not None:
                q, k, v = (t.index_select(0, to_batch) for t in (q, k, v))
            o = self.cache.attend_with(q, layer, batch, k, v)
            return o if self._to_model is None else o.index_select(0, self._to_model)
        out = None
        for batch, to_batch in self._parts:
            qb, kb, vb = (t.index_select(0, to_batch) for t in (q, k, v))
            o = self.cache.attend_with(qb, layer, batch, kb, vb)
            if out is None:
                out = o.new_empty(q.shape[0], *o.shape[1:])
            out.index_copy_(0, to_batch, o)
        return out
