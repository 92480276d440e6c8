"""The maze world model: a pixel-space frame-causal DiT that predicts the clean frame.

Tokens: a 64x64 RGB frame in [-1, 1] is cut into 4x4 patches, 256 tokens of 48
values, embedded to ``dim`` and given a learned per-patch position. Every frame
carries its own conditioning vector ``c = emb(noise level) + emb(action bits)``
that drives adaLN-Zero modulation in every block, so frames of one clip can sit
at different noise levels (diffusion forcing) and each frame knows the keys held
while it was made. The output is the model's estimate of the clean frame x0.

Attention is block-causal over frames (a frame sees itself, bidirectionally, and
every earlier frame). Positions live in rotary embeddings on part of each head:

    head dim 64 = 48 rotated (24 angle pairs) + 16 plain
    pairs  0..7   time: angle = pos * 2*pi*k/64, k in (1,2,3,4,6,8,12,16)
    pairs  8..15  patch row:    angle = row * 100**(-j/8)
    pairs 16..23  patch column: angle = col * 100**(-j/8)

Every time frequency is a whole number of turns per 64 frames, so a frame at
position p and one at p mod 64 are indistinguishable: the cache can store keys
rotated at ``frame_index % 64`` and positions never grow, while the distances the
model sees (at most 15 frames back) are the ones it trained on. The first frame
of a clip (the session's first frame at inference, the *sink*) is stored with its
time dims zeroed, so it looks the same from any later frame however far behind
it falls; a learned ``sink`` vector marks its tokens.

Two entry points share the weights:
- ``forward_clip``: a whole clip [B, T, ...] at once (training, evaluation).
- ``forward_frame``: one new frame per batch row against cached keys/values
  (serving; see ``cache.py``), returning the frame's own K/V per layer.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from models.maze.sim import H
from models.world.maze.attention import attend, frame_causal_mask
from models.world.rows import padded

FRAME = H  # the simulator's square frame, one definition (sim.H == sim.W)
TIME_PERIOD = 64
TIME_TURNS = (1, 2, 3, 4, 6, 8, 12, 16)
ROT_PAIRS = 24
ACTION_BITS = 8
# The MLPs' activation (MazeDiT.set_gelu): the tanh approximation training used, or the exact
# (erf) GELU, which is within 4.7e-4 of it everywhere and 5x cheaper in torch's CPU kernels.
GELUS = {"tanh": "tanh", "erf": "none"}  # name -> nn.GELU(approximate=...)


@dataclass(frozen=True)
class MazeDiTConfig:
    dim: int = 192
    depth: int = 8
    heads: int = 3
    patch: int = 4
    clip_frames: int = 16     # training clip = sink + 14 window frames + the new frame
    mlp_ratio: int = 4

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def tokens(self) -> int:
        return (FRAME // self.patch) ** 2

    @property
    def patch_values(self) -> int:
        return 3 * self.patch * self.patch

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """[..., 3, 64, 64] -> [..., 256, 48] (row-major patches, channels-then-pixels)."""
    lead = x.shape[:-3]
    g = FRAME // p
    x = x.reshape(-1, 3, g, p, g, p).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(*lead, g * g, 3 * p * p)


def unpatchify(x: torch.Tensor, p: int) -> torch.Tensor:
    lead = x.shape[:-2]
    g = FRAME // p
    x = x.reshape(-1, g, g, 3, p, p).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(*lead, 3, FRAME, FRAME)


def spatial_angles(grid: int, device: torch.device) -> torch.Tensor:
    """[grid*grid, 16] rotary angles for the row and column pairs."""
    freq = 100.0 ** (-torch.arange(8, device=device, dtype=torch.float32) / 8)
    idx = torch.arange(grid * grid, device=device)
    row, col = (idx // grid).float(), (idx % grid).float()
    return torch.cat([row[:, None] * freq, col[:, None] * freq], 1)


_TURNS: dict[str, torch.Tensor] = {}


def time_angles(pos: torch.Tensor) -> torch.Tensor:
    """pos [...] integer frame positions -> [..., 8] angles, periodic in TIME_PERIOD."""
    key = str(pos.device)
    if key not in _TURNS:  # made once per device: no host->device copy inside a CUDA graph capture
        _TURNS[key] = torch.tensor(TIME_TURNS, device=pos.device, dtype=torch.float32)
    turns = _TURNS[key]
    phase = torch.remainder(pos, TIME_PERIOD).float()
    return phase[..., None] * (2 * math.pi / TIME_PERIOD) * turns


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first 48 dims of x [..., D] as 24 pairs (i, i+24); cos/sin [..., 24]."""
    x1, x2, rest = x[..., :ROT_PAIRS], x[..., ROT_PAIRS:2 * ROT_PAIRS], x[..., 2 * ROT_PAIRS:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], -1)


def zero_time_dims(k: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """Zero the time pairs of keys whose token belongs to a sink frame (sink broadcast to k[..., 0])."""
    keep = torch.ones(k.shape[-1], device=k.device, dtype=k.dtype)
    keep[:8] = 0
    keep[ROT_PAIRS:ROT_PAIRS + 8] = 0
    return torch.where(sink[..., None], k * keep, k)


def timestep_embedding(t: torch.Tensor, dim: int = 256) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    a = (t.float() * 1000.0)[..., None] * freqs
    return torch.cat([a.cos(), a.sin()], -1)


class Block(nn.Module):
    def __init__(self, cfg: MazeDiTConfig) -> None:
        super().__init__()
        d = cfg.dim
        self.heads, self.hd = cfg.heads, cfg.head_dim
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.norm2 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(d, 3 * d)
        self.q_norm = nn.RMSNorm(self.hd, eps=1e-6)
        self.k_norm = nn.RMSNorm(self.hd, eps=1e-6)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, cfg.mlp_ratio * d), nn.GELU(approximate="tanh"),
                                 nn.Linear(cfg.mlp_ratio * d, d))
        self.ada = nn.Linear(d, 6 * d)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def qkv_heads(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sink: torch.Tensor | None):
        """h [B, N, D] -> q, k, v [B, H, N, hd], rotated; sink [B, N] bool marks sink tokens
        (None: no token is a sink's, which skips the masking)."""
        B, N, _ = h.shape
        q, k, v = self.qkv(h).view(B, N, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
        q = rope(self.q_norm(q), cos, sin).to(v.dtype)
        k = rope(self.k_norm(k), cos, sin)
        if sink is not None:
            k = zero_time_dims(k, sink[:, None, :])
        return q, k.to(v.dtype), v

    def modulation(self, c: torch.Tensor) -> list[torch.Tensor]:
        return self.ada(F.silu(c)).chunk(6, -1)

    def forward(self, h: torch.Tensor, c: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                sink: torch.Tensor, mask: Any) -> torch.Tensor:
        """A whole clip: h [B, T*n, D], c [B, T, D] per-frame conditioning (compiled per block)."""
        B, L, D = h.shape
        n = L // c.shape[1]
        sh1, sc1, g1, sh2, sc2, g2 = (m.repeat_interleave(n, 1) for m in self.modulation(c))
        q, k, v = self.qkv_heads(self.norm1(h) * (1 + sc1) + sh1, cos, sin, sink)
        o = attend(q, k, v, mask).transpose(1, 2).reshape(B, L, D)
        h = h + g1 * self.proj(o)
        return h + g2 * self.mlp(self.norm2(h) * (1 + sc2) + sh2)


class MazeDiT(nn.Module):
    def __init__(self, cfg: MazeDiTConfig = MazeDiTConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.dim
        self.embed = nn.Linear(cfg.patch_values, d)
        self.pos = nn.Parameter(torch.randn(cfg.tokens, d) * 0.02)
        self.sink = nn.Parameter(torch.randn(d) * 0.02)
        self.t_mlp = nn.Sequential(nn.Linear(256, d), nn.SiLU(), nn.Linear(d, d))
        self.a_mlp = nn.Sequential(nn.Linear(ACTION_BITS, d), nn.SiLU(), nn.Linear(d, d))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.norm_out = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.ada_out = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, cfg.patch_values)
        for m in (self.ada_out, self.out):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)
        # Float32 angle tables per device, kept off the module so .to(bfloat16) never rounds them.
        self._spatial: dict[str, torch.Tensor] = {}
        self.flex = False  # training on CUDA turns this on (FlexAttention block mask)
        self._masks: dict[Any, Any] = {}

    def set_gelu(self, name: str) -> None:
        """Every block's MLP activation: ``"tanh"`` (as trained) or ``"erf"`` (``GELUS``)."""
        if name not in GELUS:
            raise ValueError(f"gelu must be one of {sorted(GELUS)}, got {name!r}")
        for blk in self.blocks:
            blk.mlp[1].approximate = GELUS[name]

    @property
    def gelu(self) -> str:
        return next(k for k, v in GELUS.items() if v == self.blocks[0].mlp[1].approximate)

    # ------------------------------------------------------------------ pieces
    def cond(self, t: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        dt = self.embed.weight.dtype
        return self.t_mlp(timestep_embedding(t).to(dt)) + self.a_mlp(a.to(dt))

    def angles(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pos [B, T] -> cos, sin [B, 1, T*256, 24] (the 1 broadcasts over heads)."""
        B, T = pos.shape
        n = self.cfg.tokens
        ta = time_angles(pos)[:, :, None, :].expand(B, T, n, 8)
        key = str(pos.device)
        if key not in self._spatial:
            self._spatial[key] = spatial_angles(FRAME // self.cfg.patch, pos.device)
        sa = self._spatial[key][None, None].expand(B, T, n, 16)
        ang = torch.cat([ta, sa], -1).reshape(B, 1, T * n, ROT_PAIRS)
        return ang.cos(), ang.sin()

    def _head(self, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """The output head; ``c`` may hold pad rows past ``h``'s (``forward_frame``)."""
        sh, sc = self.ada_out(F.silu(c))[:h.shape[0]].chunk(2, -1)
        return self.out(self.norm_out(h) * (1 + sc) + sh)

    # ------------------------------------------------------------------ training / evaluation
    def clip_mask(self, frames: int, device: torch.device, window: int | None = None) -> Any:
        key = (frames, str(device), self.flex, window)
        if key not in self._masks:
            self._masks[key] = frame_causal_mask(frames, self.cfg.tokens, device, self.flex, window)
        return self._masks[key]

    def forward_clip(
        self, x: torch.Tensor, t: torch.Tensor, a: torch.Tensor, window: int | None = None, mask: Any = None
    ) -> torch.Tensor:
        """x [B, T, 3, 64, 64] noisy frames, t [B, T] noise levels, a [B, T, 8] -> x0 estimate.

        Frame 0 is the sink; frame i sits at time position i. ``window``: frame i
        sees the sink and frames i-window..i only (None: all earlier frames).
        ``mask``: a prebuilt ``clip_mask`` (compiled training passes it in).
        """
        B, T = x.shape[:2]
        n = self.cfg.tokens
        dev = x.device
        first = (torch.arange(T, device=dev) == 0).to(self.sink.dtype)[:, None, None]
        h = self.embed(patchify(x, self.cfg.patch)) + self.pos + first * self.sink  # [B, T, n, d]
        h = h.reshape(B, T * n, -1)
        c = self.cond(t, a)                                                # [B, T, d]
        pos = torch.arange(T, device=dev)[None].expand(B, T)
        cos, sin = self.angles(pos)
        sink = (torch.arange(T * n, device=dev) < n)[None].expand(B, T * n)
        if mask is None:
            mask = self.clip_mask(T, dev, window)
        for blk in self.blocks:
            h = blk(h, c, cos, sin, sink, mask)
        out = self._head(h, c.repeat_interleave(n, 1))
        return unpatchify(out.reshape(B, T, n, -1).float(), self.cfg.patch)

    # ------------------------------------------------------------------ serving
    def forward_frame(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        a: torch.Tensor,
        pos: torch.Tensor,
        sink: torch.Tensor,
        context: "FrameContext",
        kv_only: bool = False,
    ) -> torch.Tensor | None:
        """One frame per row against cached K/V.

        x [B, 3, 64, 64], t [B], a [B, 8], pos [B] time position, sink [B] bool
        (the row's frame is its session's first). ``context`` supplies, per layer,
        the attention over cached frames plus this frame's own K/V and keeps the
        own K/V it was given (``context.attend(layer, q, k, v)``).
        Returns the x0 estimate [B, 3, 64, 64] (float32).

        ``kv_only``: the clean pass, whose output nobody reads, only its K/V: the last
        block hands its K/V to ``context.keep`` and stops there (no attention, MLP or
        head: an eighth of a pass). Returns None.
        """
        B = x.shape[0]
        n = self.cfg.tokens
        h = self.embed(patchify(x.to(self.embed.weight.dtype), self.cfg.patch)) + self.pos  # [B, n, d]
        h = h + sink[:, None, None].to(h.dtype) * self.sink
        # The conditioning's linears have one row per frame: padded, so that a row's values do
        # not depend on the batch's size (models/world/rows.py); the pad rows are dropped.
        c = self.cond(padded(t), padded(a))[:, None, :]                    # [B + pad, 1, d]
        cos, sin = self.angles(pos[:, None])
        # On CPU a batch without a sink row (every generated frame) skips the sink masking of
        # the keys; on CUDA the check would read the device inside a graph capture, so it stays.
        sink_tok = None if not sink.is_cuda and not bool(sink.any()) else sink[:, None].expand(B, n)
        last = len(self.blocks) - 1
        for li, blk in enumerate(self.blocks):
            sh1, sc1, g1, sh2, sc2, g2 = (m[:B] for m in blk.modulation(c))
            q, k, v = blk.qkv_heads(blk.norm1(h) * (1 + sc1) + sh1, cos, sin, sink_tok)
            if kv_only and li == last:
                context.keep(li, k, v)
                return None
            o = context.attend(li, q, k, v).transpose(1, 2).reshape(B, n, -1)
            h = h + g1 * blk.proj(o)
            h = h + g2 * blk.mlp(blk.norm2(h) * (1 + sc2) + sh2)
        return unpatchify(self._head(h, c).float(), self.cfg.patch)


class FrameContext:
    """What ``forward_frame`` needs from a cache: ``attend(layer, q, k, v) -> o``.

    The default below holds, per layer, a gathered context K/V [B, H, Lc, hd]
    with a validity mask [B, Lc], and remembers the last K/V it was handed so the
    caller can keep the clean pass's K/V for the cache.
    """

    def __init__(self, k: Sequence[torch.Tensor], v: Sequence[torch.Tensor], valid: torch.Tensor) -> None:
        self.k, self.v = list(k), list(v)
        self.own: list[tuple[torch.Tensor, torch.Tensor]] = [None] * len(self.k)  # type: ignore[list-item]
        self.set_valid(valid)

    def set_valid(self, valid: torch.Tensor) -> None:
        self.valid = valid
        # A full cache (the steady state) needs no mask, and SDPA runs faster without one.
        self._full = bool(valid.all()) if valid.numel() else False

    def keep(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Take the frame's own K/V of ``layer`` without attending (``forward_frame(kv_only=True)``)."""
        self.own[layer] = (k, v)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.own[layer] = (k, v)
        B, _, n, _ = q.shape
        keys = torch.cat([self.k[layer], k], 2)
        vals = torch.cat([self.v[layer], v], 2)
        mask = None
        if not self._full:
            mask = torch.cat([self.valid, self.valid.new_ones(B, n)], 1)[:, None, None, :]
        return attend(q, keys, vals, mask)


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
