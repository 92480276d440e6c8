"""How far a teacher that does not know the map gets within the budget (issue 18).

The maze policy imitates the shortest-path planner, which knows the maze; the policy knows
only what its camera and odometry gave it, and reached 0.23-0.26 of the planner's successes
(``models/policy/maze/MODEL_CARD.md``). If the cause is the teacher's knowledge, a teacher
limited to what a robot can know should do much better as a target to imitate, and how often
it succeeds within the same budget is the ceiling of imitating it. This measures that ceiling
on the evaluation's episodes (``goal_seeds(0, N)`` per goal kind, ``BUDGET`` frames):

* ``planner``: the shortest path on the true map (the evaluation's reference);
* ``explorer``: knows where its target is (its sky beacon shows the direction from anywhere,
  its width the distance) but a wall only once it has seen it. It plans the shortest path over
  the maze as it knows it, unknown cells taken as floor, and re-plans when it learns a wall.
  ``--sight cells``: it learns the 4 neighbours of each cell it stands in;
  ``--sight corridors``: it also sees straight down each open corridor from there, as a
  camera looking along it would;
* ``scanner`` (``models/world/maze/scanner.py``, batched, the teacher ``train.py --teacher
  scanner`` imitates): the corridors explorer, but it knows where its target is only once the
  target's beacon has been in the camera's field of view (beacons show above the walls, so only
  the view's angle matters); until then it turns on the spot, as a robot looking for it would.

The explorer is the planner (``models/world/maze/planner.py``) steering by a distance field
that is recomputed on the known map whenever it grows, so both move alike. CPU, pure Python
BFS per maze; about a minute for 200 mazes per kind::

    python -m bench.maze.teacher_ceiling --mazes 200 --out bench/results/maze_teacher_ceiling.json
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from typing import Any

import torch

from bench.report import emit
from models.policy.maze.episodes import BUDGET, Episodes
from models.world.maze.goals import GOAL_KINDS, GoalEpisode
from models.world.maze.planner import Planner, distance_field, goal_seeds
from models.world.maze.scanner import Scanner

SIGHTS = ("cells", "corridors")
_STEPS = ((1, 0), (-1, 0), (0, 1), (0, -1))


def log(msg: str) -> None:
    print(f"[teacher_ceiling {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class KnownMap:
    """One maze as the explorer knows it: unknown cells count as floor until seen."""

    def __init__(self, grid: list[list[int]], goal: GoalEpisode, sight: str) -> None:
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


def drive_explorer(ep: Episodes, sight: str) -> int:
    """Run ``ep`` with the explorer; returns how many times a field was recomputed."""
    sim = ep.sim
    assert sim.goals is not None
    maps = [KnownMap(g, goal, sight) for g, goal in zip(sim.grid.tolist(), sim.goals)]
    cells = [tuple(c) for c in sim.pos.floor().long().tolist()]
    for m, c in zip(maps, cells):
        m.look(c)   # type: ignore[arg-type]
    planner = Planner(sim, [m.field() for m in maps])
    replans = 0
    while not ep.all_done:
        now = [tuple(c) for c in sim.pos.floor().long().clamp(0, sim.n - 1).tolist()]
        for b, (m, c) in enumerate(zip(maps, now)):
            if c != cells[b] and not bool(ep.done[b]):
                cells[b] = c
                if m.look(c):   # type: ignore[arg-type]
                    planner.dist[b] = torch.tensor(m.field(), dtype=torch.int64, device=sim.device)
                    replans += 1
        ep.step(planner.keys())
    return replans


def drive_scanner(ep: Episodes) -> int:
    """Run ``ep`` with the scanner (``models/world/maze/scanner.py``), looking every frame."""
    scanner = Scanner(ep.sim)
    while not ep.all_done:
        ep.step(scanner.keys())
        scanner.look()
    return scanner.replans


def drive_planner(ep: Episodes) -> None:
    planner = Planner(ep.sim)
    while not ep.all_done:
        ep.step(planner.keys())


def run(args: argparse.Namespace) -> dict[str, Any]:
    seeds = goal_seeds(0, args.mazes)
    per_kind: dict[str, Any] = {}
    for kind in GOAL_KINDS:
        row: dict[str, Any] = {}
        outcomes: dict[str, torch.Tensor] = {}
        for name in ("planner", *(f"explorer_{s}" for s in args.sight), "scanner"):
            t0 = time.perf_counter()
            ep = Episodes(seeds, kind, "cpu", budget=args.budget)
            extra: dict[str, Any] = {}
            if name == "planner":
                drive_planner(ep)
            elif name == "scanner":
                extra["replans"] = drive_scanner(ep)
            else:
                extra["replans"] = drive_explorer(ep, name.split("_", 1)[1])
            ok = ep.success.clone()
            outcomes[name] = ok
            frames = ep.frames[ok].float()
            row[name] = {"success": round(float(ok.float().mean()), 4),
                         "frames_to_goal_mean": round(float(frames.mean()), 1) if ok.any() else None,
                         "frames_to_goal_max": int(frames.max()) if ok.any() else None,
                         "seconds": round(time.perf_counter() - t0, 1), **extra}
            log(f"{kind:6s} {name:20s} success {row[name]['success']:.3f} "
                f"frames {row[name]['frames_to_goal_mean']} ({row[name]['seconds']} s)")
        planned = outcomes["planner"]
        for name, ok in outcomes.items():
            if name != "planner":
                row[name]["vs_planner"] = round(float(ok[planned].float().mean()) if planned.any() else 0.0, 4)
        per_kind[kind] = row
    return {
        "benchmark": "maze teachers without the map: success within the budget vs the planner",
        "command": " ".join(["python", "-m", "bench.maze.teacher_ceiling", *sys.argv[1:]]),
        "mazes_per_kind": args.mazes, "seeds": [seeds[0], seeds[-1]], "budget_frames": args.budget,
        "per_kind": per_kind,
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "cpu": platform.processor() or platform.machine(),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mazes", type=int, default=200, help="evaluation mazes per goal kind")
    ap.add_argument("--budget", type=int, default=BUDGET, help="frames per episode (the evaluation's)")
    ap.add_argument("--sight", nargs="+", choices=SIGHTS, default=list(SIGHTS))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    res = run(args)
    emit(res, args.out)


if __name__ == "__main__":
    main()
