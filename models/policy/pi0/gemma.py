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

``fuse()`` (called once the weights are in) lays q|k|v and gate|up out as one matrix
each and re-points the named parameters at views of it, so a layer runs 2 matmuls
where it ran 5 and the checkpoint's names still reach the same numbers; the norms
keep ``1 + weight`` ready for ``F.rms_norm``. The expert's 10 steps x 18 layers are
small matrices: there, the number of kernels is the cost (bench/results/pi0_h200.json).
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
        self.scale: torch.Tensor | None = None  # 1 + weight, set by fuse()

    def fuse(self) -> None:
        if self.scale is None:
            self.scale = (1.0 + self.weight.detach().float()).to(self.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale is not None:
            return F.rms_norm(x, (x.shape[-1],), self.scale, RMS_EPS)
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
        self.qkv: torch.Tensor | None = None  # [q; k; v] rows, set by fuse()

    def fuse(self) -> None:
        if self.qkv is None:
            self.qkv = stack_and_view(self.q_proj, self.k_proj, self.v_proj)

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """h [B, T, W] -> q|k|v [B, T, (H + 2 * KV) * D]."""
        if self.qkv is not None:
            return F.linear(h, self.qkv)
        return torch.cat([self.q_proj(h), self.k_proj(h), self.v_proj(h)], dim=-1)


class GemmaMLP(nn.Module):
    def __init__(self, spec: GemmaSpec) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(spec.width, spec.mlp_dim, bias=False)
        self.up_proj = nn.Linear(spec.width, spec.mlp_dim, bias=False)
        self.down_proj = nn.Linear(spec.mlp_dim, spec.width, bias=False)
        self.gate_up: torch.Tensor | None = None  # [gate; up] rows, set by fuse()

    def fuse(self) -> None:
        if self.gate_up is None:
            self.gate_up = stack_and_view(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class GemmaLayer(nn.Module):
    def __init__(self, spec: GemmaSpec) -> None:
        super().__init__()
        self.self_attn = GemmaAttention(spec)
        self.mlp = GemmaMLP(spec)
        self.input_layernorm = GemmaRMSNorm(spec.width)
        self.post_attention_layernorm = GemmaRMSNorm(spec.width)

    def fuse(self) -> None:
        for m in (self.self_attn, self.mlp, self.input_layernorm, self.post_attention_layernorm):
            m.fuse()


class GemmaStack(nn.Module):
    """``GemmaModel``'s parameters: optional token embedding, the layers, the final norm."""

    def __init__(self, spec: GemmaSpec, vocab_size: int | None) -> None:
        super().__init__()
        self.spec = spec
        if vocab_size is not None:
            self.embed_tokens = nn.Embedding(vocab_size, spec.width)
        self.layers = nn.ModuleList(GemmaLayer(spec) for _ in range(spec.depth))
        self.norm = GemmaRMSNorm(spec.width)


def stack_and_view(*linears: nn.Linear, attr: str = "weight") -> torch.Tensor:
    """One matrix of the linears' rows (``attr="bias"``: one vector of their biases); each
    linear's ``attr`` becomes a view of its rows, so the checkpoint's names still reach them."""
    fused = torch.cat([getattr(lin, attr).detach() for lin in linears], dim=0)
    row = 0
    for lin in linears:
        n = getattr(lin, attr).shape[0]
        getattr(lin, attr).data = fused[row:row + n]
        row += n
    return fused


def rope(positions: torch.Tensor, head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, T] -> (cos, sin) [B, T, 1, head_dim] (angles in float32, then ``dtype``, as
    transformers' Gemma does)."""
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    ang = positions.float()[..., None] * inv
    ang = torch.cat([ang, ang], dim=-1)[:, :, None]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, D] rotated by (cos, sin) [B, T, 1, D] (rotate_half convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.addcmul(x * cos, torch.cat([-x2, x1], dim=-1), sin)
