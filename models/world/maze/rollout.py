"""Making frames with the maze DiT: denoise one frame, then write its clean K/V.

A frame is ``steps`` Euler steps of the flow from pure noise (t=1) to the clean
frame (t=0), each a forward pass of the new frame's 256 tokens against the cached
context; the model predicts the clean frame x0 and the step moves along the
straight line between the current sample and that estimate:

    x_{t'} = x0_hat + (t' / t) * (x_t - x0_hat)

A last pass feeds the finished frame at noise level ``ctx_t`` (0 by default) and
keeps its K/V: that, not the noisy passes', is what later frames attend to
(``SamplerConfig.kv_from_last`` keeps the last noisy pass's instead, one pass fewer).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.maze.sim import H, W
from models.world.maze.cache import CacheView
from models.world.maze.model import MazeDiT
from models.world.noise import normal


@dataclass(frozen=True)
class SamplerConfig:
    steps: int = 4          # Euler steps per frame
    ctx_t: float = 0.0      # noise level at which finished frames enter the cache
    shift: float = 1.0      # >1 spends more steps near pure noise
    # Keep the last denoising pass's K/V as the frame's context instead of running the clean
    # pass (one pass fewer per frame). That pass sees the frame at noise level ts[-2], so it
    # wants a schedule ending near the context noise the model trained with (U(0, 0.1)):
    # steps=2, shift=1/9 gives t = 1, 0.1.
    kv_from_last: bool = False


def timesteps(steps: int, shift: float = 1.0) -> list[float]:
    """``steps + 1`` noise levels from 1 down to 0 (``shift`` warps them towards 1)."""
    ts = [1.0 - i / steps for i in range(steps + 1)]
    return [shift * t / (1 + (shift - 1) * t) for t in ts]


def frame_noise(seeds: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
    """The starting noise [B, 3, 64, 64] float32 of frame ``frames[r]`` of the session with
    ``seeds[r]`` (int64 [B] each): the same for the same (seed, frame) in any batch."""
    return normal(seeds, frames, (3, H, W))


def to_model(frames_u8: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[..., 64, 64, 3] uint8 -> [..., 3, 64, 64] in [-1, 1]."""
    return (frames_u8.to(dtype) / 127.5 - 1.0).movedim(-1, -3)


def to_u8(x: torch.Tensor) -> torch.Tensor:
    """[..., 3, 64, 64] in [-1, 1] -> [..., 64, 64, 3] uint8 (same device)."""
    return ((x.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).movedim(-3, -1)


@torch.no_grad()
def write_frame(model: MazeDiT, view: CacheView, x0: torch.Tensor, actions: torch.Tensor,
                frames: torch.Tensor, window: int, ctx_t: float = 0.0,
                gen: torch.Generator | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The clean pass: feed x0 [B, 3, 64, 64] as frame ``frames`` [B] and put its K/V into ``view``."""
    B = x0.shape[0]
    x = x0
    if ctx_t > 0:
        x = (1 - ctx_t) * x0 + ctx_t * torch.randn(x0.shape, device=x0.device, generator=gen)
    t = torch.full((B,), ctx_t, device=x0.device)
    model.forward_frame(x, t, actions, frames, frames == 0, view)
    own = list(view.own)
    view.put(frames, window, own)
    return own


@torch.no_grad()
def denoise_frame(model: MazeDiT, view: CacheView, actions: torch.Tensor, frames: torch.Tensor,
                  cfg: SamplerConfig = SamplerConfig(), gen: torch.Generator | None = None,
                  noise: torch.Tensor | None = None) -> torch.Tensor:
    """Sample frame ``frames`` [B] (>= 1) under ``actions`` [B, 8]; returns x0 [B, 3, 64, 64] float32.

    ``noise``: the starting sample (else drawn from ``gen``); a CUDA graph passes a static buffer.
    """
    B = actions.shape[0]
    dev = actions.device
    x = noise if noise is not None else torch.randn((B, 3, H, W), device=dev, generator=gen)
    ts = timesteps(cfg.steps, cfg.shift)
    sink = torch.zeros(B, dtype=torch.bool, device=dev)
    x0 = x
    for i in range(cfg.steps):
        t = torch.full((B,), ts[i], device=dev)
        x0 = model.forward_frame(x, t, actions, frames, sink, view).clamp(-1, 1)
        x = x0 + (ts[i + 1] / ts[i]) * (x - x0)
    return x0


@torch.no_grad()
def next_frame(model: MazeDiT, view: CacheView, actions: torch.Tensor, frames: torch.Tensor, window: int,
               cfg: SamplerConfig = SamplerConfig(), gen: torch.Generator | None = None,
               noise: torch.Tensor | None = None):
    """Denoise frame ``frames`` (from ``noise``, else noise drawn from ``gen``) and write it
    into the view; returns (x0, own K/V per layer)."""
    x0 = denoise_frame(model, view, actions, frames, cfg, gen, noise)
    if cfg.kv_from_last:
        own = list(view.own)  # the last denoising pass's K/V
        view.put(frames, window, own)
        return x0, own
    own = write_frame(model, view, x0, actions, frames, window, cfg.ctx_t, gen)
    return x0, own
