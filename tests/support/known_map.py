"""One maze as an explorer knows it, in plain Python: the per-maze reference that the batched
scanner (models/maze/scanner.py) is checked against in tests/models/maze/test_scanner.py."""

from __future__ import annotations

from models.maze.goals import GoalEpisode
from models.maze.planner import distance_field

SIGHTS = ("cells", "corridors")
_STEPS = ((1, 0), (-1, 0), (0, 1), (0, -1))


class KnownMap:
    """Unknown cells count as floor until seen. ``sight``: ``cells`` learns the 4 neighbours of the
    cell it stands in; ``corridors`` also sees straight down each open corridor from there."""

    def __init__(self, grid: list[list[int]], goal: GoalEpisode, sight: str) -> None:
        if sight not in SIGHTS:
            raise ValueError(f"sight must be one of {SIGHTS}, got {sight!r}")
        self.grid, self.goal, self.sight = grid, goal, sight
        self.n = len(grid)
        self.known = [[0] * self.n for _ in range(self.n)]   # 1: a wall it has seen
        self.seen: set[tuple[int, int]] = set()
        tx, ty = goal.target_cell
        self.known[ty][tx] = grid[ty][tx]                    # the target's own cell: the beacon says where

    def look(self, cell: tuple[int, int]) -> bool:
        """Learn what is visible from ``cell``; True if a wall was learnt (the field must change)."""
        new_wall = False
        for c in self._visible(cell):
            if c in self.seen:
                continue
            self.seen.add(c)
            x, y = c
            if self.grid[y][x]:
                self.known[y][x] = 1
                new_wall = True
        return new_wall

    def _visible(self, cell: tuple[int, int]) -> list[tuple[int, int]]:
        x0, y0 = cell
        out = [cell]
        for dx, dy in _STEPS:
            x, y = x0 + dx, y0 + dy
            while 0 <= x < self.n and 0 <= y < self.n:
                out.append((x, y))
                if self.grid[y][x] or self.sight == "cells":
                    break   # a wall ends the view down this corridor
                x, y = x + dx, y + dy
        return out

    def field(self) -> list[list[int]]:
        """Path lengths to the target's approach cells over the known map (``UNREACHABLE`` on known walls)."""
        return distance_field(self.known, self.goal)
