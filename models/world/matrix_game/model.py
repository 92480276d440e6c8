"""``MatrixGameDiT``: Matrix-Game 2.0's causal Wan DiT with keyboard and mouse modules.

Module and parameter names are the checkpoint's (upstream ``CausalWanModel`` under the
``model.`` prefix that ``checkpoint.py`` strips), so the state dict loads name for name.
One forward runs one block of 3 latent frames for every row (a row is a session)::

    x  = patch_embedding([noisy latents; mask; image latents])          [R, F*S, dim]
    e  = time_embedding(sinusoid(t)) per frame; e0 = time_projection(e) (6 modulations)
    ctx = img_emb(CLIP image tokens)   once per session -> per layer cross K/V
    per transformer block:
        x = x + gate1 * self_attn(norm1(x) * (1 + scale1) + shift1)   # cache + block, windowed
        x = x + cross_attn(norm3(x), ctx K/V)
        x = action_model(x, mouse, keyboard)                          # blocks 0..14 only
        x = x + gate2 * ffn(norm2(x) * (1 + scale2) + shift2)
    flow = head(x, e)                                                 [R, 16, F, h, w]

The action module (upstream ``ActionModule``, after HunyuanVideo-GameCraft) attends over
time only, frame by frame:
    mouse:    per spatial token s and latent frame f, ``[x[f, s]; the 12 mouse deltas of f's
              window]`` -> mouse_mlp -> t_qkv -> q, k, v; attention over the frames of the
              same s (cached + block, windowed); x += proj_mouse(out).
    keyboard: per latent frame f, the 12 key vectors of f's window -> keyboard_embed (per
              video frame) -> concatenated -> keyboard_attn_kv -> k, v (one per frame, shared
              by every spatial token); q = mouse_attn_q(x) per token; attention over frames;
              x += proj_keyboard(out).
Both RoPE their q and k by absolute latent frame (only the first ``mouse_qk_dim_list[0]``
dims rotate; theta 256), and RMS-normalise q and k without their stored weights (upstream's
action ``WanRMSNorm.forward`` never multiplies ``weight``).

K/V: plain tensors per session (``SessionKV``): per layer the self-attention K (roped) and V
of the frames ``window.kept_frames`` keeps, the mouse K/V per spatial token and the keyboard
K/V per frame of the action window. ``forward`` returns, per row, the cache the block leaves
behind (what a committing pass keeps, a denoising pass drops). Rows at different positions,
with different cache lengths, share every projection; only attention runs row by row.

From the Wan blocks every Wan DiT here shares (``models/world/wan_blocks.py``): RMS norm, the
affine-free LayerNorm, the sinusoidal timestep embedding, 3-D RoPE, the self-attention's
projections (``Attention``), the output head and the cross-attention (Matrix-Game feeds it
CLIP tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from models.world.wan_blocks import (Attention, CrossAttention, Head, MLPProj, RMSNorm, apply_rope, layer_norm,
                                     rope_angles, timestep_embedding)
from models.world.matrix_game.config import CLIP_DIM, FRAMES_PER_BLOCK, MatrixGameConfig
from models.world.matrix_game.window import kept_frames, visible


# -- per-session state ----------------------------------------------------------------------

@dataclass(frozen=True)
class LayerKV:
    """One layer's cache of one session. Self: ``[frames*S, H, D]``; mouse ``[S, frames, Ha, Da]``
    and keyboard ``[frames, Ha, Da]`` over the action frames (None in a layer without them)."""

    k: torch.Tensor
    v: torch.Tensor
    mouse_k: torch.Tensor | None = None
    mouse_v: torch.Tensor | None = None
    key_k: torch.Tensor | None = None
    key_v: torch.Tensor | None = None


@dataclass(frozen=True)
class SessionKV:
    """A session's caches: ``frames`` (absolute latent frames of the self-attention K/V, in
    order), ``action_frames`` (those of the action K/V) and one ``LayerKV`` per layer."""

    frames: tuple[int, ...]
    action_frames: tuple[int, ...]
    layers: tuple[LayerKV, ...]

    @property
    def next_frame(self) -> int:
        return self.frames[-1] + 1 if self.frames else 0


def empty_kv(cfg: MatrixGameConfig, tokens_per_frame: int, *, device: torch.device | str = "cpu",
             dtype: torch.dtype = torch.float32) -> SessionKV:
    """The cache of a session before its first block."""
    H, D = cfg.num_heads, cfg.head_dim
    a = cfg.action
    Ha, Dm, Dk = a.heads_num, a.mouse_hidden_dim // a.heads_num, a.keyboard_hidden_dim // a.heads_num
    z = lambda *s: torch.zeros(*s, device=device, dtype=dtype)  # noqa: E731
    layers = []
    for i in range(cfg.num_layers):
        act = i in a.blocks
        mouse = act and a.enable_mouse
        layers.append(LayerKV(z(0, H, D), z(0, H, D),
                              z(tokens_per_frame, 0, Ha, Dm) if mouse else None,
                              z(tokens_per_frame, 0, Ha, Dm) if mouse else None,
                              z(0, Ha, Dk) if act else None, z(0, Ha, Dk) if act else None))
    return SessionKV((), (), tuple(layers))


@dataclass(frozen=True)
class RowInput:
    """What one row (session) brings to a block beside its latents.

    ``start``: the block's first latent frame; ``kv``: the session's cache (its frames end at
    ``start``); ``cross``: per layer the CLIP K/V ``[tokens, H, D]`` (``MatrixGameDiT.project_image``);
    ``keyboard``: ``[frames, 12, keys]`` and ``mouse``: ``[frames, 12, 2]`` (None without a mouse),
    each latent frame's action window (``window.action_window``).
    """

    start: int
    kv: SessionKV
    cross: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    keyboard: torch.Tensor
    mouse: torch.Tensor | None = None


# -- attention helpers ------------------------------------------------------------------------

def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``[B, Lq, H, D]`` x ``[B, Lk, H, D]`` -> ``[B, Lq, H, D]``."""
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.to(q.dtype).transpose(1, 2),
                                       v.to(q.dtype).transpose(1, 2), attn_mask=mask)
    return o.transpose(1, 2)


def _frame_mask(q_frames: Sequence[int], k_frames: Sequence[int], block: int, sink: int,
                window: int) -> torch.Tensor:
    return torch.tensor([[visible(qf, kf, block, sink, window) for kf in k_frames] for qf in q_frames])


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """The action module's RMS norm: no gain applied (upstream keeps but never reads ``weight``)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def action_rope(qk_dims: Sequence[int], theta: float, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``[1, T, D/2]`` for the action attentions: the first ``qk_dims[0]`` dims rotate by
    the latent frame (float32, as upstream's table), height and width sit at position 0."""
    d0 = qk_dims[0]
    freqs = 1.0 / theta ** (torch.arange(0, d0, 2, dtype=torch.float32, device=positions.device)[: d0 // 2] / d0)
    ang = torch.outer(positions.to(torch.float32), freqs)
    rest = torch.zeros(len(positions), (sum(qk_dims) - d0) // 2, device=positions.device)
    ang = torch.cat([ang, rest], -1)[None]
    return ang.cos(), ang.sin()


# -- modules ------------------------------------------------------------------------------------

class ActionModule(nn.Module):
    """Keyboard and mouse conditioning of one transformer block (names as upstream)."""

    def __init__(self, cfg: MatrixGameConfig) -> None:
        super().__init__()
        a = cfg.action
        self.cfg = cfg
        self.heads = a.heads_num
        w = a.window_video_frames
        if a.enable_keyboard:
            self.keyboard_embed = nn.Sequential(nn.Linear(a.keyboard_dim_in, a.hidden_size), nn.SiLU(),
                                                nn.Linear(a.hidden_size, a.hidden_size))
            self.key_attn_q_norm = RMSNorm(a.keyboard_hidden_dim // a.heads_num, 1e-6)
            self.key_attn_k_norm = RMSNorm(a.keyboard_hidden_dim // a.heads_num, 1e-6)
            self.mouse_attn_q = nn.Linear(cfg.dim, a.keyboard_hidden_dim, bias=False)
            self.keyboard_attn_kv = nn.Linear(a.hidden_size * w, 2 * a.keyboard_hidden_dim, bias=False)
            self.proj_keyboard = nn.Linear(a.keyboard_hidden_dim, cfg.dim, bias=False)
        if a.enable_mouse:
            c = a.mouse_hidden_dim
            self.mouse_mlp = nn.Sequential(nn.Linear(a.mouse_dim_in * w + cfg.dim, c), nn.GELU(approximate="tanh"),
                                           nn.Linear(c, c), nn.LayerNorm(c))
            self.t_qkv = nn.Linear(c, 3 * c, bias=False)
            self.img_attn_q_norm = RMSNorm(c // a.heads_num, 1e-6)
            self.img_attn_k_norm = RMSNorm(c // a.heads_num, 1e-6)
            self.proj_mouse = nn.Linear(c, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, rows: Sequence[RowInput], layer: int, S: int, Fr: int,
                starts: list[int], block: int) -> tuple[torch.Tensor, list[tuple[torch.Tensor | None, ...]]]:
        """``x [R, F*S, dim]`` -> x with both conditionings, and per row the action K/V the block
        leaves behind (mouse_k, mouse_v, key_k, key_v)."""
        a, cfg = self.cfg.action, self.cfg
        R = x.shape[0]
        H = self.heads
        eps = 1e-6
        window = cfg.local_attn_size
        out_kv: list[list[torch.Tensor | None]] = [[None] * 4 for _ in range(R)]
        pos = [torch.arange(s, s + Fr, device=x.device) for s in starts]
        ropes = [action_rope(a.mouse_qk_dim_list, a.rope_theta, p) for p in pos]

        if a.enable_mouse:
            mouse = torch.stack([r.mouse for r in rows]).to(x.dtype)              # [R, F, 12, 2]
            m = mouse.flatten(2)[:, None].expand(R, S, Fr, -1)                   # [R, S, F, 24]
            h = x.view(R, Fr, S, -1).transpose(1, 2)                              # [R, S, F, dim]
            g = self.mouse_mlp(torch.cat([h, m], -1))
            q, k, v = self.t_qkv(g).view(R, S, Fr, 3, H, -1).unbind(3)            # [R, S, F, H, D]
            q, k = _rms(q, eps).to(v.dtype), _rms(k, eps).to(v.dtype)
            outs = []
            for r, row in enumerate(rows):
                cos, sin = ropes[r]
                qr, kr = apply_rope(q[r], cos, sin), apply_rope(k[r], cos, sin)
                lk = row.kv.layers[layer]
                keys = torch.cat([lk.mouse_k.to(kr.dtype), kr], 1)
                vals = torch.cat([lk.mouse_v.to(v.dtype), v[r]], 1)
                o, kk, vv = self._attend(qr, keys, vals, row.kv.action_frames, starts[r], Fr, block, window)
                outs.append(o)
                out_kv[r][0], out_kv[r][1] = kk, vv
            o = torch.stack(outs)                                                 # [R, S, F, H, D]
            o = o.transpose(1, 2).reshape(R, Fr * S, -1)
            x = x + self.proj_mouse(o)

        kb = self.keyboard_embed(torch.stack([r.keyboard for r in rows]).to(x.dtype))  # [R, F, 12, hid]
        k, v = self.keyboard_attn_kv(kb.flatten(2)).view(R, Fr, 2, H, -1).unbind(2)   # [R, F, H, D]
        q = self.mouse_attn_q(x).view(R, Fr, S, H, -1)
        q, k = _rms(q, eps).to(v.dtype), _rms(k, eps).to(v.dtype)
        q = q.transpose(1, 2)                                                     # [R, S, F, H, D]
        outs = []
        for r, row in enumerate(rows):
            cos, sin = ropes[r]
            qr, kr = apply_rope(q[r], cos, sin), apply_rope(k[r][None], cos, sin)[0]
            lk = row.kv.layers[layer]
            # One key per frame, shared by the S spatial queries (broadcast, never copied S times).
            keys = torch.cat([lk.key_k.to(kr.dtype), kr], 0)[None]
            vals = torch.cat([lk.key_v.to(v.dtype), v[r]], 0)[None]
            o, kk, vv = self._attend(qr, keys, vals, row.kv.action_frames, starts[r], Fr, block, window)
            outs.append(o)
            out_kv[r][2], out_kv[r][3] = kk[0], vv[0]
        o = torch.stack(outs).transpose(1, 2).reshape(R, Fr * S, -1)
        x = x + self.proj_keyboard(o)
        return x, [tuple(t) for t in out_kv]

    @staticmethod
    def _attend(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, past_frames: Sequence[int],
                start: int, Fr: int, block: int, window: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Attention over time with frames as tokens: q ``[S, T, H, D]``, keys ``[S or 1, T', H, D]``;
        sink 0 as upstream. Returns the output and the keys/values the action cache keeps."""
        k_frames = list(past_frames) + list(range(start, start + Fr))
        q_frames = list(range(start, start + Fr))
        o = _windowed(q, keys, vals, q_frames, k_frames, 1, block, 0, window)
        keep = [k_frames.index(f) for f in kept_frames(start + Fr, 0, window)]
        idx = torch.tensor(keep, device=keys.device)
        return o, keys.index_select(1, idx), vals.index_select(1, idx)


def _windowed(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, q_frames: Sequence[int],
              k_frames: Sequence[int], tokens_per_frame: int, block: int, sink: int,
              window: int) -> torch.Tensor:
    """Attention of ``q`` (frames ``q_frames``) over ``keys`` (frames ``k_frames``), each frame
    ``tokens_per_frame`` consecutive tokens, under the block-causal rolling window. Keys no query
    sees are dropped; a mask is built only when queries see different keys (one-shot mode)."""
    fm = _frame_mask(q_frames, k_frames, block, sink, window)
    used = fm.any(0).nonzero().flatten().tolist()
    fm = fm[:, used]
    tok = torch.tensor([f * tokens_per_frame + t for f in used for t in range(tokens_per_frame)],
                       device=keys.device)
    keys, vals = keys.index_select(1, tok), vals.index_select(1, tok)
    if keys.shape[0] != q.shape[0]:
        keys, vals = keys.expand(q.shape[0], -1, -1, -1), vals.expand(q.shape[0], -1, -1, -1)
    mask = None
    if not bool(fm.all()):
        mask = fm.repeat_interleave(tokens_per_frame, 0).repeat_interleave(tokens_per_frame, 1).to(q.device)
    return _sdpa(q, keys, vals, mask)


class Block(nn.Module):
    def __init__(self, cfg: MatrixGameConfig, index: int) -> None:
        super().__init__()
        dim = cfg.dim
        self.eps = cfg.eps
        self.self_attn = Attention(dim, cfg.num_heads, cfg.eps)
        self.norm3 = nn.LayerNorm(dim, eps=cfg.eps, elementwise_affine=True)
        self.cross_attn = CrossAttention(dim, cfg.num_heads, cfg.eps)
        self.ffn = nn.Sequential(nn.Linear(dim, cfg.ffn_dim), nn.GELU(approximate="tanh"),
                                 nn.Linear(cfg.ffn_dim, dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim ** 0.5)
        self.action_model = ActionModule(cfg) if index in cfg.action.blocks else None


class MatrixGameDiT(nn.Module):
    """The causal DiT; one ``forward`` runs one block of every row."""

    def __init__(self, config: MatrixGameConfig | None = None) -> None:
        super().__init__()
        cfg = config or MatrixGameConfig()
        self.config = cfg
        dim = cfg.dim
        self.patch_embedding = nn.Conv3d(cfg.in_dim, dim, cfg.patch_size, stride=cfg.patch_size)
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.head = Head(dim, math.prod(cfg.patch_size) * cfg.out_dim, cfg.eps)
        self.img_emb = MLPProj(CLIP_DIM, dim)

    # -- per session, once -------------------------------------------------------------------

    def project_image(self, clip_tokens: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """CLIP tokens ``[tokens, 1280]`` of the first image -> per layer cross (K, V) ``[tokens, H, D]``."""
        ctx = self.img_emb(clip_tokens.to(self.patch_embedding.weight.dtype))[None]
        return tuple((k[0], v[0]) for k, v in (blk.cross_attn.project(ctx) for blk in self.blocks))

    def tokens_per_frame(self, h: int, w: int) -> int:
        _, ph, pw = self.config.patch_size
        return (h // ph) * (w // pw)

    # -- one block -------------------------------------------------------------------------------

    def embed_patches(self, x: torch.Tensor) -> torch.Tensor:
        """``[R, C, F, h, w]`` -> ``[R, F*h'*w', dim]``: the patch convolution as one matrix
        product over patches (a row per token, the same kernel at any batch size)."""
        pt, ph, pw = self.config.patch_size
        R, C, Fr, h, w = x.shape
        x = x.reshape(R, C, Fr // pt, pt, h // ph, ph, w // pw, pw)
        x = x.permute(0, 2, 4, 6, 1, 3, 5, 7).reshape(R, (Fr // pt) * (h // ph) * (w // pw), -1)
        conv = self.patch_embedding
        return F.linear(x, conv.weight.flatten(1), conv.bias)

    def forward(self, latents: torch.Tensor, cond: torch.Tensor, timestep: torch.Tensor,
                rows: Sequence[RowInput]) -> tuple[torch.Tensor, list[SessionKV]]:
        """Predict the flow of one block for every row.

        ``latents``: ``[R, 16, F, h, w]``; ``cond``: ``[R, 20, F, h, w]`` (mask, image latents) of
        the same frames; ``timestep``: ``[R]`` or ``[R, F]``. Returns the flow ``[R, 16, F, h, w]``
        (float32) and per row the cache after this block (keep it on the committing pass).
        A row whose cache is empty and whose ``F`` spans several blocks from frame 0 runs
        one-shot: every frame under the block-causal window (the training form).
        """
        cfg = self.config
        R, C, Fr, H, W = latents.shape
        if C + cond.shape[1] != cfg.in_dim or cond.shape[0] != R or tuple(cond.shape[2:]) != (Fr, H, W):
            raise ValueError(f"latents {tuple(latents.shape)} and cond {tuple(cond.shape)} do not make "
                             f"[rows, {cfg.in_dim}, frames, h, w]")
        if len(rows) != R:
            raise ValueError(f"{R} rows of latents, {len(rows)} row inputs")
        _, ph, pw = cfg.patch_size
        if H % ph or W % pw:
            raise ValueError(f"latent {H}x{W} is not whole {ph}x{pw} patches")
        starts = [r.start for r in rows]
        for r in rows:
            if r.kv.next_frame != r.start:
                raise ValueError(f"row at frame {r.start} has a cache ending at frame {r.kv.next_frame}")
        block = FRAMES_PER_BLOCK
        if Fr % block or any(s % block for s in starts):
            raise ValueError(f"frames {Fr} at starts {starts}: blocks of {block} latent frames, aligned")
        dtype = self.patch_embedding.weight.dtype
        hp, wp = H // ph, W // pw
        S = hp * wp
        x = self.embed_patches(torch.cat([latents, cond], 1).to(dtype))                # [R, L, dim]

        if timestep.ndim == 1:
            timestep = timestep[:, None].expand(R, Fr)
        e = self.time_embedding(timestep_embedding(cfg.freq_dim, timestep).to(dtype)).float()  # [R, F, dim]
        e0 = self.time_projection(e.to(dtype)).float().unflatten(2, (6, cfg.dim))              # [R, F, 6, dim]
        e_tok = e.repeat_interleave(S, 1)
        e0_tok = e0.repeat_interleave(S, 1)

        angles = rope_angles(cfg.head_dim, torch.tensor(starts, device=x.device), Fr, hp, wp)
        cos, sin = angles.cos().float(), angles.sin().float()
        cross_k = [torch.stack([r.cross[i][0] for r in rows]) for i in range(cfg.num_layers)]
        cross_v = [torch.stack([r.cross[i][1] for r in rows]) for i in range(cfg.num_layers)]

        new_layers: list[list[LayerKV]] = [[] for _ in range(R)]
        for i, blk in enumerate(self.blocks):
            mod = (blk.modulation.float()[None] + e0_tok).unbind(2)
            y = (layer_norm(x, self.config.eps).float() * (1 + mod[1]) + mod[0]).type_as(x)
            q, k, v = blk.self_attn.roped(y, cos, sin)
            outs, kept = [], []
            for r, row in enumerate(rows):
                lk = row.kv.layers[i]
                k_frames = list(row.kv.frames) + list(range(starts[r], starts[r] + Fr))
                keys = torch.cat([lk.k.to(k.dtype), k[r]], 0)[None]
                vals = torch.cat([lk.v.to(v.dtype), v[r]], 0)[None]
                outs.append(_windowed(q[r][None], keys, vals, list(range(starts[r], starts[r] + Fr)),
                                      k_frames, S, block, cfg.sink_size, cfg.local_attn_size)[0])
                keep = kept_frames(starts[r] + Fr, cfg.sink_size, cfg.local_attn_size)
                tok = torch.tensor([k_frames.index(f) * S + t for f in keep for t in range(S)], device=x.device)
                kept.append((keys[0].index_select(0, tok), vals[0].index_select(0, tok)))
            y = blk.self_attn.o(torch.stack(outs).flatten(2))
            x = (x.float() + y.float() * mod[2]).type_as(x)
            x = x + blk.cross_attn(blk.norm3(x), cross_k[i], cross_v[i])
            action_kv: list[tuple[torch.Tensor | None, ...]] = [(None,) * 4] * R
            if blk.action_model is not None:
                x, action_kv = blk.action_model(x, rows, i, S, Fr, starts, block)
            y = (layer_norm(x, self.config.eps).float() * (1 + mod[4]) + mod[3]).type_as(x)
            x = (x.float() + blk.ffn(y).float() * mod[5]).type_as(x)
            for r in range(R):
                new_layers[r].append(LayerKV(*kept[r], *action_kv[r]))

        out = self.head(x, e_tok)                                                          # [R, L, p*C]
        Co = cfg.out_dim
        out = out.float().view(R, Fr, hp, wp, 1, ph, pw, Co)
        out = torch.einsum("bfhwpqrc->bcfphqwr", out).reshape(R, Co, Fr, H, W)
        caches = [SessionKV(tuple(kept_frames(s + Fr, cfg.sink_size, cfg.local_attn_size)),
                            tuple(kept_frames(s + Fr, 0, cfg.local_attn_size)), tuple(layers))
                  for s, layers in zip(starts, new_layers)]
        return out, caches
