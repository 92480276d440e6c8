"""How one block of Matrix-Game attends on the served path: kv/ pages and per-session state.

``PagedBlock`` is the model's ``BlockAttention`` for a begun kv batch (one row per session):

* self-attention: every pass writes the block's K/V into the chunk's scratch pages and
  attends the row's held pages plus the chunk (``kv.paged_attention``). The denoising passes
  overwrite the same pages and the committing pass writes last, as upstream overwrites its
  cache slots, so what ``commit_batch`` keeps is the clean pass's K/V.
* cross-attention: the session's CLIP image K/V from its kv cross slot.
* the action attentions: over the session's ``ActionCache`` (``cache.py``) and the block.
  Rows are grouped by how many frames they hold (only a young session holds fewer), and
  each group attends in one call without a mask: within the window every frame of a block
  sees the same keys. On a committing pass (``commit=True``) the caches each row would hold
  after the block are kept in ``pending`` until the pipeline ends the tick.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

from kv import KVBatch, PagedKVCache
from kv.paged_attention import paged_attention
from models.world.matrix_game.cache import ActionCache, SessionState, action_frames, held_frames
from models.world.matrix_game.config import MatrixGameConfig


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``[B, Lq, H, D]`` over ``[B, Lk, H, D]`` -> ``[B, Lq, H, D]``."""
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


class PagedBlock:
    """One forward's view of the kv batch and the rows' action caches."""

    def __init__(self, cfg: MatrixGameConfig, cache: PagedKVCache, batch: KVBatch,
                 states: Sequence[SessionState], layout: ActionCache, *, commit: bool) -> None:
        self.cfg, self.cache, self.batch = cfg, cache, batch
        self.states = list(states)
        self.layout = layout
        self.commit = commit
        self.starts = batch.start_frames
        self.groups: dict[int, list[int]] = {}
        for r, s in enumerate(self.starts):
            self.groups.setdefault(held_frames(cfg, s), []).append(r)
        # Per row, per action layer: the caches after this block ([2, S, T, H, D], [2, T, H, D]).
        self.pending: list[dict[int, list[torch.Tensor | None]]] = [{} for _ in states]

    # -- BlockAttention ------------------------------------------------------------------------

    def self_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        dt = self.cache.geometry.dtype    # the pool may be narrower than the model computes in
        return paged_attention(q.to(dt), k.to(dt), v.to(dt), self.cache, layer, self.batch).to(q.dtype)

    def cross_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.cross_kv(layer, self.batch)

    def mouse_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        j = self.layout.layer_index[layer]
        out = torch.empty_like(q)
        R, S, Fr, H, D = q.shape
        for rows, idx, kb, vb in self._after_held("mouse", j, k, v, axis=2):   # past: [g, 2, S, T, H, D]
            g = len(rows)
            o = _attend(q.index_select(0, idx).flatten(0, 1), kb.flatten(0, 1), vb.flatten(0, 1))
            out.index_copy_(0, idx, o.view(g, S, Fr, H, D))
            if self.commit:
                self._keep(rows, j, 0, kb, vb, 2)
        return out

    def keyboard_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        j = self.layout.layer_index[layer]
        out = torch.empty_like(q)
        R, S, Fr, H, D = q.shape
        for rows, idx, kb, vb in self._after_held("keyboard", j, k, v, axis=1):   # past: [g, 2, T, H, D]
            g = len(rows)
            # One key per frame, shared by the S x F queries of the row.
            o = _attend(q.index_select(0, idx).reshape(g, S * Fr, H, D), kb, vb)
            out.index_copy_(0, idx, o.view(g, S, Fr, H, D))
            if self.commit:
                self._keep(rows, j, 1, kb, vb, 1)
        return out

    def _after_held(self, cache: str, j: int, k: torch.Tensor, v: torch.Tensor, axis: int
                    ) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per group of rows that hold as many past frames: the rows, their indexes, and their
        block K/V (frames on ``axis``) after the held frames of action layer ``j``'s ``cache``
        (``mouse`` or ``keyboard``: ``[2, ...]``, frames on ``axis``)."""
        for held, rows in self.groups.items():
            idx = torch.tensor(rows, device=k.device)
            kb, vb = k.index_select(0, idx), v.index_select(0, idx)
            if held:
                past = torch.stack([getattr(self.states[r], cache)[j] for r in rows])   # [g, 2, ...]
                past = past.narrow(axis + 1, past.shape[axis + 1] - held, held).to(kb.dtype)
                kb, vb = torch.cat([past[:, 0], kb], axis), torch.cat([past[:, 1], vb], axis)
            yield rows, idx, kb, vb

    def _keep(self, rows: list[int], j: int, which: int, kb: torch.Tensor, vb: torch.Tensor, axis: int) -> None:
        """The last ``action_frames`` frames of held + block, left-padded with zeros while young."""
        T = action_frames(self.cfg)
        kv = torch.stack([kb, vb], 1)                                  # [g, 2, ...frames on axis + 1...]
        ax = axis + 1
        have = kv.shape[ax]
        if have < T:
            pad = list(kv.shape)
            pad[ax] = T - have
            kv = torch.cat([kv.new_zeros(pad), kv], ax)
        kv = kv.narrow(ax, kv.shape[ax] - T, T)
        for n, r in enumerate(rows):
            self.pending[r].setdefault(j, [None, None])[which] = kv[n]

    def keep(self) -> list[list[torch.Tensor]]:
        """Per row the new action cache tensors (keyboard, then mouse), in ``ActionCache``'s layout."""
        if not self.commit:
            raise RuntimeError("only a committing pass keeps action caches")
        out = []
        n = len(self.layout.layer_index)
        for r in range(len(self.states)):
            p = self.pending[r]
            tensors = [torch.stack([p[j][1] for j in range(n)])]
            if self.layout.mouse_shape is not None:
                tensors.append(torch.stack([p[j][0] for j in range(n)]))
            out.append(tensors)
        return out
