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

It has no noise: a session's frames are a function of its ``seed`` (which draws its first
frame) and its keys. Rows of a batch attend in groups of equal history (no padded keys)
and the action embedding runs on padded rows (``models/world/rows.py``), so a session's
frames do not depend on what shares its batches, bit for bit on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from models.world.base import WorldAdapter, WorldChunk, WorldGeometry, WorldTick, action_bits
from models.world.rows import padded
from models.factory import BuildOptions, FactoryError
from protocols.world_v1 import KEY_NAMES

PATCH = 8
SIZE = 64  # frame height and width


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
        self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x [B, N, D]; past_k/v [B, P, H, Dh], every row's P keys its own (no padding).
        b, n, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, h, d // h).unbind(2)
        keys = torch.cat([past_k, k], 1).transpose(1, 2)
        values = torch.cat([past_v, v], 1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values)
        x = x + self.proj(out.transpose(1, 2).reshape(b, n, d))
        x = x + self.mlp(self.norm2(x))
        return x, k, v


class TinyWorldNet(nn.Module):
    def __init__(self, size: int = SIZE, dim: int = 96, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.size, self.dim, self.heads = size, dim, heads
        self.tokens = (size // PATCH) ** 2
        self.embed = nn.Linear(PATCH * PATCH * 3, dim)
        self.action = nn.Linear(len(KEY_NAMES), dim)
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
        self, prev: torch.Tensor, actions: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """One frame for rows of equal history: returns the frame in [0, 1] and each layer's new K/V."""
        b = prev.shape[0]
        x = self.embed(self.patchify(prev * 2 - 1)) + self.pos + self.action(padded(actions))[:b, None, :]
        new_kv = []
        for block, (pk, pv) in zip(self.blocks, past):
            x, k, v = block(x, pk, pv)
            new_kv.append((k, v))
        delta = torch.tanh(self.unpatchify(self.head(x))) * 0.15
        # A slow drift towards the action's direction keeps the picture alive and keyed.
        return (prev + delta).clamp(0.0, 1.0), new_kv


@dataclass
class _SessionState:
    frame: torch.Tensor  # [3, S, S] last committed frame
    kv: list[list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)  # frames x layers
    pending: tuple[torch.Tensor, list[list[tuple[torch.Tensor, torch.Tensor]]]] | None = None


class TinyWorld(WorldAdapter):
    """Random-weight frame-causal transformer with per-session attention KV."""

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
        self.geometry = WorldGeometry(height=SIZE, width=SIZE, frames_per_chunk=frames_per_chunk, fps=15.0)
        self._sessions: dict[str, _SessionState] = {}

    def details(self) -> Mapping[str, Any]:
        return {"description": "tiny random-weight frame-causal transformer (fallback world)"}

    def _first_frame(self, seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        coarse = torch.rand(3, 4, 4, generator=gen)
        img = F.interpolate(coarse[None], size=(SIZE, SIZE), mode="bicubic", align_corners=False)[0]
        return img.clamp(0, 1).to(self.device)

    @torch.inference_mode()
    def generate(self, works: Sequence[WorldTick]) -> list[WorldChunk]:
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
            kept = [self._retained(s.kv + new_kv[i]) for i, s in enumerate(states)]
            actions = torch.tensor([action_bits(w.actions[f]) for w in works], device=self.device)
            groups: dict[int, list[int]] = {}
            for i, frames in enumerate(kept):
                groups.setdefault(len(frames), []).append(i)
            nxt = torch.empty_like(prev)
            for rows in groups.values():
                idx = torch.tensor(rows, device=self.device)
                out, kv = self.net.step(prev[idx], actions[idx], self._gather([kept[i] for i in rows]))
                nxt[idx] = out
                for j, i in enumerate(rows):
                    new_kv[i].append([(k[j], v[j]) for k, v in kv])
            prev = nxt
            for i in range(len(works)):
                frames_out[i].append(prev[i])
        chunks = []
        for i, (w, s) in enumerate(zip(works, states)):
            s.pending = (prev[i], new_kv[i])
            pixels = (torch.stack(frames_out[i]) * 255.0).round().to(torch.uint8)
            chunks.append(WorldChunk.answering(w, pixels.permute(0, 2, 3, 1).cpu().numpy()))
        return chunks

    def _gather(self, kept: list[list[list[tuple[torch.Tensor, torch.Tensor]]]]):
        """Rows' retained frames, all as many, as [B, P, H, Dh] K and V per layer.

        Rows of a batch are gathered in groups of equal history: keys padded to a longer
        row's and masked would be summed in other groupings, so a row's frame would
        depend on its neighbours (``models/world/rows.py``)."""
        n, heads, hd = self.net.tokens, self.net.heads, self.net.dim // self.net.heads
        if not kept[0]:
            empty = torch.zeros(len(kept), 0, heads, hd, device=self.device)
            return [(empty, empty)] * len(self.net.blocks)
        return [(torch.stack([torch.cat([fr[layer][0] for fr in frames]) for frames in kept]),
                 torch.stack([torch.cat([fr[layer][1] for fr in frames]) for frames in kept]))
                for layer in range(len(self.net.blocks))]

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

    def drop_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)



def build(path: str | None, options: BuildOptions) -> TinyWorld:
    """Factory-table entry ``tiny`` (random weights: ``path`` must be empty)."""
    if path is not None:
        raise FactoryError("tiny has random weights and takes no path")
    return TinyWorld(frames_per_chunk=options.frames_per_chunk or 1, max_batch=options.max_batch or 16,
                     device=options.device)
