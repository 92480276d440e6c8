"""``LingBotWorld``: the LingBot pipeline behind the world seam (``models/world/base.py``).

One tick is one block: 3 latent frames, 12 video frames at 16 fps. A session's
controls come from three reducers (``reducers()``), all reduced by the generic
session code and read here only (``tick``)::

    keys               keys.v1, one key set per video frame (the page, generic clients);
                       a latent frame moves with the union of its 4 frames' keys
    camera_actions     lingbot.camera_actions.v1, one key set per latent frame
    camera_trajectory  lingbot.camera_trajectory.v1, explicit poses (inline or named
                       from the server's --trajectory-root)

The two key tracks are unioned per latent frame; a playing trajectory takes
precedence over both (``camera.advance``).

A session starts at chunk 0: its prompt encoded, text K/V built once, its first
image (``WorldTick.image``, when it has one) encoded as the condition. A prompt
change in a later tick rebuilds the text K/V before that block. A session reset
releases everything (the session code's release hook) and its next chunk-0 tick
opens it again from the same prompt, image and seed. The Wan VAE gives 9 frames for a session's first block
and 12 after; the first chunk holds its first frame for the 3 missing frames so
that every chunk has 12. ``end_tick`` commits or aborts the block's kv chunk and
session state (``pipeline.end``); a block dropped after it was decoded closes the
session's world (the streaming decode state cannot be rewound; the session code
fails and releases such a session anyway).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from models.world.base import KEYS_SCHEMA, WorldGeometry, WorldTick
from models.world.block_world import BlockWorld
from models.world.lingbot.config import VAE_TEMPORAL_STRIDE
from models.world.lingbot.controls import (ACTIONS_SCHEMA, ACTIONS_TRACK, TRAJECTORY_SCHEMA,
                                           TRAJECTORY_TRACK, TrajectoryBlock, lingbot_reducers)
from models.world.lingbot.fp8 import fp8_summary
from models.world.lingbot.options import LingBotOptions
from models.world.lingbot.pipeline import BlockRequest, LingBotPipeline
from sessions import TickRequest, default_reducers
from sessions.reducers import ControlReducer

log = logging.getLogger(__name__)

FPS = 16.0


@dataclass(frozen=True)
class LingBotTick(WorldTick):
    """A world tick with LingBot's own control values (``None``: the track is absent)."""

    camera_keys: tuple[frozenset[str], ...] | None = None   # one per latent frame
    trajectory: TrajectoryBlock | None = None


def block_controls(actions: Sequence[frozenset[str]] | None, trajectory: TrajectoryBlock | None
                   ) -> tuple[list[frozenset[str]], tuple[torch.Tensor, torch.Tensor, bool] | None]:
    """The camera_actions / camera_trajectory tick values as ``BlockRequest`` keys and trajectory."""
    keys = list(actions) if actions else []
    if trajectory is None:
        return keys, None
    poses, intr = trajectory.arrays()
    return keys, (torch.from_numpy(poses), torch.from_numpy(intr), trajectory.starts)


def latent_keys(actions: Sequence[frozenset[str]], frames_per_block: int) -> list[frozenset[str]]:
    """Per-video-frame key sets -> one per latent frame (the union of its 4 frames)."""
    s = VAE_TEMPORAL_STRIDE
    return [frozenset().union(*actions[i * s:(i + 1) * s]) for i in range(frames_per_block)]


class LingBotWorld(BlockWorld):
    """LingBot-World v2 from a local checkpoint: one 12-frame block per tick (``BlockWorld``)."""

    control_schemas = (KEYS_SCHEMA, ACTIONS_SCHEMA, TRAJECTORY_SCHEMA)
    uses_prompts = True

    def __init__(self, pipeline: LingBotPipeline, *, name: str = "lingbot", max_batch: int = 1,
                 checkpoint: str | Path | None = None, trajectory_root: str | Path | None = None,
                 shortcuts: LingBotOptions = LingBotOptions()) -> None:
        self.pipeline = pipeline
        self.shortcuts = shortcuts
        pipeline.device_frames = pipeline.device.type == "cuda"  # jpeg may be encoded there (base)
        self.name = name
        self.max_batch = max_batch
        self.checkpoint = None if checkpoint is None else Path(checkpoint)
        self.trajectory_root = None if trajectory_root is None else Path(trajectory_root)
        self.frames_per_block = pipeline.cfg.num_frames_per_block
        self.geometry = WorldGeometry(height=pipeline.height, width=pipeline.width,
                                      frames_per_chunk=VAE_TEMPORAL_STRIDE * self.frames_per_block, fps=FPS)

    @property
    def sequence_parallel(self) -> int:
        """Ranks this model's forwards are split over (1: one process); the server mirrors the
        calls of a model split over several (realtime/engine/mirror.py)."""
        sp = self.pipeline.sequence_parallel
        return 1 if sp is None else sp.size

    # ------------------------------------------------------------------ seam
    def details(self) -> Mapping[str, Any]:
        cfg, p, g = self.pipeline.cfg, self.pipeline, self.pipeline.geometry
        return {
            "checkpoint": str(self.checkpoint) if self.checkpoint else None,
            "latent_frames_per_chunk": self.frames_per_block,
            "device": str(p.device), "dtype": str(p.dtype).replace("torch.", ""),
            "denoising_steps": len(p.sigmas), "flow_shift": p.flow_shift,
            "transformer_passes_per_block": p.passes_per_block,
            "shortcuts": self.shortcuts.query() or None,   # the entry's options; None: the exact path
            "kv_from": "last denoising pass" if p.reuse_kv else "committing pass",
            "fp8": ({"groups": list(self.shortcuts.fp8), **fp8_summary(p.model)} if self.shortcuts.fp8 else None),
            "decoder": p.block_decoder.name,
            "sink_frames": cfg.sink_size, "rolling_frames": cfg.rolling_frames,
            "attention_window_frames": cfg.sliding_window_num_frames,
            "tokens_per_latent_frame": g.tokens_per_frame,
            "max_sessions": p.cache.max_sessions,
            "sequence_parallel": self.sequence_parallel,
            "named_trajectories": self.trajectory_root is not None,
            "weights_licence": "CC BY-NC-SA 4.0 (non-commercial)",
        }

    def reducers(self) -> dict[str, ControlReducer]:
        return {**default_reducers(self.geometry.frames_per_chunk),
                **lingbot_reducers(self.frames_per_block, self.trajectory_root)}

    def tick(self, request: TickRequest, seed: int, options: Mapping[str, Any] | None = None, *,
             format: str = "rgb8") -> LingBotTick:
        base = super().tick(request, seed, options, format=format)
        controls = request.controls
        return LingBotTick(**{f: getattr(base, f) for f in WorldTick.__dataclass_fields__},
                           camera_keys=controls.get(ACTIONS_TRACK), trajectory=controls.get(TRAJECTORY_TRACK))

    def _open(self, w: WorldTick) -> None:
        self.pipeline.open(w.session_id, w.prompt or "", image=w.image, seed=w.seed)

    def _request(self, w: WorldTick) -> BlockRequest:
        keys = latent_keys(w.actions, self.frames_per_block)
        camera_keys = getattr(w, "camera_keys", None)
        if camera_keys:
            keys = [a | b for a, b in zip(keys, camera_keys)]
        _, trajectory = block_controls(None, getattr(w, "trajectory", None))
        # A first block's frames are short of a chunk by as many as ``generate`` holds.
        pad = (self.geometry.frames_per_chunk - self.pipeline.decoder.output_frames(0, self.frames_per_block)
               if w.chunk_index == 0 else 0)
        return BlockRequest(w.session_id, prompt=w.prompt, keys=keys, trajectory=trajectory,
                            on_frame=self._on_frame(w, pad))
