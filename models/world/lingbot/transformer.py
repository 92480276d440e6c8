"""``CausalLingBotWorldTransformer3DModel``: the LingBot-World v2 causal Wan DiT.

Module and parameter names follow the checkpoint (the original Wan layout, which
the diffusers repository stores unchanged), with one exception: each block's
self-attention q, k and v are one fused projection ``self_attn.qkv`` (one GEMM
instead of three). ``checkpoint_shapes`` lists the checkpoint's names and shapes
(q/k/v split back out), and ``weights.py`` loads q/k/v rows into the fused
weight.

Per block of ``num_frames_per_block`` latent frames, per transformer block::

    x  = x + gate1 * self_attn(norm1(x) * (1 + scale1) + shift1)      # chunk-causal, kv/
    c  = cam + inj2(silu(inj1(cam)));  x = (1 + cam_scale(c)) * x + cam_shift(c)
    x  = x + cross_attn(norm3(x), text K/V of the session)
    x  = x + gate2 * ffn(norm2(x) * (1 + scale2) + shift2)

with (shift1, scale1, gate1, shift2, scale2, gate2) = modulation + time_projection(t).
``cam`` is the Plücker embedding of the block (``camera.py``) through
``patch_embedding_wancamctrl`` and the ``c2ws_hidden_states`` MLP (residual).
RoPE is 3-D (time, row, column) over rotated pairs of each head, time at the
block's absolute latent frame index.

Sequence parallel (``sequence_parallel``, a ``models.world.parallel.Ulysses``): every rank
runs this forward on its share of the block's tokens (patches, timestep and camera
embeddings, RoPE angles); around each attention the q/k/v go to every token of the rank's
heads and back (self-attention over the rank's kv/ pages, which hold those heads only;
cross-attention over the rank's heads of the text K/V), and the head's output is gathered
so every rank has the whole block's flow.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from models.world.lingbot.attention import BlockKV
from models.world.parallel.ulysses import Ulysses
from models.world.lingbot.config import CAMERA_CHANNELS, ConfigError, LingBotTransformerConfig
from models.world.wan_blocks import (CrossAttention, Head, RMSNorm, apply_rope, layer_norm, rope_angles,
                                     timestep_embedding)

# Checkpoint names of the fused projection's parts, in row order.
FUSED_QKV = ("q", "k", "v")


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = RMSNorm(dim, eps)
        self.norm_k = RMSNorm(dim, eps)

    def forward(self, x: torch.Tensor, layer: int, kv: BlockKV, cos: torch.Tensor,
                sin: torch.Tensor, update_cache: bool, sp: Ulysses | None = None,
                tokens: int = 0) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        shape = (*x.shape[:2], self.heads, -1)
        q = apply_rope(self.norm_q(q).view(shape), cos, sin)
        k = apply_rope(self.norm_k(k).view(shape), cos, sin)
        v = v.reshape(shape)
        if sp is not None:   # every token of this rank's heads (its kv/ pages hold those); one exchange
            q, k, v = sp.to_heads(torch.cat([q, k, v]), tokens).chunk(3)
        o = kv.self_attention(layer, q, k, v, update_cache)
        if sp is not None:
            o = sp.to_tokens(o)
        return self.o(o.flatten(2))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: LingBotTransformerConfig) -> None:
        super().__init__()
        dim = cfg.dim
        self.eps = cfg.eps
        self.self_attn = SelfAttention(dim, cfg.num_attention_heads, cfg.eps)
        self.norm3 = nn.LayerNorm(dim, eps=cfg.eps, elementwise_affine=True)
        self.cross_attn = CrossAttention(dim, cfg.num_attention_heads, cfg.eps)
        self.ffn = nn.Sequential(nn.Linear(dim, cfg.ffn_dim), nn.GELU(approximate="tanh"),
                                 nn.Linear(cfg.ffn_dim, dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim ** 0.5)
        self.cam_injector_layer1 = nn.Linear(dim, dim)
        self.cam_injector_layer2 = nn.Linear(dim, dim)
        self.cam_scale_layer = nn.Linear(dim, dim)
        self.cam_shift_layer = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, e: torch.Tensor, layer: int, kv: BlockKV,
                cos: torch.Tensor, sin: torch.Tensor, cam: torch.Tensor | None,
                update_cache: bool, sp: Ulysses | None = None, tokens: int = 0) -> torch.Tensor:
        # e: [R, L, 6, dim] float32, per token (tokens of one frame share a timestep).
        mod = (self.modulation.float()[None] + e).unbind(2)
        y = layer_norm(x, self.eps).float() * (1 + mod[1]) + mod[0]
        y = self.self_attn(y.type_as(x), layer, kv, cos, sin, update_cache, sp, tokens)
        x = (x.float() + y.float() * mod[2]).type_as(x)
        if cam is not None:
            c = self.cam_injector_layer2(F.silu(self.cam_injector_layer1(cam))) + cam
            x = (1.0 + self.cam_scale_layer(c)) * x + self.cam_shift_layer(c)
        k, v = kv.cross_kv(layer)
        x = x + self.cross_attn(self.norm3(x), k, v, sp, tokens)
        y = layer_norm(x, self.eps).float() * (1 + mod[4]) + mod[3]
        y = self.ffn(y.type_as(x))
        return (x.float() + y.float() * mod[5]).type_as(x)


class CausalLingBotWorldTransformer3DModel(nn.Module):
    """The causal DiT; one ``forward`` denoises (or commits) exactly one block."""

    def __init__(self, config: LingBotTransformerConfig | None = None) -> None:
        super().__init__()
        cfg = config or LingBotTransformerConfig()
        self.config = cfg
        dim = cfg.dim
        self.patch_embedding = nn.Conv3d(cfg.in_channels, dim, cfg.patch_size, stride=cfg.patch_size)
        self.patch_embedding_wancamctrl = nn.Linear(cfg.camera_in_features, dim)
        self.c2ws_hidden_states_layer1 = nn.Linear(dim, dim)
        self.c2ws_hidden_states_layer2 = nn.Linear(dim, dim)
        self.text_embedding = nn.Sequential(nn.Linear(cfg.text_dim, dim), nn.GELU(approximate="tanh"),
                                            nn.Linear(dim, dim))
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.blocks = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.num_layers))
        self.head = Head(cfg.dim, math.prod(cfg.patch_size) * cfg.out_channels, cfg.eps)
        # This rank's view of a sequence-parallel group, or None (one process).
        self.sequence_parallel: Ulysses | None = None

    @classmethod
    def from_config(cls, config: dict) -> "CausalLingBotWorldTransformer3DModel":
        return cls(LingBotTransformerConfig.from_config(config))

    # -- text ------------------------------------------------------------------------

    def project_text(self, text: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Encoder states ``[B, tokens, text_dim]`` -> per layer (K, V) ``[B, tokens, H, D]``.

        Run once per prompt; the result goes into the session's cross slot.
        """
        context = self.text_embedding(text.to(self.patch_embedding.weight.dtype))
        return [blk.cross_attn.project(context) for blk in self.blocks]

    # -- one block -----------------------------------------------------------------------

    def embed_patches(self, x: torch.Tensor) -> torch.Tensor:
        """``[R, in_channels, F, h, w]`` -> ``[R, F*h'*w', dim]`` tokens: ``patch_embedding`` (a
        convolution whose stride is its kernel) as one matrix product over the patches. A
        convolution's kernel is chosen by the batch size and rounds a row differently under
        another, so a session's tokens would depend on its batch; the product has a row per
        token, the same kernel at any batch size (``models/world/rows.py``)."""
        pt, ph, pw = self.config.patch_size
        R, C, Fr, h, w = x.shape
        x = x.reshape(R, C, Fr // pt, pt, h // ph, ph, w // pw, pw)
        x = x.permute(0, 2, 4, 6, 1, 3, 5, 7).reshape(R, (Fr // pt) * (h // ph) * (w // pw), -1)
        conv = self.patch_embedding
        return F.linear(x, conv.weight.flatten(1), conv.bias)

    def embed_camera(self, camera: torch.Tensor) -> torch.Tensor:
        """Plücker ``[R, 384, F, h, w]`` (latent grid) -> ``[R, F*h'*w', dim]`` tokens."""
        pt, ph, pw = self.config.patch_size
        R, C, Fr, h, w = camera.shape
        x = camera.reshape(R, C, Fr // pt, pt, h // ph, ph, w // pw, pw)
        x = x.permute(0, 2, 4, 6, 1, 3, 5, 7).reshape(R, (Fr // pt) * (h // ph) * (w // pw), -1)
        x = self.patch_embedding_wancamctrl(x.to(self.patch_embedding.weight.dtype))
        return x + self.c2ws_hidden_states_layer2(F.silu(self.c2ws_hidden_states_layer1(x)))

    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor, kv: BlockKV,
                camera: torch.Tensor | None = None, *, update_cache: bool = False) -> torch.Tensor:
        """Predict the flow for one block.

        ``hidden_states``: ``[R, in_channels, num_frames_per_block, h, w]`` (latents, mask,
        image latents); ``timestep``: ``[R]`` or ``[R, frames]``; ``kv``: the rows' begun
        batch; ``camera``: ``[R, 384, frames, h, w]`` or None. Returns
        ``[R, out_channels, frames, h, w]``. ``update_cache`` writes the block's K/V into
        its scratch pages (the clean pass); otherwise no cache byte changes.
        """
        cfg = self.config
        if hidden_states.ndim != 5 or hidden_states.shape[1] != cfg.in_channels:
            raise ValueError(f"hidden_states must be [rows, {cfg.in_channels}, frames, h, w], "
                             f"got {tuple(hidden_states.shape)}")
        R, _, Fr, H, W = hidden_states.shape
        if Fr != cfg.num_frames_per_block:
            raise ValueError(f"a forward is exactly one block of {cfg.num_frames_per_block} latent "
                             f"frames, got {Fr}")
        if R != kv.rows:
            raise ValueError(f"hidden_states has {R} rows, the kv batch {kv.rows}")
        pt, ph, pw = cfg.patch_size
        if H % ph or W % pw:
            raise ValueError(f"latent {H}x{W} is not whole {ph}x{pw} patches")
        if camera is not None and tuple(camera.shape) != (R, CAMERA_CHANNELS, Fr, H, W):
            raise ValueError(f"camera must be {(R, CAMERA_CHANNELS, Fr, H, W)}, got {tuple(camera.shape)}")
        hp, wp = H // ph, W // pw
        tokens_per_frame = hp * wp
        dtype = self.patch_embedding.weight.dtype
        x = self.embed_patches(hidden_states.to(dtype))                                 # [R, L, dim]
        L = x.shape[1]

        if timestep.ndim == 1:
            timestep = timestep[:, None].expand(R, Fr)
        if tuple(timestep.shape) != (R, Fr):
            raise ValueError(f"timestep must be [rows] or [rows, {Fr}], got {tuple(timestep.shape)}")
        t = timestep.repeat_interleave(tokens_per_frame, 1)                              # [R, L]
        e = self.time_embedding(timestep_embedding(cfg.freq_dim, t).to(dtype)).float()  # [R, L, dim]
        e0 = self.time_projection(e.to(dtype)).float().unflatten(2, (6, cfg.dim))

        starts = torch.tensor(kv.start_frames, device=x.device)
        angles = rope_angles(cfg.attention_head_dim, starts, Fr, hp, wp)
        cos, sin = angles.cos().float(), angles.sin().float()
        cam = self.embed_camera(camera) if camera is not None else None

        sp = self.sequence_parallel
        if sp is not None:   # this rank's tokens from here to the head
            x, e, e0, cos, sin = (sp.shard(t) for t in (x, e, e0, cos, sin))
            cam = None if cam is None else sp.shard(cam)
        for layer, blk in enumerate(self.blocks):
            x = blk(x, e0, layer, kv, cos, sin, cam, update_cache, sp, L)
        out = self.head(x, e)                                                            # [R, L, p*C]
        if sp is not None:
            out = sp.gather(out, L)
        C = cfg.out_channels
        out = out.float().view(R, Fr // pt, hp, wp, pt, ph, pw, C)
        out = torch.einsum("bfhwpqrc->bcfphqwr", out)
        assert out.shape[2] * out.shape[3] == Fr and L == Fr * tokens_per_frame
        return out.reshape(R, C, Fr, H, W)


# -- checkpoint names ----------------------------------------------------------------------

def checkpoint_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """The checkpoint's parameter names and shapes for ``model`` (q/k/v split back out)."""
    out: dict[str, tuple[int, ...]] = {}
    for name, p in model.named_parameters():
        for ck, shape, _ in _checkpoint_parts(name, tuple(p.shape)):
            out[ck] = shape
    return out


def _checkpoint_parts(name: str, shape: tuple[int, ...]) -> Iterator[tuple[str, tuple[int, ...], int]]:
    """(checkpoint name, shape, first row in the module parameter) for one module parameter."""
    head, sep, leaf = name.rpartition(".qkv.")
    if not sep:
        yield name, shape, 0
        return
    if shape[0] % 3:
        raise ConfigError(f"fused parameter {name} has {shape[0]} rows, not 3 equal parts")
    rows = shape[0] // 3
    for i, part in enumerate(FUSED_QKV):
        yield f"{head}.{part}.{leaf}", (rows, *shape[1:]), i * rows


def checkpoint_targets(model: nn.Module) -> dict[str, tuple[nn.Parameter, int, tuple[int, ...]]]:
    """Checkpoint name -> (module parameter, first row, shape): where each tensor is loaded."""
    out = {}
    for name, p in model.named_parameters():
        for ck, shape, row in _checkpoint_parts(name, tuple(p.shape)):
            out[ck] = (p, row, shape)
    return out
