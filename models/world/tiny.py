"""A tiny frame-causal transformer world (random weights), the fallback world.

It exists so the server, the protocol and the engine have a real model to drive
without trained weights: every frame is computed from the previous frame, the
held keys and the session's attention KV (sink frame + rolling window), never
taken from a table. The trained ``maze`` world replaces it as the default.

Per frame: patchify the previous frame (8x8 patches -> 64 tokens), add the
action embedding and positions, run ``layers`` blocks whose attention sees the
cached K/V of earlier frames plus the current frame (non-causal inside it), and
predict a residual image. The current frame's K/V is kept only if the engine
commits the tick (``end_tick``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.base import ACTION_KEYS, ModelAdapter, WorldChunk, WorldGeometry, WorldTick

PATCH = 8


def action_bits(keys: frozenset[str]) -> list[float]:
    return [1.0 if k in keys else 0.0 for k in ACTION_KEYS]


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(
        self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, past_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x [B, N, D]; past_k/v [B, P, H, Dh]; past_mask [B, P] True where valid.
        b, n, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, h, d // h).unbind(2)
        keys = torch.cat([past_k, k], 1).transpose(1, 2)
        values = torch.cat([past_v, v], 1).transpose(1, 2)
        mask = torch.cat([past_mask, past_mask.new_ones(b, n)], 1)[:, None, None, :]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask)
        x = x + self.proj(out.transpose(1, 2).reshape(b, n, d))
        x = x + self.mlp(self.norm2(x))
        return x, k, v


class TinyWorldNet(nn.Module):
    def __init__(self, size: int = 64, dim: int = 96, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.size, self.dim, self.heads = size, dim, heads
        self.tokens = (size // PATCH) ** 2
        self.embed = nn.Linear(PATCH * PATCH * 3, dim)
        self.action = nn.Linear(len(ACTION_KEYS), dim)
        self.pos = nn.Parameter(torch.randn(self.tokens, dim) * 0.5)
        self.blocks = nn.ModuleList(_Block(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, PATCH * PATCH * 3)

    def patchify(self, img: torch.Tensor) -> torch.Tensor:  # [B, 3, S, S] -> [B, N, P*P*3]
        b = img.shape[0]
        g = self.size // PATCH
        return img.view(b, 3, g, PATCH, g, PATCH).permute(0, 2, 4, 1, 3, 5).reshape(b, g * g, -1)

    def unpatchify(self, tok: torch.Tensor) -> torch.Tensor:
        b = tok.shape[0]
        g = self.size // PATCH
        return tok.view(b, g, g, 3, PATCH, PATCH).permute(0, 3, 1, 4, 2, 5).reshape(b, 3, self.size, self.size)

    def step(
        self, prev: torch.Tensor, actions: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """One frame for a batch: returns the frame in [0, 1] and each layer's new K/V."""
        x = self.embed(self.patchify(prev * 2 - 1)) + self.pos + self.action(actions)[:, None, :]
        new_kv = []
        for block, (pk, pv) in zip(self.blocks, past):
            x, k, v = block(x, pk, pv, mask)
            new_kv.append((k, v))
        delta = torch.tanh(self.unpatchify(self.head(x))) * 0.15
        # A slow drift towards the action's direction keeps the picture alive and keyed.
        return (prev + delta).clamp(0.0, 1.0), new_kv


@dataclass
class _SessionState:
    frame: torch.Tensor  # [3, S, S] last committed frame
    kv: list[list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)  # frames x layers
    pending: tuple[torch.Tensor, list[list[tuple[torch.Tensor, torch.Tensor]]]] | None = None


class TinyWorld(ModelAdapter[WorldTick, WorldChunk]):
    """Random-weight frame-causal transformer with per-session attention KV."""

    kind = "world"

    def __init__(
        self,
        *,
        name: str = "tiny",
        frames_per_chunk: int = 1,
        sink_frames: int = 1,
        window_frames: int = 6,
        max_batch: int = 16,
        seed: int = 0,
        device: str = "cpu",
    ) -> None:
        torch.manual_seed(seed)
        self.name = name
        self.max_batch = max_batch
        self.device = torch.device(device)
        self.net = TinyWorldNet().to(self.device).eval()
        self.sink, self.window = sink_frames, window_frames
        self.geometry = WorldGeometry(
            height=64,
            width=64,
            frames_per_chunk=frames_per_chunk,
            fps=15.0,
            num_layers=len(self.net.blocks),
            kv_heads=self.net.heads,
            head_dim=self.net.dim // self.net.heads,
            tokens_per_frame=self.net.tokens,
            sink_frames=sink_frames,
            window_frames=window_frames,
        )
        self._sessions: dict[str, _SessionState] = {}

    def describe(self) -> Mapping[str, Any]:
        g = self.geometry
        return {
            "kind": self.kind,
            "name": self.name,
            "description": "tiny random-weight frame-causal transformer (fallback world)",
            "height": g.height,
            "width": g.width,
            "frames_per_chunk": g.frames_per_chunk,
            "fps": g.fps,
            "max_batch": self.max_batch,
            "uses_prompts": False,  # frames follow the keys only
        }

    def _first_frame(self, seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        coarse = torch.rand(3, 4, 4, generator=gen)
        img = F.interpolate(coarse[None], size=(64, 64), mode="bicubic", align_corners=False)[0]
        return img.clamp(0, 1).to(self.device)

    @torch.inference_mode()
    def run_batch(self, works: Sequence[WorldTick]) -> list[WorldChunk]:
        states = []
        for w in works:
            state = self._sessions.get(w.session_id)
            if state is None:
                state = _SessionState(frame=self._first_frame(w.seed))
                self._sessions[w.session_id] = state
            state.pending = None
            states.append(state)
        frames_out: list[list[torch.Tensor]] = [[] for _ in works]
        new_kv: list[list[list[tuple[torch.Tensor, torch.Tensor]]]] = [[] for _ in works]
        prev = torch.stack([s.frame for s in states])
        for f in range(self.geometry.frames_per_chunk):
            history = [s.kv + new_kv[i] for i, s in enumerate(states)]
            past, mask = self._gather(history)
            actions = torch.tensor([action_bits(w.actions[f]) for w in works], device=self.device)
            prev, kv = self.net.step(prev, actions, past, mask)
            for i in range(len(works)):
                frames_out[i].append(prev[i])
                new_kv[i].append([(k[i], v[i]) for k, v in kv])
        chunks = []
        for i, (w, s) in enumerate(zip(works, states)):
            s.pending = (prev[i], new_kv[i])
            pixels = (torch.stack(frames_out[i]) * 255.0).round().to(torch.uint8)
            chunks.append(
                WorldChunk(
                    session_id=w.session_id,
                    request_id=w.request_id,
                    chunk_index=w.chunk_index,
                    applied_event_ids=w.applied_event_ids,
                    frames=pixels.permute(0, 2, 3, 1).cpu().numpy(),
                )
            )
        return chunks

    def _gather(self, history: list[list[list[tuple[torch.Tensor, torch.Tensor]]]]):
        """Pad each session's retained frames into [B, P, H, Dh] per layer plus a validity mask."""
        n = self.net.tokens
        kept = [self._retained(h) for h in history]
        longest = max((len(h) for h in kept), default=0)
        b, heads, hd = len(kept), self.net.heads, self.net.dim // self.net.heads
        mask = torch.zeros(b, longest * n, dtype=torch.bool, device=self.device)
        past = []
        for layer in range(len(self.net.blocks)):
            k = torch.zeros(b, longest * n, heads, hd, device=self.device)
            v = torch.zeros_like(k)
            for i, frames in enumerate(kept):
                if frames:
                    k[i, : len(frames) * n] = torch.cat([fr[layer][0] for fr in frames])
                    v[i, : len(frames) * n] = torch.cat([fr[layer][1] for fr in frames])
                    mask[i, : len(frames) * n] = True
            past.append((k, v))
        return past, mask

    def _retained(self, frames: list) -> list:
        if len(frames) <= self.sink + self.window:
            return frames
        return frames[: self.sink] + frames[len(frames) - self.window :]

    def end_tick(self, session_id: str, committed: bool) -> None:
        state = self._sessions.get(session_id)
        if state is None or state.pending is None:
            return
        if committed:
            frame, kv = state.pending
            state.frame = frame
            state.kv = self._retained(state.kv + kv)
        state.pending = None

    def release(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)

