"""The expert: a shortest-path planner on the true map, emitting the 8 key bits per frame.

For each maze, a BFS over floor cells from the target's approach cells (the
marker cell, or the floor cells beside the goal wall) gives a distance field.
Each frame, for every camera at once (torch, the sim's device):

    here     = dist[cell of the camera]
    waypoint = centre of the 4-neighbour with the smallest distance
               (at distance 0: the marker's centre, or the goal wall's face)
    err      = bearing to the waypoint - yaw, wrapped to (-pi, pi]
    keys     = turn only        if |err| > TURN_ONLY
               W + turn         if |err| > AIM
               W                otherwise
    and I / K to bring the pitch back to level.

The planner needs only the current pose, so it labels any state, including
the ones a learner drives into (DAgger).
"""

from __future__ import annotations

import math

import torch

from models.maze.goals import GoalEpisode, approach_cells, floor_distances
from models.maze.sim import KI, KJ, KK, KL, KW, MazeSim

UNREACHABLE = 10_000
TURN_ONLY = math.radians(30.0)
AIM = math.radians(5.0)
_STEPS = ((1, 0), (-1, 0), (0, 1), (0, -1))


def distance_field(grid: list[list[int]], ep: GoalEpisode) -> list[list[int]]:
    """One maze's path lengths to its target's approach cells, rows y (``UNREACHABLE`` on walls); pure Python."""
    dist = floor_distances(grid, approach_cells(grid, ep.kind, ep.target_cell))
    n = len(grid)
    return [[dist.get((x, y), UNREACHABLE) for x in range(n)] for y in range(n)]


def distance_fields(sim: MazeSim) -> torch.Tensor:
    """[B, n, n] int64 path length to the target's approach cells (``UNREACHABLE`` on walls)."""
    if sim.goals is None:
        raise ValueError("the planner needs a MazeSim with goals")
    fields = [distance_field(grid, ep) for grid, ep in zip(sim.grid.tolist(), sim.goals)]
    return torch.tensor(fields, dtype=torch.int64, device=sim.device)


class Planner:
    """Expert keys for every camera of one ``MazeSim`` (see the module docstring)."""

    def __init__(self, sim: MazeSim, fields: list[list[list[int]]] | torch.Tensor | None = None) -> None:
        """``fields``: the mazes' ``distance_field``s if already made (training makes them in
        workers), or [B, n, n] distances to steer by (the scanner's, over the map as seen)."""
        self.sim = sim
        if fields is None:
            self.dist = distance_fields(sim)
        else:
            self.dist = torch.as_tensor(fields, dtype=torch.int64, device=sim.device)
            if self.dist.shape != sim.grid.shape:
                raise ValueError(f"distance fields {tuple(self.dist.shape)} for mazes {tuple(sim.grid.shape)}")
        self._target_centre = sim.target_cell.float() + 0.5                # [B, 2] target centre
        self._steps = torch.tensor(_STEPS, dtype=torch.int64, device=sim.device)  # [4, 2]

    def keys(self) -> torch.Tensor:
        """[B, 8] float 0/1: the expert's keys for the current frame."""
        sim = self.sim
        n, b = sim.n, sim._b
        pos = sim.pos
        cell = pos.floor().long().clamp(0, n - 1)                            # [B, 2] (x, y)
        nb = (cell[:, None] + self._steps[None]).clamp(0, n - 1)            # [B, 4, 2]
        d_nb = self.dist[b[:, None], nb[..., 1], nb[..., 0]]                 # [B, 4]
        best = nb[b, d_nb.argmin(1)].float() + 0.5
        here = self.dist[b, cell[:, 1], cell[:, 0]]
        # At distance 0: a marker's centre, or the middle of the goal wall's face.
        centre = cell.float() + 0.5
        face = (centre + self._target_centre) / 2
        final = torch.where(sim.goal_is_wall[:, None], face, self._target_centre)
        waypoint = torch.where((here == 0)[:, None], final, best)
        delta = waypoint - pos
        err = torch.remainder(torch.atan2(delta[:, 1], delta[:, 0]) - sim.yaw + math.pi, 2 * math.pi) - math.pi
        keys = torch.zeros(sim.batch, 8, device=sim.device)
        turn = err.abs() > AIM
        keys[:, KL] = (turn & (err > 0)).float()
        keys[:, KJ] = (turn & (err < 0)).float()
        keys[:, KW] = (err.abs() <= TURN_ONLY).float()
        keys[:, KK] = (sim.pitch > 0).float()
        keys[:, KI] = (sim.pitch < 0).float()
        return keys


def goal_seeds(seed0: int, count: int) -> list[int]:
    """The first ``count`` seeds from ``seed0`` whose mazes take goals of every kind."""
    from models.maze.goals import has_goals
    from models.maze.sim import make_maze

    seeds: list[int] = []
    s = seed0
    while len(seeds) < count:
        grid, start, _ = make_maze(s)
        if has_goals(s, grid, start):
            seeds.append(s)
        s += 1
    return seeds


def goal_sim(seeds: list[int], kind: str | list[str], device: str | torch.device = "cpu",
             goals: list[GoalEpisode] | None = None) -> MazeSim:
    """A ``MazeSim`` of ``seeds`` with a goal episode of ``kind`` (one, or one per seed) each.

    ``goals``: the episodes if already placed (``make_goals`` of the same seeds and kinds).
    """
    from models.maze.goals import make_goals
    from models.maze.sim import make_maze

    kinds = [kind] * len(seeds) if isinstance(kind, str) else list(kind)
    if goals is None:
        goals = []
        for s, k in zip(seeds, kinds):
            grid, start, _ = make_maze(int(s))
            goals.append(make_goals(int(s), k, grid, start))
    elif [g.kind for g in goals] != kinds:
        raise ValueError("goals must be of the kinds asked for, one per seed")
    return MazeSim(seeds, device, goals=goals)
