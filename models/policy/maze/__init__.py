"""The maze navigation policy: flow matching, trained here by imitation with DAgger.

    model.py      MazeFlowModel (flow.py's action expert + a 64x64 conv stem), policy_state, save/load
    map_planner.py MapPlanner: value iteration over the map state (the shipped weights' state token)
    episodes.py   Episodes: a batch of goal episodes in the simulator (observe, execute, success)
    adapter.py    MazePolicy(PolicyAdapter): the served policy (key bits per frame)
    robot.py      python -m models.policy.maze.robot: the simulator as an openpi-client robot
    training/     train and evaluate, and their logs (kept out of the wheel)
    MODEL_CARD.md what was trained, how, and how well

``build(path, options)`` is the factory entry (``models/factory.py`` names it).
"""

from __future__ import annotations

from typing import Any

from models.policy.base import PolicyAdapter


def build(path: str | None, options: Any) -> PolicyAdapter:
    """The maze policy from ``path`` (default: the shipped weights).

    ``options`` carries ``device``, ``max_batch`` and ``steps`` (Euler steps, 0 or
    None = the trained default); ``frames_per_chunk`` and ``gpu_memory_fraction``
    do not apply to a policy and are ignored.
    """
    from models.policy.maze.adapter import MazePolicy

    steps = getattr(options, "steps", None) or None
    return MazePolicy(path or None, device=str(getattr(options, "device", "cpu")),
                      max_batch=int(getattr(options, "max_batch", None) or 64), num_inference_steps=steps)
