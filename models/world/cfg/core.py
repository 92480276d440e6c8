"""A small two-branch classifier-free-guidance world model (random weights), no server adapter.

Each session has two logical KV branches, ``positive`` (its prompt) and
``negative`` (its negative prompt, empty by default), in one ``PagedKVCache``
with ``branches=("positive", "negative")``, and a guidance scale ``s`` chosen at
``open``. A tick makes one frame per session:

1. both branches take the session's last guided frame as input and add their
   own prompt embedding;
2. one batched forward runs every (session, branch) row; each row attends only to
   its own branch's pages, so the branches are independent within a tick (the
   positive output does not depend on the negative prompt or KV, and vice versa);
3. guided = neg + s * (pos - neg), computed as ``torch.lerp(neg, pos, s)``,
   which for ``s = 1`` returns ``pos`` exactly (lerp's ``end - (end - start) * (1 - w)``
   form for ``w >= 0.5``), so ``s = 1`` equals the positive branch alone;
4. the guided frame becomes the session's model-owned state (``TensorState``,
   attached to ``Residency``), so it swaps to the host with both branches' KV.

Prompts are embedded by ``embed_prompt``: a fixed random vector per text, derived
from its SHA-256 (a stand-in for a text encoder; the empty prompt is zeros).

A session's ``seed`` draws its first frame (standard normal, ``models.world.noise``
at counter 0); there is no other noise, so a session's frames are a function of its
seed, prompts, scale and position. Rows attend their own pages (kv's gather groups
rows of equal length) and the prompt projection runs on padded rows
(``models/world/rows.py``): what shares a tick changes no row, bit for bit on CPU.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kv import KVGeometry, PagedKVCache, Residency, TensorState
from kv.capacity import pool_blocks
from kv.paged_attention import paged_attention
from models.world.noise import int64_bits, normal
from models.world.rows import padded

BRANCHES = ("positive", "negative")
#: Largest guidance scale a session may ask for (typical CFG scales are 1-10).
MAX_GUIDANCE_SCALE = 20.0


@dataclass(frozen=True)
class CFGWorldConfig:
    dim: int = 32
    heads: int = 2
    layers: int = 2
    tokens_per_frame: int = 16
    prompt_dim: int = 16
    sink_frames: int = 1
    window_frames: int = 4

    def geometry(self) -> KVGeometry:
        frame_bytes = self.tokens_per_frame * self.dim * 4  # the guided frame, float32
        return KVGeometry(num_layers=self.layers, kv_heads=self.heads, head_dim=self.dim // self.heads,
                          tokens_per_frame=self.tokens_per_frame, block_size=self.tokens_per_frame,
                          sink_frames=self.sink_frames, window_frames=self.window_frames,
                          dtype=torch.float32, branches=BRANCHES, model_state_bytes=frame_bytes)


@dataclass(frozen=True)
class CFGFrame:
    """One session's tick: the guided frame and both branches' outputs, each [tokens, dim]."""

    guided: torch.Tensor
    positive: torch.Tensor
    negative: torch.Tensor


def embed_prompt(text: str, dim: int) -> torch.Tensor:
    """A fixed random [dim] vector per prompt text (zeros for the empty prompt)."""
    if not text:
        return torch.zeros(dim)
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return torch.randn(dim, generator=torch.Generator().manual_seed(seed))


def check_guidance_scale(scale: float) -> float:
    """The scale as a float, or ``ValueError`` if it is not a finite number in [0, MAX_GUIDANCE_SCALE]."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"guidance_scale must be a finite number, got {scale!r}")
    if not 0.0 <= scale <= MAX_GUIDANCE_SCALE:
        raise ValueError(f"guidance_scale must be in [0, {MAX_GUIDANCE_SCALE}], got {scale}")
    return float(scale)


class _Net(nn.Module):
    def __init__(self, c: CFGWorldConfig) -> None:
        super().__init__()
        self.c = c
        self.prompt = nn.Linear(c.prompt_dim, c.dim)
        self.pos = nn.Parameter(torch.randn(c.tokens_per_frame, c.dim) * 0.02)
        self.norm1 = nn.ModuleList(nn.LayerNorm(c.dim) for _ in range(c.layers))
        self.qkv = nn.ModuleList(nn.Linear(c.dim, 3 * c.dim) for _ in range(c.layers))
        self.proj = nn.ModuleList(nn.Linear(c.dim, c.dim) for _ in range(c.layers))
        self.norm2 = nn.ModuleList(nn.LayerNorm(c.dim) for _ in range(c.layers))
        self.mlp = nn.ModuleList(
            nn.Sequential(nn.Linear(c.dim, 2 * c.dim), nn.GELU(), nn.Linear(2 * c.dim, c.dim))
            for _ in range(c.layers))
        self.out = nn.Linear(c.dim, c.dim)

    def forward(self, frames: torch.Tensor, prompts: torch.Tensor, cache: PagedKVCache, batch) -> torch.Tensor:
        """frames [R, tokens, dim], prompts [R, prompt_dim] -> next frames [R, tokens, dim]."""
        c = self.c
        R = frames.shape[0]
        x = frames + self.pos + self.prompt(padded(prompts))[:R, None]
        for i in range(c.layers):
            q, k, v = self.qkv[i](self.norm1[i](x)).view(R, c.tokens_per_frame, 3, c.heads, -1).unbind(2)
            a = paged_attention(q, k, v, cache, i, batch)
            x = x + self.proj[i](a.reshape(R, c.tokens_per_frame, c.dim))
            x = x + self.mlp[i](self.norm2[i](x))
        return frames + torch.tanh(self.out(x))


class CFGWorldCore:
    """Sessions of the two-branch CFG world on one device (the engine thread is the only caller)."""

    def __init__(self, config: CFGWorldConfig = CFGWorldConfig(), *, max_sessions: int = 4,
                 ticks_in_flight: int | None = None, host_budget_bytes: int = 1 << 26,
                 device: torch.device | str = "cpu", seed: int = 0) -> None:
        self.config = config
        self.device = torch.device(device)
        torch.manual_seed(seed)
        self.net = _Net(config).to(self.device).eval()
        self.geometry = config.geometry()
        self.cache = PagedKVCache(self.geometry, pool_blocks(self.geometry, max_sessions, ticks_in_flight or max_sessions),
                                  self.device, max_sessions=max_sessions, attention_backend="gather_sdpa")
        self.residency = Residency(self.cache, host_budget_bytes=host_budget_bytes, on_drop=self._forget)
        self._prompts: dict[str, torch.Tensor] = {}   # [2, prompt_dim]: positive, negative
        self._scales: dict[str, float] = {}
        self._seeds: dict[str, int] = {}
        self._made: dict[str, int] = {}   # frames made since open or reset

    def open(self, session_id: str, prompt: str, negative_prompt: str = "", guidance_scale: float = 1.0,
             seed: int = 0) -> list[str]:
        """Open a session whose first frame ``seed`` draws; returns ids dropped to make room. Bad
        input raises ``ValueError``, changing nothing."""
        scale = check_guidance_scale(guidance_scale)
        if session_id in self._scales:
            raise ValueError(f"session {session_id!r} is already open")
        d = self.config.prompt_dim
        dropped = self.residency.open(session_id)
        self._prompts[session_id] = torch.stack([embed_prompt(prompt, d), embed_prompt(negative_prompt, d)]).to(
            self.device)
        self._scales[session_id] = scale
        self._seeds[session_id] = int(seed)
        self._made[session_id] = 0
        self._attach_first_frame(session_id)
        return dropped

    def set_prompt(self, session_id: str, prompt: str) -> None:
        """A new positive prompt from the next tick on (the negative and the KV stay)."""
        self._prompts[session_id][0] = embed_prompt(prompt, self.config.prompt_dim).to(self.device)

    def guidance_scale(self, session_id: str) -> float:
        return self._scales[session_id]

    def seed(self, session_id: str) -> int:
        return self._seeds[session_id]

    def frames_made(self, session_id: str) -> int:
        """Frames the session made since it was opened or reset."""
        return self._made[session_id]

    def reset(self, session_id: str, seed: int | None = None) -> None:
        """Forget the session's frames (both branches' KV and its last frame) and start again from
        the first frame of ``seed`` (None: its seed so far); prompts and scale stay."""
        self.residency.reset(session_id)
        if seed is not None:
            self._seeds[session_id] = int(seed)
        self._made[session_id] = 0
        self._attach_first_frame(session_id)

    def close(self, session_id: str) -> None:
        self.residency.close(session_id)
        self._forget(session_id)

    @torch.no_grad()
    def step(self, session_ids: list[str]) -> dict[str, CFGFrame]:
        """One tick for each session: a guided frame, committed only if the whole forward succeeds."""
        if len(set(session_ids)) != len(session_ids):
            raise ValueError("a session may appear once per tick")
        for sid in session_ids:
            if sid not in self._scales:
                raise KeyError(f"unknown session {sid!r}")
        self.residency.ensure_resident(session_ids)
        batch = self.cache.begin_batch(session_ids)
        if batch is None:
            raise RuntimeError("no KV blocks for this tick")  # capacity is planned for max_sessions ticks
        try:
            # Rows are (session, branch) in order: positive, negative per session.
            frames = torch.stack([self._last(sid) for sid in session_ids]).repeat_interleave(2, dim=0)
            prompts = torch.cat([self._prompts[sid] for sid in session_ids])
            out = self.net(frames, prompts, self.cache, batch).view(len(session_ids), 2, *frames.shape[1:])
            scales = torch.tensor([self._scales[sid] for sid in session_ids], device=self.device)
            guided = torch.lerp(out[:, 1], out[:, 0], scales[:, None, None])
            self.cache.commit_batch(batch)
        except Exception:
            self.cache.abort_batch(batch)
            raise
        result = {}
        for i, sid in enumerate(session_ids):
            self.residency.state(sid).tensors[0].copy_(guided[i])
            self._made[sid] += 1
            result[sid] = CFGFrame(guided[i].clone(), out[i, 0].clone(), out[i, 1].clone())
        return result

    def _last(self, session_id: str) -> torch.Tensor:
        return self.residency.state(session_id).tensors[0]

    def _attach_first_frame(self, session_id: str) -> None:
        c = self.config
        seed = torch.tensor([int64_bits(self._seeds[session_id])], device=self.device)
        first = normal(seed, torch.zeros_like(seed), (c.tokens_per_frame, c.dim))[0]
        self.residency.attach_state(session_id, TensorState([first]))

    def _forget(self, session_id: str) -> None:
        self._prompts.pop(session_id, None)
        self._scales.pop(session_id, None)
        self._seeds.pop(session_id, None)
        self._made.pop(session_id, None)
