"""``LingBotWorld``: the LingBot pipeline behind today's world seam (``models.base``).

One tick is one block: 3 latent frames, 12 video frames at 16 fps. Today's
``WorldTick`` carries the keys.v1 key sets, one per video frame; a latent frame
moves with the union of its 4 frames' keys (a tap inside the 4 frames counts).
The camera_actions / camera_trajectory reducers (``controls.py``) and the first
image (``image.py``) plug in where the seam carries controls and an image (the
kind-seams work); the pipeline already takes both (``BlockRequest``, ``open``).

A session starts at chunk 0 (its prompt encoded, text K/V built once); a prompt
change in a later tick rebuilds the text K/V before that block. The Wan VAE gives
9 frames for a session's first block and 12 after; the first chunk holds its
first frame for the 3 missing frames so that every chunk has 12. ``end_tick``
commits or aborts the block's kv chunk and session state (``pipeline.end``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from models.base import ModelAdapter, ModelError, WorldChunk, WorldGeometry, WorldTick
from models.world.lingbot.config import VAE_TEMPORAL_STRIDE
from models.world.lingbot.controls import ACTIONS_SCHEMA, TRAJECTORY_SCHEMA, TrajectoryBlock
from models.world.lingbot.pipeline import DMD_TIMESTEPS, BlockRequest, LingBotPipeline, NoCapacity

log = logging.getLogger(__name__)

FPS = 16.0


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


class LingBotWorld(ModelAdapter[WorldTick, WorldChunk]):
    kind = "world"

    def __init__(self, pipeline: LingBotPipeline, *, name: str = "lingbot", max_batch: int = 1,
                 checkpoint: str | Path | None = None) -> None:
        self.pipeline = pipeline
        self.name = name
        self.max_batch = max_batch
        self.checkpoint = None if checkpoint is None else Path(checkpoint)
        cfg, g = pipeline.cfg, pipeline.geometry
        self.frames_per_block = cfg.num_frames_per_block
        self.geometry = WorldGeometry(
            height=pipeline.height, width=pipeline.width,
            frames_per_chunk=VAE_TEMPORAL_STRIDE * cfg.num_frames_per_block, fps=FPS,
            num_layers=g.num_layers, kv_heads=g.kv_heads, head_dim=g.head_dim,
            tokens_per_frame=g.tokens_per_frame, sink_frames=g.sink_frames,
            window_frames=g.window_frames, dtype_bytes=g.itemsize)
        self._listener: Callable[[str, str], None] | None = None

    def describe(self) -> Mapping[str, Any]:
        g, cfg, p = self.geometry, self.pipeline.cfg, self.pipeline
        return {
            "kind": self.kind, "name": self.name,
            "checkpoint": str(self.checkpoint) if self.checkpoint else None,
            "height": g.height, "width": g.width, "fps": g.fps, "frames_per_chunk": g.frames_per_chunk,
            "latent_frames_per_chunk": self.frames_per_block, "max_batch": self.max_batch,
            "device": str(p.device), "dtype": str(p.dtype).replace("torch.", ""),
            "denoising_steps": len(DMD_TIMESTEPS), "flow_shift": p.flow_shift,
            "sink_frames": cfg.sink_size, "rolling_frames": cfg.rolling_frames,
            "attention_window_frames": cfg.sliding_window_num_frames,
            "max_sessions": p.cache.max_sessions,
            "controls": ["keys.v1"], "model_controls": [ACTIONS_SCHEMA, TRAJECTORY_SCHEMA],
            "takes_image": False,
            "weights_licence": "CC BY-NC-SA 4.0 (non-commercial)",
        }

    def run_batch(self, works: Sequence[WorldTick]) -> list[WorldChunk]:
        if not works:
            return []
        if len({w.session_id for w in works}) != len(works):
            raise ModelError("a session appears twice in one batch")
        F = self.geometry.frames_per_chunk
        p = self.pipeline
        for w in works:
            if len(w.actions) != F:
                raise ModelError(f"session {w.session_id}: {len(w.actions)} key sets for {F} frames")
            if w.chunk_index > 0 and w.session_id not in p.sessions:
                raise ModelError(f"session {w.session_id}: no world to continue; start at chunk 0")
        firsts = set()
        try:
            for w in works:
                if w.chunk_index == 0:
                    p.close(w.session_id)
                    p.open(w.session_id, w.prompt or "", seed=w.seed)
                    firsts.add(w.session_id)
            frames = p.run([BlockRequest(w.session_id, prompt=w.prompt,
                                         keys=latent_keys(w.actions, self.frames_per_block))
                            for w in works])
        except (NoCapacity, ValueError) as e:
            raise ModelError(str(e)) from e
        out = []
        for w, f in zip(works, frames):
            if len(f) < F:  # a session's first block: hold its first frame
                f = np.concatenate([np.repeat(f[:1], F - len(f), 0), f])
            out.append(WorldChunk(session_id=w.session_id, request_id=w.request_id,
                                  chunk_index=w.chunk_index, applied_event_ids=w.applied_event_ids,
                                  frames=f))
        return out

    def end_tick(self, session_id: str, committed: bool) -> None:
        self.pipeline.end(session_id, committed)

    def release(self, session_id: str) -> None:
        self.pipeline.close(session_id)

    def set_drop_listener(self, listener: Callable[[str, str], None]) -> None:
        self._listener = listener  # no eviction yet: every session stays resident
