"""``DreamZeroDiT``: the Wan2.1-I2V DiT that makes video and actions (``action_head.model``).

Module and parameter names are the checkpoint's (upstream ``CausalWanModel``), so the
state dict loads name for name. One forward runs one chunk of every row::

    tokens  = [ video: frames x tokens_per_frame | actions: 24 | state: 1 ]
    x       = [ patch_embedding([latents; y]) | action_encoder(actions, t_a) | state_encoder(state) ]
    e       = time_embedding(sinusoid(t)) per token: the frame's t, the actions' t (state too)
    per block:
        x = x + gate1 * self_attn(norm1(x) * (1 + scale1) + shift1)   # over cached K/V + the chunk
        x = x + cross_attn(norm3(x), text K/V, image K/V)            # I2V: two attentions, summed
        x = x + gate2 * ffn(norm2(x) * (1 + scale2) + shift2)
    video flow   = head(x[video], e[video])        [rows, 16, frames, h, w]
    action flow  = action_decoder(x[actions])     [rows, 24, action_dim]

RoPE: video tokens 3-D (frame, row, column; the frame at its absolute latent index),
action and state tokens 1-D at positions ``k * 24 + j`` and ``k`` for the index ``k`` of
the block the call's last frame is in: ``(start_frame - 1) // num_frame_per_block`` for a
chunk (upstream ``causal_rope_action_apply``), 0 for a one-block training sequence. Each row
has its own ``start_frame`` (rows of sessions at different window positions share a forward);
a row's angles are those it has alone.

Self-attention (inference, upstream ``CausalWanSelfAttention`` with a kv cache): every
query of the chunk (video, actions and the state) attends to the cached video K/V, the
chunk's video K/V and its action/state K/V, without a mask. Only video K/V are cached:
``forward`` returns, per layer, the cache with the chunk's video K/V appended and cut to
the window (``local_attn_size`` frames), which a ``t = 0`` pass keeps and a denoising
pass drops. Given ``mask`` and no cache, the call is instead a whole training sequence
attended under that mask (``mask.block_causal_mask``; with actions, one block, whose
``[first frame | block | actions | state]`` order is a chunk's); the tests build the same
K/V and flows both ways.

Sequence parallel (``sequence_parallel``, a ``models.world.parallel.Ulysses``; paged forwards
only): every rank runs the forward on its share of the chunk's ``[video | actions | state]``
tokens (embeddings, modulation, RoPE angles); around each attention q/k/v go to every token of
the rank's heads and back (self-attention over the rank's kv/ pages, which hold those heads
only, plus the chunk's own tokens; cross-attention over the rank's heads of the text and image
K/V), and after the last block the tokens are gathered so every rank has the whole chunk for
the head and the action decoder.

From the Wan blocks every Wan DiT here shares (``models/world/wan_blocks.py``): RMS norm, the
affine-free LayerNorm, 3-D RoPE angles, the attention projections (``Attention``, which the
self- and the I2V cross-attention extend) and the output head, whose names and wiring are
the same in every Wan checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from models.policy.dreamzero.config import DreamZeroConfig
from models.world.parallel.ulysses import Ulysses
from models.world.wan_blocks import Attention, Head, MLPProj, RMSNorm, layer_norm, rope_angles, timestep_embedding

KV = tuple[torch.Tensor, torch.Tensor]   # K (roped), V: [rows, tokens, heads, head_dim]


@dataclass(frozen=True)
class CrossKV:
    """One layer's cross-attention K/V of one branch: text and image tokens, ``[rows, n, H, D]``."""

    k: torch.Tensor
    v: torch.Tensor
    k_img: torch.Tensor
    v_img: torch.Tensor

    def repeat_rows(self, n: int) -> "CrossKV":
        return CrossKV(*(t.expand(n, *t.shape[1:]) for t in (self.k, self.v, self.k_img, self.v_img)))

    def own_heads(self, sp: Ulysses) -> "CrossKV":
        """This rank's heads of every tensor (sequence parallel)."""
        return CrossKV(*(sp.own_heads(t) for t in (self.k, self.v, self.k_img, self.v_img)))


class PagedSelfKV(Protocol):
    """Self-attention over K/V kept outside the forward (kv/'s pool: ``cache.PagedRows``)."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               video_tokens: int) -> torch.Tensor:
        """The chunk's roped ``q, k, v [R, L, H, D]`` (video tokens first) -> ``[R, L, H, D]``."""


@dataclass(frozen=True)
class ChunkOutput:
    video: torch.Tensor                  # flow [rows, out_dim, frames, h, w], float32
    actions: torch.Tensor | None         # flow [rows, action_horizon, action_dim], float32
    kv: list[KV]                         # per layer: cache + this chunk's video K/V, windowed
                                         # (empty for a forward with keep_kv=False)


# -- the action / state MLPs (one embodiment: upstream indexes category 0 only) ----------------

class CategorySpecificLinear(nn.Module):
    """``x @ W[0] + b[0]``; upstream keeps a category axis of size 1 (``max_num_embodiments = 1``)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.W = nn.Parameter(torch.zeros(1, in_dim, out_dim))
        self.b = nn.Parameter(torch.zeros(1, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.W[0] + self.b[0]


class CategorySpecificMLP(nn.Module):
    """``layer2(relu(layer1(x)))``: the state encoder and the action decoder."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int) -> None:
        super().__init__()
        self.layer1 = CategorySpecificLinear(in_dim, hidden)
        self.layer2 = CategorySpecificLinear(hidden, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer2(F.relu(self.layer1(x)))


def action_time_encoding(dim: int, t: torch.Tensor) -> torch.Tensor:
    """The action encoder's sinusoid ``[..., dim]``: sin half, then cos half, in float32
    (unlike the DiT's cos-then-sin float64 ``timestep_embedding``)."""
    half = dim // 2
    freqs = torch.exp(-torch.arange(half, dtype=torch.float32, device=t.device) * (math.log(10000.0) / half))
    phase = t.float()[..., None] * freqs
    return torch.cat([phase.sin(), phase.cos()], -1)


class ActionEncoder(nn.Module):
    """``W3(swish(W2([W1(a); sinusoid(t)])))`` per action token (``MultiEmbodimentActionEncoder``)."""

    def __init__(self, action_dim: int, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.W1 = CategorySpecificLinear(action_dim, dim)
        self.W2 = CategorySpecificLinear(2 * dim, dim)
        self.W3 = CategorySpecificLinear(dim, dim)

    def forward(self, actions: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        a = self.W1(actions)
        x = torch.cat([a, action_time_encoding(self.dim, t).to(a.dtype)], -1)
        return self.W3(F.silu(self.W2(x)))


# -- attention -----------------------------------------------------------------------------

def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
          mask: torch.Tensor | None = None) -> torch.Tensor:
    """``[R, L, H, D]`` layout in and out."""
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.to(q.dtype).transpose(1, 2),
                                       v.to(q.dtype).transpose(1, 2), attn_mask=mask)
    return o.transpose(1, 2)


class SelfAttention(Attention):
    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, video_tokens: int,
                past: KV | None, window_tokens: int | None,
                mask: torch.Tensor | None, paged: PagedSelfKV | None = None,
                layer: int = 0, sp: Ulysses | None = None, tokens: int = 0) -> tuple[torch.Tensor, KV | None]:
        q, k, v = self.roped(x, cos, sin)
        if paged is not None:
            if sp is not None:   # every token of this rank's heads (its pages hold those); one exchange
                q, k, v = sp.to_heads(torch.cat([q, k, v]), tokens).chunk(3)
            o = paged.attend(layer, q, k, v, video_tokens)
            if sp is not None:
                o = sp.to_tokens(o)
            return self.o(o.flatten(2)), None
        kv_video, kv_reg = k[:, :video_tokens], k[:, video_tokens:]
        vv_video, vv_reg = v[:, :video_tokens], v[:, video_tokens:]
        if past is not None:
            kv_video = torch.cat([past[0].to(k.dtype), kv_video], 1)
            vv_video = torch.cat([past[1].to(v.dtype), vv_video], 1)
        if window_tokens is not None:
            # Upstream cuts the cache + chunk to the window before attending (max_attention_size).
            kv_video, vv_video = kv_video[:, -window_tokens:], vv_video[:, -window_tokens:]
        o = _sdpa(q, torch.cat([kv_video, kv_reg], 1), torch.cat([vv_video, vv_reg], 1), mask)
        return self.o(o.flatten(2)), (kv_video, vv_video)


class CrossAttention(Attention):
    """Wan's I2V cross-attention: the text and the CLIP image tokens, attended apart and summed."""

    def __init__(self, dim: int, heads: int, eps: float) -> None:
        super().__init__(dim, heads, eps)
        self.k_img = nn.Linear(dim, dim)
        self.v_img = nn.Linear(dim, dim)
        self.norm_k_img = RMSNorm(dim, eps)

    def project(self, text: torch.Tensor, image: torch.Tensor) -> CrossKV:
        """Embedded text ``[R, text_len, dim]`` and image ``[R, 257, dim]`` -> this layer's K/V."""
        ts, ims = (*text.shape[:2], self.heads, -1), (*image.shape[:2], self.heads, -1)
        return CrossKV(self.norm_k(self.k(text)).view(ts), self.v(text).view(ts),
                       self.norm_k_img(self.k_img(image)).view(ims), self.v_img(image).view(ims))

    def forward(self, x: torch.Tensor, kv: CrossKV, sp: Ulysses | None = None, tokens: int = 0) -> torch.Tensor:
        """``x [R, L, dim]``; sequence parallel (``sp``): ``x`` is this rank's share of ``tokens``
        and ``kv`` holds this rank's heads."""
        q = self.norm_q(self.q(x)).view(*x.shape[:2], self.heads, -1)
        if sp is not None:
            q = sp.to_heads(q, tokens)
        o = _sdpa(q, kv.k, kv.v) + _sdpa(q, kv.k_img, kv.v_img)
        if sp is not None:
            o = sp.to_tokens(o)
        return self.o(o.flatten(2))


class Block(nn.Module):
    def __init__(self, cfg: DreamZeroConfig) -> None:
        super().__init__()
        self.eps = cfg.eps
        self.self_attn = SelfAttention(cfg.dim, cfg.num_heads, cfg.eps)
        self.norm3 = nn.LayerNorm(cfg.dim, eps=cfg.eps, elementwise_affine=True)
        self.cross_attn = CrossAttention(cfg.dim, cfg.num_heads, cfg.eps)
        self.ffn = nn.Sequential(nn.Linear(cfg.dim, cfg.ffn_dim), nn.GELU(approximate="tanh"),
                                 nn.Linear(cfg.ffn_dim, cfg.dim))
        self.modulation = nn.Parameter(torch.zeros(1, 6, cfg.dim))

    def forward(self, x: torch.Tensor, e: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                video_tokens: int, past: KV | None, window_tokens: int | None, cross: CrossKV,
                mask: torch.Tensor | None, paged: PagedSelfKV | None = None,
                layer: int = 0, sp: Ulysses | None = None, tokens: int = 0) -> tuple[torch.Tensor, KV | None]:
        # e: [R, L, 6, dim] float32, one row of modulation per token.
        mod = (self.modulation.float()[None] + e).unbind(2)
        y = layer_norm(x, self.eps).float() * (1 + mod[1]) + mod[0]
        y, kv = self.self_attn(y.type_as(x), cos, sin, video_tokens, past, window_tokens, mask, paged, layer,
                               sp, tokens)
        x = (x.float() + y.float() * mod[2]).type_as(x)
        x = x + self.cross_attn(self.norm3(x), cross, sp, tokens)
        y = layer_norm(x, self.eps).float() * (1 + mod[4]) + mod[3]
        y = self.ffn(y.type_as(x))
        return (x.float() + y.float() * mod[5]).type_as(x), kv


def row_starts(start_frame: int | torch.Tensor, rows: int, device: torch.device) -> torch.Tensor:
    """Each row's first latent frame ``[rows]`` (int64): one for all, or one a row."""
    if isinstance(start_frame, torch.Tensor):
        if tuple(start_frame.shape) != (rows,):
            raise ValueError(f"start_frame must be one int or [{rows}], got {tuple(start_frame.shape)}")
        return start_frame.to(device=device, dtype=torch.int64)
    return torch.full((rows,), start_frame, dtype=torch.int64, device=device)


def action_rope_angles(head_dim: int, positions: torch.Tensor) -> torch.Tensor:
    """1-D RoPE angles ``[len(positions), head_dim / 2]`` over every rotated pair (upstream
    ``rope_params(max_len, head_dim)``): ``pos / 10000^(2i / head_dim)``."""
    inv = 1.0 / torch.pow(10000.0, torch.arange(0, head_dim, 2, dtype=torch.float64,
                                                device=positions.device) / head_dim)
    return positions.to(torch.float64)[:, None] * inv


class DreamZeroDiT(nn.Module):
    def __init__(self, config: DreamZeroConfig | None = None) -> None:
        super().__init__()
        cfg = config or DreamZeroConfig()
        self.config = cfg
        dim = cfg.dim
        self.state_encoder = CategorySpecificMLP(cfg.max_state_dim, cfg.hidden_size, dim)
        self.action_encoder = ActionEncoder(cfg.action_dim, dim)
        self.action_decoder = CategorySpecificMLP(dim, cfg.hidden_size, cfg.action_dim)
        self.patch_embedding = nn.Conv3d(cfg.in_dim, dim, cfg.patch_size, stride=cfg.patch_size)
        self.text_embedding = nn.Sequential(nn.Linear(cfg.text_dim, dim), nn.GELU(approximate="tanh"),
                                            nn.Linear(dim, dim))
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.head = Head(dim, math.prod(cfg.patch_size) * cfg.out_dim, cfg.eps)
        self.img_emb = MLPProj(cfg.image_dim, dim)
        # This rank's view of a sequence-parallel group, or None (one process).
        self.sequence_parallel: Ulysses | None = None

    # -- conditioning, once per prompt / first frame ---------------------------------------

    def encode_context(self, text: torch.Tensor, image: torch.Tensor) -> list[CrossKV]:
        """Text encoder states ``[R, text_len, text_dim]`` (zeros past the prompt, as upstream
        pads) and CLIP features ``[R, 257, image_dim]`` -> every layer's cross K/V."""
        cfg = self.config
        if text.ndim != 3 or text.shape[1:] != (cfg.text_len, cfg.text_dim):
            raise ValueError(f"text must be [rows, {cfg.text_len}, {cfg.text_dim}], got {tuple(text.shape)}")
        if image.ndim != 3 or image.shape[2] != cfg.image_dim or image.shape[0] != text.shape[0]:
            raise ValueError(f"image must be [{text.shape[0]}, tokens, {cfg.image_dim}], got {tuple(image.shape)}")
        dtype = self.patch_embedding.weight.dtype
        t = self.text_embedding(text.to(dtype))
        im = self.img_emb(image.to(dtype))
        return [blk.cross_attn.project(t, im) for blk in self.blocks]

    # -- one chunk -----------------------------------------------------------------------------

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """``[R, in_dim, F, h, w]`` -> ``[R, F*h'*w', dim]``: the patch convolution as one matrix
        product over patches (as LingBot's ``embed_patches``: a row's result does not depend
        on the batch size)."""
        pt, ph, pw = self.config.patch_size
        R, C, Fr, h, w = x.shape
        x = x.reshape(R, C, Fr // pt, pt, h // ph, ph, w // pw, pw)
        x = x.permute(0, 2, 4, 6, 1, 3, 5, 7).reshape(R, (Fr // pt) * (h // ph) * (w // pw), -1)
        conv = self.patch_embedding
        return F.linear(x, conv.weight.flatten(1), conv.bias)

    def forward(self, latents: torch.Tensor, y: torch.Tensor, timestep: torch.Tensor, start_frame: int | torch.Tensor,
                cross: list[CrossKV], past: list[KV] | None = None, *, actions: torch.Tensor | None = None,
                action_timestep: torch.Tensor | None = None, state: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, keep_kv: bool = True,
                paged: PagedSelfKV | None = None) -> ChunkOutput:
        """One chunk. ``latents [R, out_dim, F, h, w]``, ``y [R, in_dim - out_dim, F, h, w]`` (mask
        channels + first-frame latents), ``timestep [R]`` or ``[R, F]`` (0 for a K/V pass),
        ``start_frame``: the absolute latent index of the chunk's first frame (one int for every
        row, or ``[R]``: each row's own), ``cross``: every layer's cross K/V (rows as
        ``latents``), ``past``: every layer's cached video K/V or None.
        ``actions [R, T, action_dim]`` with ``action_timestep [R]`` and ``state [R, S, max_state_dim]``
        add the action register (all three or none). ``keep_kv=False`` (a denoising pass) drops
        each layer's cache + chunk K/V as soon as the layer is done (at 14B, 7 cached frames and
        2 rows, about 6 GB held to the end otherwise). ``paged`` replaces ``past``: every layer's
        self-attention goes through it (kv/'s pool, which keeps the K/V; ``kv`` is then empty).
        Under sequence parallel every forward is paged, and ``cross`` holds this rank's heads."""
        cfg = self.config
        if latents.ndim != 5 or latents.shape[1] != cfg.out_dim:
            raise ValueError(f"latents must be [rows, {cfg.out_dim}, frames, h, w], got {tuple(latents.shape)}")
        R, _, Fr, H, W = latents.shape
        if tuple(y.shape) != (R, cfg.in_dim - cfg.out_dim, Fr, H, W):
            raise ValueError(f"y must be {(R, cfg.in_dim - cfg.out_dim, Fr, H, W)}, got {tuple(y.shape)}")
        if len(cross) != cfg.num_layers or (past is not None and len(past) != cfg.num_layers):
            raise ValueError(f"cross and past need one entry per layer ({cfg.num_layers})")
        register = actions is not None
        if register != (action_timestep is not None) or register != (state is not None):
            raise ValueError("actions, action_timestep and state come together")
        if mask is not None and past is not None:
            raise ValueError("a masked forward is a whole sequence: no cache")
        if paged is not None and (past is not None or mask is not None):
            raise ValueError("a paged forward takes neither past K/V nor a mask")
        sp = self.sequence_parallel
        if sp is not None and paged is None:
            raise ValueError("a sequence-parallel forward attends through kv/'s pool (paged)")
        ph, pw = cfg.patch_size[1:]
        hp, wp = H // ph, W // pw
        tpf = hp * wp
        dtype = self.patch_embedding.weight.dtype
        x = self.patchify(torch.cat([latents, y.to(latents.dtype)], 1).to(dtype))   # [R, F*tpf, dim]
        video_tokens = x.shape[1]

        if timestep.ndim == 1:
            timestep = timestep[:, None].expand(R, Fr)
        if tuple(timestep.shape) != (R, Fr):
            raise ValueError(f"timestep must be [rows] or [rows, {Fr}], got {tuple(timestep.shape)}")
        t = timestep.repeat_interleave(tpf, 1)                                           # [R, F*tpf]
        starts = row_starts(start_frame, R, x.device)
        angles = rope_angles(cfg.head_dim, starts, Fr, hp, wp)
        if register:
            if actions.shape[0] != R or actions.shape[2] != cfg.action_dim:
                raise ValueError(f"actions must be [{R}, steps, {cfg.action_dim}], got {tuple(actions.shape)}")
            if state.shape[0] != R or state.shape[2] != cfg.max_state_dim:
                raise ValueError(f"state must be [{R}, tokens, {cfg.max_state_dim}], got {tuple(state.shape)}")
            T, S = actions.shape[1], state.shape[1]
            ta = action_timestep[:, None].expand(R, T)
            enc = self.action_encoder(actions.to(dtype), ta)
            x = torch.cat([x, enc, self.state_encoder(state.to(dtype))], 1)
            t = torch.cat([t, ta.to(t.dtype), action_timestep[:, None].expand(R, S).to(t.dtype)], 1)
            # Each row's last frame's block.
            k = torch.div(starts + Fr - 2, cfg.num_frame_per_block, rounding_mode="floor")[:, None]
            pos = torch.cat([k * cfg.num_action_per_block + torch.arange(T, device=x.device),
                             k * cfg.num_state_per_block + torch.arange(S, device=x.device)], 1)   # [R, T + S]
            angles = torch.cat([angles, action_rope_angles(cfg.head_dim, pos.flatten()).view(R, T + S, -1)], 1)
        cos, sin = angles.cos().float(), angles.sin().float()
        e = self.time_embedding(timestep_embedding(cfg.freq_dim, t).to(dtype)).float()    # [R, L, dim]
        e0 = self.time_projection(e.to(dtype)).float().unflatten(2, (6, cfg.dim))

        window = None if mask is not None else cfg.local_attn_size * tpf
        L = x.shape[1]
        if sp is not None:   # this rank's tokens from here to the last block
            x, e0, cos, sin = (sp.shard(t) for t in (x, e0, cos, sin))
        kv_out: list[KV] = []
        for i, blk in enumerate(self.blocks):
            x, kv = blk(x, e0, cos, sin, video_tokens, None if past is None else past[i], window,
                        cross[i], mask, paged, i, sp, L)
            if keep_kv and kv is not None:
                kv_out.append(kv)
            del kv
        if sp is not None:   # the whole chunk on every rank: the head reads video, the decoder actions
            x = sp.gather(x, L)
        video = self.head(x[:, :video_tokens], e[:, :video_tokens]).float()
        C = cfg.out_dim
        video = torch.einsum("bfhwpqrc->bcfphqwr", video.view(R, Fr, hp, wp, 1, ph, pw, C))
        video = video.reshape(R, C, Fr, H, W)
        act = None
        if register:
            act = self.action_decoder(x[:, video_tokens:video_tokens + actions.shape[1]]).float()
        return ChunkOutput(video, act, kv_out)
