"""The Wan2.1 DiT's building blocks, in the checkpoints' names: LingBot-World
(``models/world/lingbot``), Matrix-Game 2.0 (``models/world/matrix_game``) and DreamZero
(``models/policy/dreamzero``) are Wan DiTs and share these.

- ``RMSNorm``, ``layer_norm``: the q/k norms and the affine-free LayerNorm, in float32.
- ``timestep_embedding``: the sinusoidal timestep embedding (float64, as the reference).
- ``rope_angles``, ``apply_rope``: 3-D RoPE (time, row, column) over rotated pairs of each head.
- ``Attention``: the q, k, v, o projections and the q/k RMS norms of a Wan attention layer;
  ``roped`` gives q, k (roped) and v per head. ``CrossAttention`` attends to text (or image)
  K/V computed once per prompt (``project``), over one rank's heads under sequence parallel.
- ``Head``: the output head, modulated by the timestep.
- ``MLPProj``: CLIP image features to the DiT's width (``img_emb``, the image-to-video models).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from models.world.parallel.ulysses import Ulysses


class RMSNorm(nn.Module):
    """RMS norm over the last dim with a learned gain (q/k norm across all heads)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def layer_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm without affine parameters, computed in float32."""
    return F.layer_norm(x.float(), x.shape[-1:], eps=eps).type_as(x)


def timestep_embedding(dim: int, t: torch.Tensor) -> torch.Tensor:
    """Sinusoidal embedding ``[..., dim]`` (cos half, then sin half), in float64 like the reference."""
    half = dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64, device=t.device) / half)
    phase = t.to(torch.float64)[..., None] * freqs
    return torch.cat([phase.cos(), phase.sin()], -1)


def rope_parts(head_dim: int) -> tuple[int, int, int]:
    """Rotated pairs given to (time, height, width): d/2 - 2*(d/2 // 3), then d/2 // 3 twice."""
    c = head_dim // 2
    return c - 2 * (c // 3), c // 3, c // 3


def _axis_freqs(pairs: int, device: torch.device) -> torch.Tensor:
    # 1 / 10000^(2i / (2 * pairs)), the reference's rope_params(…, 2 * pairs).
    return 1.0 / torch.pow(10000.0, torch.arange(0, 2 * pairs, 2, dtype=torch.float64,
                                                 device=device) / (2 * pairs))


def rope_angles(head_dim: int, start_frames: torch.Tensor, frames: int, height: int,
                width: int) -> torch.Tensor:
    """Angles ``[R, F*H*W, head_dim/2]`` for tokens in (frame, row, column) order."""
    device = start_frames.device
    pt, ph, pw = rope_parts(head_dim)
    f = start_frames.to(torch.float64)[:, None] + torch.arange(frames, device=device, dtype=torch.float64)
    at = f[..., None] * _axis_freqs(pt, device)                           # [R, F, pt]
    ah = torch.arange(height, device=device, dtype=torch.float64)[:, None] * _axis_freqs(ph, device)
    aw = torch.arange(width, device=device, dtype=torch.float64)[:, None] * _axis_freqs(pw, device)
    R = start_frames.shape[0]
    at = at[:, :, None, None, :].expand(R, frames, height, width, pt)
    ah = ah[None, None, :, None, :].expand(R, frames, height, width, ph)
    aw = aw[None, None, None, :, :].expand(R, frames, height, width, pw)
    return torch.cat([at, ah, aw], -1).reshape(R, frames * height * width, -1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs (2i, 2i+1) of ``x [R, L, H, D]``; cos/sin ``[R, L, D/2]``."""
    xf = x.float().unflatten(-1, (-1, 2))
    x1, x2 = xf[..., 0], xf[..., 1]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).flatten(-2).type_as(x)


class Attention(nn.Module):
    """A Wan attention layer's projections: ``q``, ``k``, ``v``, ``o`` and the q/k RMS norms
    across all heads (the models say how they attend)."""

    def __init__(self, dim: int, heads: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = RMSNorm(dim, eps)
        self.norm_k = RMSNorm(dim, eps)

    def roped(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q and k normed and roped, and v, each ``[R, L, heads, head_dim]``, from ``x [R, L, dim]``."""
        shape = (*x.shape[:2], self.heads, -1)
        q = apply_rope(self.norm_q(self.q(x)).view(shape), cos, sin)
        k = apply_rope(self.norm_k(self.k(x)).view(shape), cos, sin)
        return q, k, self.v(x).view(shape)


class CrossAttention(Attention):
    """Attention to a context's K/V (text, or image tokens), computed once by ``project``."""

    def project(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Text K/V ``[B, tokens, H, D]`` from embedded text ``[B, tokens, dim]``."""
        shape = (*context.shape[:2], self.heads, -1)
        return self.norm_k(self.k(context)).view(shape), self.v(context).view(shape)

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sp: "Ulysses | None" = None,
                tokens: int = 0) -> torch.Tensor:
        """``x [R, L, dim]`` attends to ``k``/``v`` ``[R, T, heads, D]``. Sequence parallel
        (``sp``): ``x`` is this rank's share of ``tokens`` and ``k``/``v`` hold this rank's heads;
        the queries go to every token of those heads and the output comes back."""
        q = self.norm_q(self.q(x)).view(*x.shape[:2], self.heads, -1)
        if sp is not None:
            q = sp.to_heads(q, tokens)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.to(q.dtype).transpose(1, 2),
                                           v.to(q.dtype).transpose(1, 2)).transpose(1, 2)
        if sp is not None:
            o = sp.to_tokens(o)
        return self.o(o.flatten(2))


class Head(nn.Module):
    """The output head: LayerNorm modulated by the timestep, then ``out_features`` per token."""

    def __init__(self, dim: int, out_features: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.head = nn.Linear(dim, out_features)
        self.modulation = nn.Parameter(torch.randn(1, 2, dim) / dim ** 0.5)

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        shift, scale = (self.modulation.float()[None] + e[:, :, None]).unbind(2)
        return self.head((layer_norm(x, self.eps).float() * (1 + scale) + shift).type_as(x))


class MLPProj(nn.Module):
    """``img_emb``: CLIP features ``[*, in_dim]`` -> ``[*, out_dim]`` (LayerNorm, Linear, GELU, Linear, LayerNorm)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.LayerNorm(in_dim), nn.Linear(in_dim, in_dim), nn.GELU(),
                                  nn.Linear(in_dim, out_dim), nn.LayerNorm(out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)
