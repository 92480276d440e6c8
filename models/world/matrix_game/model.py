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

K/V: ``flow`` attends through a ``BlockAttention``, which owns where the keys live. ``forward``
uses plain tensors per session (``SessionKV``, ``RowCaches``): per layer the self-attention K
(roped) and V of the frames ``window.kept_frames`` keeps, the mouse K/V per spatial token and
the keyboard K/V per frame of the action window, and returns per row the cache the block
leaves behind (what a committing pass keeps, a denoising pass drops); attention runs row by
row there. The served path (``attention.PagedBlock``) keeps the self-attention K/V in kv/
pages and the action K/V in per-session state, and batches rows by how much they hold.
Rows at different positions share every projection either way.

From the Wan blocks every Wan DiT here shares (``models/world/wan_blocks.py``): RMS norm, the
affine-free LayerNorm, the sinusoidal timestep embedding, 3-D RoPE, the self-attention's
projections (``Attention``), the output head and the cross-attention (Matrix-Game feeds it
CLIP tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from models.world.wan_blocks import (Attention, CrossAttention, Head, MLPProj, RMSNorm, layer_norm,
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


def rope_frames(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``apply_rope`` by latent frame for ``x [R, F, H, D]`` or ``[R, S, F, H, D]`` (every spatial
    token of a frame at the frame's angle); cos/sin ``[R, F, D/2]``."""
    xf = x.float().unflatten(-1, (-1, 2))
    x1, x2 = xf[..., 0], xf[..., 1]
    c, s = (cos[:, None, :, None, :], sin[:, None, :, None, :]) if x.ndim == 5 else \
        (cos[:, :, None, :], sin[:, :, None, :])
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).flatten(-2).type_as(x)


# -- how a block attends ------------------------------------------------------------------------

class BlockAttention(Protocol):
    """Where a block's keys and values live: the three attentions over a session's past and the
    block, and the cross-attention's image K/V. ``RowCaches`` keeps them in plain per-row
    tensors (``SessionKV``); the served path keeps them in kv/ pages and per-session state
    (``models/world/matrix_game/attention.py``). q/k/v arrive projected, normed and roped."""

    def self_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``[R, F*S, H, D]`` each -> ``[R, F*S, H, D]`` over the row's held frames and the block."""

    def mouse_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``[R, S, F, Ha, D]`` each -> ``[R, S, F, Ha, D]``: per spatial token, over its frames."""

    def keyboard_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q ``[R, S, F, Ha, D]``, k/v ``[R, F, Ha, D]`` (one key per frame) -> ``[R, S, F, Ha, D]``."""

    def cross_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The image K/V of each row, ``[R, tokens, H, D]``."""


class RowCaches:
    """``BlockAttention`` over each row's ``SessionKV``, row by row; ``caches()`` is what the
    block leaves behind (what a committing pass keeps)."""

    def __init__(self, cfg: MatrixGameConfig, rows: Sequence[RowInput], S: int, Fr: int) -> None:
        self.cfg, self.rows, self.S, self.Fr = cfg, rows, S, Fr
        self.starts = [r.start for r in rows]
        n = cfg.num_layers
        self._self: list[list[tuple[torch.Tensor, torch.Tensor] | None]] = [[None] * n for _ in rows]
        self._action: list[list[list[torch.Tensor | None]]] = [[[None] * 4 for _ in range(n)] for _ in rows]

    def cross_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.stack([r.cross[layer][0] for r in self.rows]),
                torch.stack([r.cross[layer][1] for r in self.rows]))

    def self_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cfg, S, Fr = self.cfg, self.S, self.Fr
        outs = []
        for r, row in enumerate(self.rows):
            start = self.starts[r]
            lk = row.kv.layers[layer]
            k_frames = list(row.kv.frames) + list(range(start, start + Fr))
            keys = torch.cat([lk.k.to(k.dtype), k[r]], 0)[None]
            vals = torch.cat([lk.v.to(v.dtype), v[r]], 0)[None]
            outs.append(_windowed(q[r][None], keys, vals, list(range(start, start + Fr)), k_frames, S,
                                  FRAMES_PER_BLOCK, cfg.sink_size, cfg.local_attn_size)[0])
            keep = kept_frames(start + Fr, cfg.sink_size, cfg.local_attn_size)
            tok = torch.tensor([k_frames.index(f) * S + t for f in keep for t in range(S)], device=q.device)
            self._self[r][layer] = (keys[0].index_select(0, tok), vals[0].index_select(0, tok))
        return torch.stack(outs)

    def mouse_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        outs = []
        for r, row in enumerate(self.rows):
            lk = row.kv.layers[layer]
            keys = torch.cat([lk.mouse_k.to(k.dtype), k[r]], 1)
            vals = torch.cat([lk.mouse_v.to(v.dtype), v[r]], 1)
            o, kk, vv = self._attend(q[r], keys, vals, row.kv.action_frames, self.starts[r])
            outs.append(o)
            self._action[r][layer][0], self._action[r][layer][1] = kk, vv
        return torch.stack(outs)

    def keyboard_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        outs = []
        for r, row in enumerate(self.rows):
            lk = row.kv.layers[layer]
            # One key per frame, shared by the S spatial queries (broadcast, never copied S times).
            keys = torch.cat([lk.key_k.to(k.dtype), k[r]], 0)[None]
            vals = torch.cat([lk.key_v.to(v.dtype), v[r]], 0)[None]
            o, kk, vv = self._attend(q[r], keys, vals, row.kv.action_frames, self.starts[r])
            outs.append(o)
            self._action[r][layer][2], self._action[r][layer][3] = kk[0], vv[0]
        return torch.stack(outs)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, past_frames: Sequence[int],
                start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Attention over time with frames as tokens: q ``[S, T, H, D]``, keys ``[S or 1, T', H, D]``;
        sink 0 as upstream. Returns the output and the keys/values the action cache keeps."""
        Fr, window = self.Fr, self.cfg.local_attn_size
        k_frames = list(past_frames) + list(range(start, start + Fr))
        q_frames = list(range(start, start + Fr))
        o = _windowed(q, keys, vals, q_frames, k_frames, 1, FRAMES_PER_BLOCK, 0, window)
        keep = [k_frames.index(f) for f in kept_frames(start + Fr, 0, window)]
        idx = torch.tensor(keep, device=keys.device)
        return o, keys.index_select(1, idx), vals.index_select(1, idx)

    def caches(self) -> list[SessionKV]:
        cfg, Fr = self.cfg, self.Fr
        return [SessionKV(tuple(kept_frames(s + Fr, cfg.sink_size, cfg.local_attn_size)),
                          tuple(kept_frames(s + Fr, 0, cfg.local_attn_size)),
                          tuple(LayerKV(*self._self[r][i], *self._action[r][i]) for i in range(cfg.num_layers)))
                for r, s in enumerate(self.starts)]


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

    def forward(self, x: torch.Tensor, layer: int, S: int, Fr: int, rope: tuple[torch.Tensor, torch.Tensor],
                keyboard: torch.Tensor, mouse: torch.Tensor | None, attn: BlockAttention) -> torch.Tensor:
        """``x [R, F*S, dim]`` -> x with both conditionings. ``rope``: the action cos/sin
        ``[R, F, D/2]``; ``keyboard`` ``[R, F, 12, keys]`` and ``mouse`` ``[R, F, 12, 2]``: each
        latent frame's action window."""
        a = self.cfg.action
        R = x.shape[0]
        H = self.heads
        eps = 1e-6
        cos, sin = rope
        if a.enable_mouse:
            m = mouse.to(x.dtype).flatten(2)[:, None].expand(R, S, Fr, -1)       # [R, S, F, 24]
            h = x.view(R, Fr, S, -1).transpose(1, 2)                              # [R, S, F, dim]
            g = self.mouse_mlp(torch.cat([h, m], -1))
            q, k, v = self.t_qkv(g).view(R, S, Fr, 3, H, -1).unbind(3)            # [R, S, F, H, D]
            q, k = _rms(q, eps).to(v.dtype), _rms(k, eps).to(v.dtype)
            o = attn.mouse_attention(layer, rope_frames(q, cos, sin), rope_frames(k, cos, sin), v)
            x = x + self.proj_mouse(o.transpose(1, 2).reshape(R, Fr * S, -1))

        kb = self.keyboard_embed(keyboard.to(x.dtype))                            # [R, F, 12, hid]
        k, v = self.keyboard_attn_kv(kb.flatten(2)).view(R, Fr, 2, H, -1).unbind(2)   # [R, F, H, D]
        q = self.mouse_attn_q(x).view(R, Fr, S, H, -1)
        q, k = _rms(q, eps).to(v.dtype), _rms(k, eps).to(v.dtype)
        q = q.transpose(1, 2)                                                     # [R, S, F, H, D]
        o = attn.keyboard_attention(layer, rope_frames(q, cos, sin), rope_frames(k, cos, sin), v)
        return x + self.proj_keyboard(o.transpose(1, 2).reshape(R, Fr * S, -1))


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
        """Predict the flow of one block for every row, over plain per-row caches.

        ``latents``: ``[R, 16, F, h, w]``; ``cond``: ``[R, 20, F, h, w]`` (mask, image latents) of
        the same frames; ``timestep``: ``[R]`` or ``[R, F]``. Returns the flow ``[R, 16, F, h, w]``
        (float32) and per row the cache after this block (keep it on the committing pass).
        A row whose cache is empty and whose ``F`` spans several blocks from frame 0 runs
        one-shot: every frame under the block-causal window (the training form).
        """
        if len(rows) != latents.shape[0]:
            raise ValueError(f"{latents.shape[0]} rows of latents, {len(rows)} row inputs")
        for r in rows:
            if r.kv.next_frame != r.start:
                raise ValueError(f"row at frame {r.start} has a cache ending at frame {r.kv.next_frame}")
        S = self.tokens_per_frame(*latents.shape[3:])
        caches = RowCaches(self.config, rows, S, latents.shape[2])
        keyboard = torch.stack([r.keyboard for r in rows])
        mouse = torch.stack([r.mouse for r in rows]) if self.config.action.enable_mouse else None
        out = self.flow(latents, cond, timestep, [r.start for r in rows], keyboard, mouse, caches)
        return out, caches.caches()

    def flow(self, latents: torch.Tensor, cond: torch.Tensor, timestep: torch.Tensor, starts: Sequence[int],
             keyboard: torch.Tensor, mouse: torch.Tensor | None, attn: BlockAttention) -> torch.Tensor:
        """The flow ``[R, 16, F, h, w]`` (float32) of one block of every row, attending through
        ``attn``. ``starts``: each row's first latent frame; ``keyboard`` ``[R, F, 12, keys]`` and
        ``mouse`` ``[R, F, 12, 2]`` (None without a mouse): each latent frame's action window."""
        cfg = self.config
        R, C, Fr, H, W = latents.shape
        if C + cond.shape[1] != cfg.in_dim or cond.shape[0] != R or tuple(cond.shape[2:]) != (Fr, H, W):
            raise ValueError(f"latents {tuple(latents.shape)} and cond {tuple(cond.shape)} do not make "
                             f"[rows, {cfg.in_dim}, frames, h, w]")
        if len(starts) != R:
            raise ValueError(f"{R} rows of latents, {len(starts)} starts")
        _, ph, pw = cfg.patch_size
        if H % ph or W % pw:
            raise ValueError(f"latent {H}x{W} is not whole {ph}x{pw} patches")
        block = FRAMES_PER_BLOCK
        if Fr % block or any(s % block for s in starts):
            raise ValueError(f"frames {Fr} at starts {list(starts)}: blocks of {block} latent frames, aligned")
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

        start_t = torch.tensor(list(starts), device=x.device)
        angles = rope_angles(cfg.head_dim, start_t, Fr, hp, wp)
        cos, sin = angles.cos().float(), angles.sin().float()
        a = cfg.action
        act = [action_rope(a.mouse_qk_dim_list, a.rope_theta, torch.arange(s, s + Fr, device=x.device))
               for s in starts]
        action_rope_rows = (torch.cat([c for c, _ in act]), torch.cat([s for _, s in act]))   # [R, F, D/2]

        for i, blk in enumerate(self.blocks):
            mod = (blk.modulation.float()[None] + e0_tok).unbind(2)
            y = (layer_norm(x, self.config.eps).float() * (1 + mod[1]) + mod[0]).type_as(x)
            q, k, v = blk.self_attn.roped(y, cos, sin)
            y = blk.self_attn.o(attn.self_attention(i, q, k, v).flatten(2))
            x = (x.float() + y.float() * mod[2]).type_as(x)
            ck, cv = attn.cross_kv(i)
            x = x + blk.cross_attn(blk.norm3(x), ck.to(x.dtype), cv.to(x.dtype))
            if blk.action_model is not None:
                x = blk.action_model(x, i, S, Fr, action_rope_rows, keyboard, mouse, attn)
            y = (layer_norm(x, self.config.eps).float() * (1 + mod[4]) + mod[3]).type_as(x)
            x = (x.float() + blk.ffn(y).float() * mod[5]).type_as(x)

        out = self.head(x, e_tok)                                                          # [R, L, p*C]
        Co = cfg.out_dim
        out = out.float().view(R, Fr, hp, wp, 1, ph, pw, Co)
        return torch.einsum("bfhwpqrc->bcfphqwr", out).reshape(R, Co, Fr, H, W)
