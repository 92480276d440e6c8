"""Gemma decoder layers with the module names LeRobot's checkpoint uses.

LeRobot drives the layers of ``transformers``' ``GemmaModel`` by hand (PaliGemma's
layers and the action expert's share one attention per layer), so only the module
*names* of transformers' Gemma matter for loading: ``layers.N.self_attn.{q,k,v,o}_proj``,
``layers.N.mlp.{gate,up,down}_proj``, ``layers.N.{input,post_attention}_layernorm``,
``norm``, ``embed_tokens``. The maths is Gemma's:

* RMSNorm in float32, scaled by ``1 + weight`` (Gemma stores the offset from one);
* rotary embedding on q and k with the halves convention (``rotate_half``), theta 10^4;
* MLP ``down(gelu_tanh(gate(x)) * up(x))``;
* multi-query attention (8 query heads, 1 key/value head of 256), scale ``head_dim ** -0.5``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.policy.pi0.config import RMS_EPS, ROPE_THETA, GemmaSpec


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + RMS_EPS)
        return (h * (1.0 + self.weight.float())).to(x.dtype)


class GemmaAttention(nn.Module):
    """Projections only: the layer's attention runs in ``model.py`` across two stacks."""

    def __init__(self, spec: GemmaSpec) -> None:
        super().__init__()
        q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.q_proj = nn.Linear(spec.width, q, bias=False)
        self.k_proj = nn.Linear(spec.width, kv, bias=False)
        self.v_proj = nn.Linear(spec.width, kv, bias=False)
        self.o_proj = nn.Linear(q, spec.width, bias=False)


class GemmaMLP(nn.Module):
    def __init__(self, spec: GemmaSpec) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(spec.width, spec.mlp_dim, bias=False)
        self.up_proj = nn.Linear(spec.width, spec.mlp_dim, bias=False)
        self.down_proj = nn.Linear(spec.mlp_dim, spec.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class GemmaLayer(nn.Module):
    def __init__(self, spec: GemmaSpec) -> None:
        super().__init__()
        self.self_attn = GemmaAttention(spec)
        self.mlp = GemmaMLP(spec)
        self.input_layernorm = GemmaRMSNorm(spec.width)
        self.post_attention_layernorm = GemmaRMSNorm(spec.width)


class GemmaStack(nn.Module):
    """``GemmaModel``'s parameters: optional token embedding, the layers, the final norm."""

    def __init__(self, spec: GemmaSpec, vocab_size: int | None) -> None:
        super().__init__()
        self.spec = spec
        if vocab_size is not None:
            self.embed_tokens = nn.Embedding(vocab_size, spec.width)
        self.layers = nn.ModuleList(GemmaLayer(spec) for _ in range(spec.depth))
        self.norm = GemmaRMSNorm(spec.width)


def rope(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, T] -> (cos, sin) [B, 1, T, head_dim] in float32."""
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    ang = positions.float()[..., None] * inv
    ang = torch.cat([ang, ang], dim=-1)[:, None]
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] rotated by (cos, sin); computed in float32, returned in x's dtype."""
    h = x.float()
    x1, x2 = h.chunk(2, dim=-1)
    return (h * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)


def heads(x: torch.Tensor, n: int, d: int) -> torch.Tensor:
    """[B, T, n*d] -> [B, n, T, d]."""
    b, t, _ = x.shape
    return x.view(b, t, n, d).transpose(1, 2)
