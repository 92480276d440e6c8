"""Sink + rolling-window K/V rows for the maze DiT (one row per session or rollout).

Each row holds, for every layer, the keys/values of its sink frame (frame 0) and
of its ``window`` most recent frames in a ring:

    slot:        0      1      2    ...   window
    holds:     sink   f=1+kW  f=2+kW ...  f=W+kW      (k = 0, 1, ...)

    frame f >= 1 goes to slot 1 + (f - 1) % window, replacing frame f - window.

Keys are stored already rotated (time angle of ``f % 64``; the sink's time
dims zeroed), so the order of slots never matters to attention and nothing is
rewritten when the window rolls.

``FrameCache.view()`` hands the model a ``FrameContext`` over the pool's own
tensors (evaluation: every row, kept at once). Serving does not use this cache:
it runs on kv/'s paged cache (``models/world/maze/adapter.py``).
"""

from __future__ import annotations

import torch

from models.world.maze.model import FrameContext, MazeDiTConfig


def window_slot(frame: int, window: int) -> int:
    """The ring slot of ``frame``: 0 for the sink, else 1 + (frame - 1) % window."""
    return 0 if frame == 0 else 1 + (frame - 1) % window


def window_slots(frames: torch.Tensor, window: int) -> torch.Tensor:
    """``window_slot`` for a tensor of frame indices."""
    return torch.where(frames == 0, torch.zeros_like(frames), 1 + torch.remainder(frames - 1, window))


class CacheView(FrameContext):
    """A FrameContext over [B] rows whose own clean K/V can be written into a slot."""

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor], slot_valid: torch.Tensor, tokens: int) -> None:
        self.slot_valid = slot_valid                      # [B, slots] bool
        self.tokens = tokens
        super().__init__(k, v, slot_valid.repeat_interleave(tokens, 1))

    def put(self, frames: torch.Tensor, window: int, own: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Write each row's frame K/V (``own[layer]`` = (k, v) [B, H, n, hd]) into the slot of ``frames`` [B]."""
        n = self.tokens
        slots = window_slots(frames, window)
        b = torch.arange(len(frames), device=frames.device)
        tok = slots[:, None] * n + torch.arange(n, device=frames.device)[None]   # [B, n]
        for layer, (k, v) in enumerate(own):
            self.k[layer][b[:, None], :, tok] = k.transpose(1, 2).to(self.k[layer].dtype)
            self.v[layer][b[:, None], :, tok] = v.transpose(1, 2).to(self.v[layer].dtype)
        self.slot_valid[b, slots] = True
        self.set_valid(self.slot_valid.repeat_interleave(n, 1))


class FrameCache:
    """``rows`` rows of sink + ``window`` frames of K/V for every layer."""

    def __init__(self, cfg: MazeDiTConfig, rows: int, window: int, device: torch.device | str,
                 dtype: torch.dtype = torch.float32) -> None:
        self.cfg, self.rows, self.window = cfg, rows, window
        self.device = torch.device(device)
        n = cfg.tokens
        shape = (rows, cfg.heads, (1 + window) * n, cfg.head_dim)
        self.k = [torch.zeros(shape, device=self.device, dtype=dtype) for _ in range(cfg.depth)]
        self.v = [torch.zeros(shape, device=self.device, dtype=dtype) for _ in range(cfg.depth)]
        self.slot_valid = torch.zeros(rows, 1 + window, dtype=torch.bool, device=self.device)

    @property
    def bytes_per_row(self) -> int:
        return 2 * sum(t[0].numel() * t.element_size() for t in self.k)

    def clear(self, rows: torch.Tensor) -> None:
        self.slot_valid[rows] = False

    def clone(self) -> "FrameCache":
        """An independent copy (counterfactual rollouts from one context)."""
        c = FrameCache.__new__(FrameCache)
        c.cfg, c.rows, c.window, c.device = self.cfg, self.rows, self.window, self.device
        c.k = [t.clone() for t in self.k]
        c.v = [t.clone() for t in self.v]
        c.slot_valid = self.slot_valid.clone()
        return c

    def view(self) -> CacheView:
        """The whole cache, in place: passes write their kept K/V straight into it."""
        return CacheView(self.k, self.v, self.slot_valid, self.cfg.tokens)
