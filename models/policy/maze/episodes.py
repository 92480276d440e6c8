"""A batch of goal episodes in the simulator: observe, execute key chunks, count success.

An episode ends when the camera reaches its target (``goals.reached``) or after
``BUDGET`` frames. Frames are counted one per executed action row; a finished
episode's camera is frozen (its keys are zeroed) so a batch can run on until
the last one ends. ``frames[i]`` is the number of frames executed when episode
``i`` ended (the frame that reached the goal included).

The state a robot sends follows the policy's state ``layout`` (``model.py``):
for ``memory`` the episodes also count the frames spent in each cell (the
robot's odometry memory; the start cell counts from frame 0) and keep the sky
panorama of every frame the camera saw (``model.panorama_update``): the
simulator's frame, or the camera a caller passes to ``step`` (the dream
passes the world model's frames, so the memory holds what the policy saw).
For ``map`` they keep the robot's map as seen (``models/maze/seen_map.py``'s ``SeenMap``), which
looks down the corridors after every frame.
"""

from __future__ import annotations

import torch

from models.maze.goals import GoalEpisode
from models.maze.planner import goal_sim
from models.maze.seen_map import SeenMap
from models.policy.maze.model import (HISTORY, LAYOUT, PANORAMA_BINS, STATE_LAYOUTS, egocentric, panorama_update,
                                      policy_state, visit_memory)

BUDGET = 300   # frames; the planner needs at most ~170 (MODEL_CARD.md)


def call_seed(episode_seed: int, call: int) -> int:
    """The noise seed of policy call ``call`` in the episode of maze ``episode_seed`` (evaluation and robot)."""
    return (episode_seed * 1_000_003 + call) % 2**63


class Episodes:
    """``len(seeds)`` goal episodes of ``kind`` (one kind, or one per seed) on one device."""

    def __init__(self, seeds: list[int], kind: str | list[str], device: str | torch.device = "cpu",
                 budget: int = BUDGET, layout: str = LAYOUT, goals: list[GoalEpisode] | None = None) -> None:
        if layout not in STATE_LAYOUTS:
            raise ValueError(f"state layout must be one of {list(STATE_LAYOUTS)}, got {layout!r}")
        self.sim = goal_sim(seeds, kind, device, goals)
        self.budget = budget
        self.layout = layout
        B, dev = self.sim.batch, self.sim.device
        self.start = self.sim.pos.clone()
        self.visits = torch.zeros(B, self.sim.n, self.sim.n, device=dev)
        self.panorama = torch.zeros(B, PANORAMA_BINS, 6, device=dev)
        self._camera: torch.Tensor | None = None
        self.map = SeenMap(self.sim) if layout == "map" else None
        self._remember(torch.ones(B, dtype=torch.bool, device=dev))
        self.history = torch.zeros(B, HISTORY, 8, device=dev)
        self.frames = torch.zeros(B, dtype=torch.int64, device=dev)
        self.done = torch.zeros(B, dtype=torch.bool, device=dev)
        self.success = torch.zeros(B, dtype=torch.bool, device=dev)

    def prompts(self, variant: int = 0) -> list[str]:
        assert self.sim.goals is not None
        return [g.prompt(variant) for g in self.sim.goals]

    def observe(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Camera [B, 64, 64, 3] uint8 and state [B, STATE_LAYOUTS[layout]] float32, on the sim's device."""
        if self.map is not None:
            return self.sim.render(), policy_state(self.sim.yaw, self.sim.pitch, self.history, self.map.state())
        if self.layout != "memory":
            return self.sim.render(), policy_state(self.sim.yaw, self.sim.pitch, self.history)
        assert self._camera is not None
        pano = egocentric(self.panorama, self.sim.yaw).flatten(1)
        memory = torch.cat([visit_memory(self.sim.pos, self.start, self.visits), pano], 1)
        return self._camera, policy_state(self.sim.yaw, self.sim.pitch, self.history, memory)

    def _remember(self, live: torch.Tensor, camera: torch.Tensor | None = None) -> None:
        """The ``memory`` layout's bookkeeping after a frame: the cell's visit count and the sky panorama
        (``map``: what the robot sees from where it stands)."""
        if self.map is not None:
            self.map.look(live)
        if self.layout != "memory":
            return
        cell = self.sim.pos.floor().long().clamp(0, self.sim.n - 1)
        self.visits[self.sim._b, cell[:, 1], cell[:, 0]] += live.float()
        self._camera = self.sim.render()
        seen = self._camera if camera is None else camera.to(self.sim.device)
        self.panorama = panorama_update(self.panorama, seen, self.sim.yaw, live)

    def see_first(self, camera: torch.Tensor) -> None:
        """Frame 0 came from another camera (the dream's world model): the panorama holds that one instead."""
        if self.layout != "memory":
            return
        if bool((self.frames > 0).any()):
            raise RuntimeError("see_first is for frame 0, before any step")
        live = torch.ones(self.sim.batch, dtype=torch.bool, device=self.sim.device)
        self.panorama = panorama_update(torch.zeros_like(self.panorama), camera.to(self.sim.device), self.sim.yaw, live)

    def step(self, keys: torch.Tensor, camera: torch.Tensor | None = None) -> None:
        """Execute one frame of keys [B, 8] (0/1) for the episodes still running.

        ``camera`` [B, 64, 64, 3] uint8: the frame the robot saw after it (default:
        the simulator's), for the ``memory`` layout's panorama.
        """
        live = ~self.done
        keys = keys.to(self.sim.device, torch.float32) * live[:, None]
        self.sim.step(keys)
        self.history = torch.cat([self.history[:, 1:], keys[:, None]], 1)
        self.frames += live.long()
        self._remember(live, camera)
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
