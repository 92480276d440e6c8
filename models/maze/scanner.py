"""A teacher that knows only what a robot could: the target once its beacon was in view, walls once seen.

The shortest-path planner (``planner.py``) steers by the true map. Imitated, its labels
follow corridors the robot has no way to tell apart, most of all at the start, when the
target is out of view in nine episodes of ten. The scanner decides from what the robot's
own camera and odometry have given it, batched on the sim's device::

    until the target's beacon has been in the field of view     turn on the spot (L)
    then: the planner's steering over the maze as seen so far   unknown cells count as floor,
                                                                re-planned when a wall is seen

What it has "seen" (``look``, once per observation): from the cell it stands in, each
straight corridor up to and including the first wall, in the four grid directions (what a
camera looking along it shows). The beacon is visible from anywhere when within the camera's
horizontal field of view (beacons are drawn above the walls), and says where the target is.

How often it reaches the goal within the evaluation's budget beside the planner was measured
once (``bench/results/maze_teacher_ceiling.json``: 0.91 of the planner's episodes);
``models/policy/maze/training/train.py --teacher scanner`` imitates it.
"""

from __future__ import annotations

import torch

from models.maze.planner import UNREACHABLE, Planner
from models.maze.sim import FOV, KL, MazeSim


def beacon_in_view(sim: MazeSim) -> torch.Tensor:
    """[B] bool: the target's centre is within the camera's horizontal field of view."""
    bearing, _ = sim.target_bearing()
    return bearing.abs() < FOV / 2


def corridor_view(grid: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
    """[B, n, n] bool: the cells visible from ``cell`` [B, 2] (x, y) down its row and column,
    each direction up to and including the first wall."""
    B, n, _ = grid.shape
    b = torch.arange(B, device=grid.device)
    x, y = cell[:, 0], cell[:, 1]
    idx = torch.arange(n, device=grid.device)[None]                        # [1, n]
    row, col = grid[b, y] > 0, grid[b, :, x] > 0                           # [B, n]: walls along the row / column

    def along(line: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        # Visible on one line: no wall strictly between ``at`` and the cell, on either side.
        after = (idx > at[:, None]) & line
        before = (idx < at[:, None]) & line
        walls_after = torch.cumsum(after.long(), 1) - after.long()         # walls strictly between, going up
        walls_before = torch.flip(torch.cumsum(torch.flip(before.long(), [1]), 1), [1]) - before.long()
        up = (idx > at[:, None]) & (walls_after == 0)
        down = (idx < at[:, None]) & (walls_before == 0)
        return up | down | (idx == at[:, None])

    seen = torch.zeros(B, n, n, dtype=torch.bool, device=grid.device)
    seen[b, y] |= along(row, x)
    seen[b, :, x] |= along(col, y)
    return seen


def known_distances(known: torch.Tensor, sources: torch.Tensor) -> torch.Tensor:
    """[B, n, n] int64 4-neighbour path lengths over the floor of ``known`` (1: wall) from
    ``sources`` (bool [B, n, n]); ``UNREACHABLE`` where no path is known (walls included).
    Breadth-first by relaxation, every maze at once."""
    floor = known == 0
    inf = UNREACHABLE
    dist = torch.where(sources & floor, 0, inf)
    for _ in range(known.shape[1] * known.shape[2]):
        padded = torch.nn.functional.pad(dist, (1, 1, 1, 1), value=inf)
        near = torch.minimum(torch.minimum(padded[:, :-2, 1:-1], padded[:, 2:, 1:-1]),
                             torch.minimum(padded[:, 1:-1, :-2], padded[:, 1:-1, 2:]))
        new = torch.where(floor, torch.minimum(dist, (near + 1).clamp(max=inf)), inf)
        if torch.equal(new, dist):
            break
        dist = new
    return dist


class Scanner:
    """The scanner's keys for every camera of one ``MazeSim`` with goals (see the module docstring)."""

    def __init__(self, sim: MazeSim) -> None:
        if sim.goals is None:
            raise ValueError("the scanner needs a MazeSim with goals")
        self.sim = sim
        B, n, dev = sim.batch, sim.n, sim.device
        t = sim.target_cell                                                   # [B, 2] (x, y)
        self.known = torch.zeros(B, n, n, dtype=torch.int64, device=dev)      # 1: a wall it has seen
        self.known[sim._b, t[:, 1], t[:, 0]] = sim.grid[sim._b, t[:, 1], t[:, 0]]
        self.seen = torch.zeros(B, n, n, dtype=torch.bool, device=dev)
        # Where the distances start: a marker's own cell; a goal wall's floor neighbours (in the
        # map as known: known_distances keeps only sources on known floor).
        self._src = torch.zeros_like(self.seen)
        self._src[sim._b, t[:, 1], t[:, 0]] = ~sim.goal_is_wall
        for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            x, y = (t[:, 0] + dx).clamp(0, n - 1), (t[:, 1] + dy).clamp(0, n - 1)
            inside = ((t[:, 0] + dx) == x) & ((t[:, 1] + dy) == y)
            self._src[sim._b, y, x] |= sim.goal_is_wall & inside
        self.found = torch.zeros(B, dtype=torch.bool, device=dev)
        self.replans = 0
        self._see()  # the first view, before the first field: one search, not two
        self.planner = Planner(sim, known_distances(self.known, self._src))
        self.found |= beacon_in_view(sim)
        self._found_now = self.found.clone()

    def _see(self) -> torch.Tensor:
        """Add what the cameras see down their corridors now to the map; [B] bool: a new wall."""
        sim = self.sim
        cell = sim.pos.floor().long().clamp(0, sim.n - 1)
        view = corridor_view(sim.grid, cell) & ~self.seen
        self.seen |= view
        walls = view & (sim.grid > 0)
        self.known = torch.where(walls, 1, self.known)
        return walls.flatten(1).any(1)

    def look(self) -> None:
        """Learn what the cameras see now: corridors from their cells, the target's beacon.
        Only the mazes with a new wall are planned again."""
        sim = self.sim
        changed = self._see()
        if bool(changed.any()):
            self.planner.dist[changed] = known_distances(self.known[changed], self._src[changed])
            self.replans += 1
        self.found |= beacon_in_view(sim)
        self._found_now = self.found.clone()

    def keys(self) -> torch.Tensor:
        """[B, 8] float 0/1 for the current frame. Between ``look`` calls (a label's look-ahead)
        the map stays as seen, and a beacon coming into view counts from then on."""
        self._found_now |= beacon_in_view(self.sim)
        keys = self.planner.keys()
        turn = torch.zeros_like(keys)
        turn[:, KL] = 1.0
        return torch.where(self._found_now[:, None], keys, turn)
