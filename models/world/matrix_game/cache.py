"""Matrix-Game's kv/ geometry and the per-session state that moves with a session's KV.

One kv *frame* is one latent frame (``tokens_per_frame`` patches, 880 at 352x640), one
*tick* is one block of 3 latent frames. ``local_attn_size`` (6 in the base and Temple Run
configs, 4 in GTA) is the most frames a block attends to, itself included, so between
blocks a session holds the sink and ``local_attn_size - sink - 3`` recent frames::

    base (window 6, sink 0), after 3 blocks (n = 9):
    frame:  0 .. 5  | 6 7 8     | 9 10 11
            released| [rolling] | [block in flight]    the block attends 6 .. 11

Retention releases one frame at a time (``span_frames`` 1), so GTA's single rolling frame
is exactly one frame. The cross slot holds the session's CLIP image K/V (257 tokens per
layer), projected once when the session opens.

The action modules keep their own rolling caches over the same window with a sink of 0
(upstream hard-codes it): per action layer the mouse K/V per spatial token and the keyboard
K/V per frame, of the last ``local_attn_size - 3`` frames. They are small fixed-size tensors
(``ActionCache``), kept as model-owned kv state beside the decoder's state (``SessionState``),
so ``Residency`` swaps them to the host and back with the session and frees them on close.
A session that has made fewer frames than that holds zeros in the oldest slots, which no
attention reads (``held_frames``).
"""

from __future__ import annotations

from typing import Any

import torch

from kv import KVGeometry, PagedKVCache, TensorState
from kv.capacity import pool_blocks
from models.world.matrix_game.config import FRAMES_PER_BLOCK, MatrixGameConfig


def rolling_frames(cfg: MatrixGameConfig) -> int:
    """Recent frames (beyond the sink) the self-attention holds between blocks."""
    return cfg.local_attn_size - cfg.sink_size - FRAMES_PER_BLOCK


def action_frames(cfg: MatrixGameConfig) -> int:
    """Frames the action caches hold between blocks (their sink is 0)."""
    return cfg.local_attn_size - FRAMES_PER_BLOCK


def held_frames(cfg: MatrixGameConfig, start: int) -> int:
    """Action frames a block at latent frame ``start`` reads from the cache: the last ones
    of ``action_frames``, fewer while the session is young."""
    return min(start, action_frames(cfg))


def kv_geometry(cfg: MatrixGameConfig, latent_height: int, latent_width: int, clip_tokens: int,
                dtype: torch.dtype = torch.bfloat16, model_state_bytes: int = 0) -> KVGeometry:
    """The geometry kv/ plans and stores at one latent resolution; ``model_state_bytes``: the
    decoder state and the action caches of one session (capacity counts them)."""
    _, ph, pw = cfg.patch_size
    tokens = (latent_height // ph) * (latent_width // pw)
    return KVGeometry(num_layers=cfg.num_layers, kv_heads=cfg.num_heads, head_dim=cfg.head_dim,
                      tokens_per_frame=tokens, block_size=tokens, sink_frames=cfg.sink_size,
                      window_frames=rolling_frames(cfg), frames_per_tick=FRAMES_PER_BLOCK, span_frames=1,
                      dtype=dtype, cross_tokens=clip_tokens, model_state_bytes=model_state_bytes)


def make_cache(geometry: KVGeometry, sessions: int, device: torch.device | str = "cpu") -> PagedKVCache:
    """A pool sized for ``sessions`` resident sessions, one block in flight each."""
    device = torch.device(device)
    backend = "auto" if device.type == "cuda" else "gather_sdpa"
    return PagedKVCache(geometry, pool_blocks(geometry, sessions, ticks_in_flight=sessions), device,
                        max_sessions=sessions, attention_backend=backend)


class ActionCache:
    """One session's action K/V: ``mouse`` ``[layers, 2, S, frames, Ha, D]`` (None without a
    mouse) and ``keyboard`` ``[layers, 2, frames, Ha, D]``, one entry per action block in
    ``cfg.action.blocks`` order, the newest frame last. Shapes only; ``new`` makes the tensors."""

    def __init__(self, cfg: MatrixGameConfig, tokens_per_frame: int) -> None:
        a = cfg.action
        self.layer_index = {b: i for i, b in enumerate(a.blocks)}
        n, T, H = len(a.blocks), action_frames(cfg), a.heads_num
        self.mouse_shape = ((n, 2, tokens_per_frame, T, H, a.mouse_hidden_dim // H) if a.enable_mouse else None)
        self.keyboard_shape = (n, 2, T, H, a.keyboard_hidden_dim // H)

    def new(self, device: torch.device | str, dtype: torch.dtype) -> TensorState:
        """Zeros: a session before its first block."""
        shapes = [self.keyboard_shape] + ([self.mouse_shape] if self.mouse_shape else [])
        return TensorState([torch.zeros(s, device=device, dtype=dtype) for s in shapes])

    def nbytes(self, dtype: torch.dtype) -> int:
        size = torch.empty((), dtype=dtype).element_size()
        shapes = [self.keyboard_shape] + ([self.mouse_shape] if self.mouse_shape else [])
        return sum(size * _numel(s) for s in shapes)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class SessionState:
    """The model-owned kv state of one session (``kv.ModelState``): the streaming decoder's
    state and the action caches, moved, swapped and freed as one."""

    def __init__(self, decode: Any, actions: TensorState) -> None:
        self.decode = decode
        self.actions = actions

    @property
    def keyboard(self) -> torch.Tensor:
        return self.actions.tensors[0]

    @property
    def mouse(self) -> torch.Tensor | None:
        t = self.actions.tensors
        return t[1] if len(t) > 1 else None

    @property
    def nbytes(self) -> int:
        return self.decode.nbytes + self.actions.nbytes

    def to_host(self) -> None:
        self.decode.to_host()
        self.actions.to_host()

    def to_device(self, device: torch.device | str) -> None:
        self.decode.to_device(device)
        self.actions.to_device(device)

    def free(self) -> None:
        self.decode.free()
        self.actions.free()

    def reset(self) -> None:
        """Back to a session before its first block (decoder zeros, action caches zeros)."""
        self.decode.reset()
        for t in self.actions.tensors:
            t.zero_()
