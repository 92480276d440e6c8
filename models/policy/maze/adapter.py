"""``MazePolicy``: the trained maze policy served through the policy seam (OpenPI).

It is ``FlowMatchingPolicy`` (batching across robots, per-robot seeded noise,
observation K/V computed once per call) with the trained ``MazeFlowModel`` in
place of random weights; the sampled chunk is thresholded at 0, so a robot gets
key bits (1.0 = held) in ``KEY_NAMES`` order, ``HORIZON`` frames a chunk.

Metadata ``extra`` tells a robot what it needs beyond the OpenPI fields: the key
order, how many frames of each chunk to execute before observing again
(``execute_horizon``), how to build the state (``state_layout``, ``model.py``'s
``STATE_LAYOUTS``, and a sentence), and the prompts it understands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from models.maze.goals import COLOUR_NAMES, GOAL_KINDS, PROMPTS
from models.maze.seen_map import MAP_CHANNELS, MAP_FLOATS, MAP_SIDE
from models.maze.sim import PITCH_MAX
from models.policy.base import PolicyWork
from models.policy.flow import FlowMatchingPolicy
from models.policy.maze.model import EXECUTE, HISTORY, IMAGE_KEY, VISIT_SATURATE, VISIT_WINDOW, load_policy
from protocols.openpi import PolicyMetadata
from protocols.world_v1 import KEY_NAMES

DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "weights" / "maze_policy.safetensors"


_KEYS_TEXT = f"cos yaw, sin yaw, pitch / 12, keys of the last {HISTORY} frames (oldest first)"
_STATE_TEXT = {
    "keys": _KEYS_TEXT,
    "memory": _KEYS_TEXT + "; then (x, y) from the start / maze size, offset from the cell centre (x, y), "
              f"frames spent per cell / {VISIT_SATURATE} (max 1) in the {VISIT_WINDOW}x{VISIT_WINDOW} cells "
              "around the robot's (rows y, world axes)",
    "map": _KEYS_TEXT + "; then the robot's map as seen (models/maze/seen_map.py): cos / sin of the heading "
           f"less its quarter turn, the offset in the cell (ahead, right), and {MAP_CHANNELS} channels (wall, floor, "
           f"then one object per goal colour) of {MAP_SIDE}x{MAP_SIDE} cells around the robot, turned to the heading",
}


class MazePolicy(FlowMatchingPolicy):
    """The maze navigation policy (see the module docstring)."""

    def __init__(self, weights: str | Path | None = None, *, device: str = "cpu", max_batch: int = 64,
                 num_inference_steps: int | None = None, name: str = "maze-policy") -> None:
        path = Path(weights) if weights else DEFAULT_WEIGHTS
        if not path.is_file():
            raise FileNotFoundError(f"maze policy weights not found: {path}")
        over: dict[str, Any] = {"max_batch": max_batch}
        if num_inference_steps is not None:
            over["num_inference_steps"] = num_inference_steps
        model = load_policy(path, device, **over)
        cfg = model.cfg
        metadata = PolicyMetadata(
            action_horizon=cfg.action_horizon, action_dim=cfg.action_dim, image_keys=(IMAGE_KEY,),
            image_resolution=cfg.image_resolution, state_dim=cfg.state_dim,
            extra={
                "policy": "maze-flow-matching",
                "num_inference_steps": cfg.num_inference_steps,
                "action_keys": "".join(KEY_NAMES),
                "execute_horizon": EXECUTE,
                "state_layout": model.state_layout,
                "state": _STATE_TEXT[model.state_layout],
                # The layout as numbers, for a robot that builds the state itself (the page's; for
                # map, maze-sim's chunk info carries the map's floats).
                "state_pitch_scale": PITCH_MAX, "state_key_history": HISTORY,
                **({"state_map_floats": MAP_FLOATS} if model.state_layout == "map" else {}),
                "prompts": [PROMPTS[k][0].format(c=c) for k in GOAL_KINDS for c in COLOUR_NAMES],
            },
        )
        super().__init__(cfg, device=device, name=name, model=model, metadata=metadata)
        self.weights = path
        self.state_layout = model.state_layout

    def describe(self) -> Mapping[str, Any]:
        return {**super().describe(), "weights": self.weights.name}

    def infer_batch(self, works: Sequence[PolicyWork]) -> list[Mapping[str, Any]]:
        outs = super().infer_batch(works)
        return [{"actions": (o["actions"] > 0).astype(np.float32)} for o in outs]

