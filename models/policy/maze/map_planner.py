"""The ``map`` state's encoder: a learned value-iteration planner over the robot's map as seen.

    state = [keys layout | MAP_POSE | map window, MAP_CHANNELS x MAP_SIDE x MAP_SIDE]
    map ──2 convs (FiLM'd by the prompt)──> features h
          h ──1x1──> reward r (where the prompt's goal object is), passable p (what is not a wall)
          v = r; MAP_ITERATIONS times: v = max(v, gamma * p * max of v's 4 neighbours)
    v and p in the READ-cell patch around the robot, h at its cell, the pose, the keys ──MLP──> state token

The propagation is value iteration's max-plus step (Tamar et al., *Value Iteration Networks*,
2016, with the 4-neighbour moves of the maze): after k iterations v holds gamma to the power
of the shortest path (through cells p calls passable) to a rewarded cell within k steps. What
it plans over is learnt: which cells count as passable and which as the goal is what the
convolutions and the prompt make of the map, trained end to end with the flow-matching loss.
The robot sits at the window's centre, heading along its columns (``models/maze/seen_map.py``), so the
patch around the centre says which way along the map is shorter, relative to the heading.
"""

from __future__ import annotations

import torch
from torch import nn

from models.maze.seen_map import MAP_CHANNELS, MAP_POSE, MAP_RADIUS, MAP_SIDE

MAP_ITERATIONS = 40   # cells of path the planner looks along (a target is 4-14 from the start)
READ = 2              # cells each side of the robot's read out of v and p
FEATURES = 32


def neighbour_max(v: torch.Tensor) -> torch.Tensor:
    """[B, 1, S, S] -> the max over each cell's 4 grid neighbours (0 beyond the window)."""
    p = nn.functional.pad(v, (1, 1, 1, 1))
    return torch.maximum(torch.maximum(p[:, :, :-2, 1:-1], p[:, :, 2:, 1:-1]),
                         torch.maximum(p[:, :, 1:-1, :-2], p[:, :, 1:-1, 2:]))


class MapPlanner(nn.Module):
    """``state`` [B, head + MAP_FLOATS] and the prompt embedding [B, d] -> the state token [B, d]."""

    def __init__(self, d: int, head: int, iterations: int = MAP_ITERATIONS) -> None:
        super().__init__()
        self.head, self.iterations = head, iterations
        self.features = nn.Sequential(nn.Conv2d(MAP_CHANNELS, FEATURES, 3, padding=1), nn.GELU(),
                                      nn.Conv2d(FEATURES, FEATURES, 3, padding=1), nn.GELU())
        # The prompt picks the goal: it scales and shifts the features (zero at the start) and
        # weighs the raw channels into the reward directly.
        self.film = nn.Linear(d, 2 * FEATURES)
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)
        self.prompt_reward = nn.Linear(d, MAP_CHANNELS)
        self.reward = nn.Conv2d(FEATURES, 1, 1)
        self.passable = nn.Conv2d(FEATURES, 1, 1)
        nn.init.constant_(self.reward.bias, -4.0)     # little reward anywhere at the start
        nn.init.constant_(self.passable.bias, 2.0)    # most cells passable at the start
        self.decay = nn.Parameter(torch.tensor(2.0))  # gamma = sigmoid(decay), 0.88 at the start
        patch = (2 * READ + 1) ** 2
        width = head + MAP_POSE + 2 * patch + FEATURES
        self.out = nn.Sequential(nn.Linear(width, 2 * d), nn.GELU(), nn.Linear(2 * d, 2 * d), nn.GELU(),
                                 nn.Linear(2 * d, d))

    def values(self, maps: torch.Tensor, prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """maps [B, MAP_CHANNELS, S, S] -> v, p [B, 1, S, S] and the features [B, FEATURES, S, S]."""
        h = self.features(maps)
        gamma_h, beta_h = self.film(prompt).chunk(2, dim=-1)
        h = h * (1 + gamma_h[:, :, None, None]) + beta_h[:, :, None, None]
        direct = (self.prompt_reward(prompt)[:, :, None, None] * maps).sum(1, keepdim=True)
        r = torch.sigmoid(self.reward(h) + direct)
        p = torch.sigmoid(self.passable(h))
        gamma = torch.sigmoid(self.decay)
        v = r
        for _ in range(self.iterations):
            v = torch.maximum(v, gamma * p * neighbour_max(v))
        return v, p, h

    def forward(self, state: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        b = state.shape[0]
        keys, pose = state[:, :self.head], state[:, self.head:self.head + MAP_POSE]
        maps = state[:, self.head + MAP_POSE:].reshape(b, MAP_CHANNELS, MAP_SIDE, MAP_SIDE)
        v, p, h = self.values(maps, prompt)
        c, lo, hi = MAP_RADIUS, MAP_RADIUS - READ, MAP_RADIUS + READ + 1
        near_v = torch.log(v[:, 0, lo:hi, lo:hi].flatten(1) + 1e-4)
        near_p = p[:, 0, lo:hi, lo:hi].flatten(1)
        return self.out(torch.cat([keys, pose, near_v, near_p, h[:, :, c, c]], 1))
