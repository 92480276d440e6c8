"""A batch of goal episodes in the simulator: observe, execute key chunks, count success.

An episode ends when the camera reaches its target (``goals.reached``) or after
``BUDGET`` frames. Frames are counted one per executed action row; a finished
episode's camera is frozen (its keys are zeroed) so a batch can run on until
the last one ends. ``frames[i]`` is the number of frames executed when episode
``i`` ended (the frame that reached the goal included).
"""

from __future__ import annotations

import torch

from models.policy.maze.model import HISTORY, policy_state
from models.world.maze.planner import goal_sim

BUDGET = 300   # frames; the planner needs at most ~170 (MODEL_CARD.md)


def call_seed(episode_seed: int, call: int) -> int:
    """The noise seed of policy call ``call`` in the episode of maze ``episode_seed`` (evaluation and robot)."""
    return (episode_seed * 1_000_003 + call) % 2**63


class Episodes:
    """``len(seeds)`` goal episodes of ``kind`` (one kind, or one per seed) on one device."""

    def __init__(self, seeds: list[int], kind: str | list[str], device: str | torch.device = "cpu",
                 budget: int = BUDGET) -> None:
        self.sim = goal_sim(seeds, kind, device)
        self.budget = budget
        B, dev = self.sim.batch, self.sim.device
        self.history = torch.zeros(B, HISTORY, 8, device=dev)
        self.frames = torch.zeros(B, dtype=torch.int64, device=dev)
        self.done = torch.zeros(B, dtype=torch.bool, device=dev)
        self.success = torch.zeros(B, dtype=torch.bool, device=dev)

    def prompts(self, variant: int = 0) -> list[str]:
        assert self.sim.goals is not None
        return [g.prompt(variant) for g in self.sim.goals]

    def observe(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Camera [B, 64, 64, 3] uint8 and state [B, STATE_DIM] float32, on the sim's device."""
        return self.sim.render(), policy_state(self.sim.yaw, self.sim.pitch, self.history)

    def step(self, keys: torch.Tensor) -> None:
        """Execute one frame of keys [B, 8] (0/1) for the episodes still running."""
        live = ~self.done
        keys = keys.to(self.sim.device, torch.float32) * live[:, None]
        self.sim.step(keys)
        self.history = torch.cat([self.history[:, 1:], keys[:, None]], 1)
        self.frames += live.long()
        hit = live & self.sim.reached()
        self.success |= hit
        self.done |= hit | (self.frames >= self.budget)

    def execute(self, chunk: torch.Tensor) -> None:
        """Execute a chunk [B, T, 8] row by row."""
        for t in range(chunk.shape[1]):
            self.step(chunk[:, t])

    @property
    def all_done(self) -> bool:
        return bool(self.done.all())
