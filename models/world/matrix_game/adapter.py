"""``MatrixGameWorld``: the Matrix-Game pipeline behind the world seam (``models/world/base.py``).

One tick is one block: 3 latent frames, 12 video frames at 25 fps (upstream's rate). A
session's controls come from two reducers (``reducers()``), reduced by the generic session
code and read here only (``tick``)::

    keys    keys.v1, one key set per video frame, restricted to the variant's keys
            (``controls.VariantKeysReducer``): the keyboard vector and the look keys
    mouse   mouse.v1, one (yaw, pitch) delta per video frame (variants with a mouse only)

The Wan VAE gives 9 frames for a session's first block and 12 after; the first chunk holds
its first frame for the 3 missing frames so that every chunk has 12, and those 3 frames'
actions are not read (the model's actions are per video frame it makes). A session opens at
its first chunk-0 tick from its first image (``WorldTick.image``, else the pipeline's
default); a reset closes it and its next chunk-0 tick opens it again from the same image and
seed. ``end_tick`` commits or drops the pending block (``pipeline.end``).

Admission: ``admit`` (at ``session.create``) counts the new session against the kv pool and
the host swap budget at its most, beside every open and admitted session
(``pipeline.admit``); one that cannot fit is refused there with the reason (world.v1 ``busy``)
rather than failing its first tick or dropping a session already playing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from models.world.base import KEYS_SCHEMA, WorldGeometry, WorldTick
from models.world.block_world import BlockWorld
from models.world.matrix_game.config import FRAMES_PER_BLOCK, VAE_TEMPORAL_STRIDE
from models.world.matrix_game.controls import (MouseReducer, VariantKeysReducer, keyboard_vectors,
                                               mouse_vectors, variant_keys)
from models.world.matrix_game.pipeline import BlockRequest, MatrixGamePipeline
from protocols.mouse_v1 import MOUSE_SCHEMA, MOUSE_TRACK
from sessions import TickRequest
from sessions.reducers import ControlReducer

log = logging.getLogger(__name__)

FPS = 25.0


@dataclass(frozen=True)
class MatrixGameTick(WorldTick):
    """A world tick with the mouse.v1 deltas, one (yaw, pitch) per frame (None: no mouse track)."""

    mouse: tuple[tuple[float, float], ...] | None = None


class MatrixGameWorld(BlockWorld):
    """Matrix-Game 2.0 from a local checkpoint: one 12-frame block per tick (``BlockWorld``)."""

    def __init__(self, pipeline: MatrixGamePipeline, *, name: str = "matrix-game", max_batch: int = 1,
                 checkpoint: str | Path | None = None) -> None:
        self.pipeline = pipeline
        self.name = name
        self.max_batch = max_batch
        self.checkpoint = None if checkpoint is None else Path(checkpoint)
        self.variant = pipeline.variant.name
        self.mouse = pipeline.cfg.action.enable_mouse
        self.control_schemas = (KEYS_SCHEMA, MOUSE_SCHEMA) if self.mouse else (KEYS_SCHEMA,)
        self.residency = pipeline.residency
        self.geometry = WorldGeometry(height=pipeline.height, width=pipeline.width,
                                      frames_per_chunk=VAE_TEMPORAL_STRIDE * FRAMES_PER_BLOCK, fps=FPS)

    # ------------------------------------------------------------------ seam
    def details(self) -> Mapping[str, Any]:
        p, cfg = self.pipeline, self.pipeline.cfg
        return {
            "checkpoint": str(self.checkpoint) if self.checkpoint else None,
            "variant": self.variant,
            "variant_keys": list(variant_keys(self.variant)),
            "mouse": self.mouse,
            "latent_frames_per_chunk": FRAMES_PER_BLOCK,
            "device": str(p.device), "dtype": str(p.dtype).replace("torch.", ""),
            "denoising_steps": len(p.variant.steps), "transformer_passes_per_block": p.passes_per_block,
            "sink_frames": cfg.sink_size, "attention_window_frames": cfg.local_attn_size,
            "tokens_per_latent_frame": p.tokens_per_frame, "decoder": p.decoder_name,
            "max_sessions": p.cache.max_sessions,
            "weights_licence": "MIT",
        }

    def admit(self, session_id: str, options: Mapping[str, Any]) -> str | None:
        return self.pipeline.admit(session_id)

    def reducers(self) -> dict[str, ControlReducer]:
        F = self.geometry.frames_per_chunk
        out: dict[str, ControlReducer] = {"keys": VariantKeysReducer(F, self.variant)}
        if self.mouse:
            out[MOUSE_TRACK] = MouseReducer(F)
        return out

    def tick(self, request: TickRequest, seed: int, options: Mapping[str, Any] | None = None, *,
             format: str = "rgb8") -> MatrixGameTick:
        base = super().tick(request, seed, options, format=format)
        return MatrixGameTick(**{f: getattr(base, f) for f in WorldTick.__dataclass_fields__},
                              mouse=request.controls.get(MOUSE_TRACK))

    def _open(self, w: WorldTick) -> None:
        self.pipeline.open(w.session_id, image=w.image, seed=w.seed)

    def _request(self, w: WorldTick) -> BlockRequest:
        """The block's per-video-frame actions: a first block makes 9 frames, shown after 3
        copies of its first, so it reads the actions of the chunk's last 9 frames."""
        p = self.pipeline
        T = p.frames_in_block(w.session_id)
        skip = self.geometry.frames_per_chunk - T
        actions = w.actions[skip:]
        keyboard = keyboard_vectors(self.variant, actions, p.cfg.action.keyboard_dim_in)
        mouse = None
        if self.mouse:
            deltas = getattr(w, "mouse", None)
            mouse = mouse_vectors(self.variant, actions, None if deltas is None else deltas[skip:])
        return BlockRequest(w.session_id, keyboard, mouse, on_frame=self._on_frame(w, skip))
