"""The scanner teacher (models/maze/scanner.py) against the per-maze Python reference in
tests/support/known_map.py: the same cells seen, the same distances over the map as seen."""

from __future__ import annotations

import torch

from models.maze.planner import Planner, goal_seeds
from models.maze.scanner import Scanner, beacon_in_view, corridor_view, known_distances
from models.maze.sim import KL
from models.policy.maze.episodes import Episodes
from tests.support.known_map import KnownMap


def test_corridor_view_stops_at_the_first_wall_each_way():
    grid = torch.tensor([[[0, 0, 1, 0, 0],
                          [1, 0, 1, 0, 1],
                          [0, 0, 0, 0, 0],
                          [0, 1, 0, 1, 0],
                          [0, 0, 0, 0, 0]]])
    seen = corridor_view(grid, torch.tensor([[1, 2]]))   # x=1, y=2
    want = torch.zeros(1, 5, 5, dtype=torch.bool)
    for x, y in [(0, 2), (1, 2), (2, 2), (3, 2), (4, 2),     # the whole row 2 is open
                 (1, 1), (1, 0), (1, 3)]:                     # up to the edge; down to the wall at y=3
        want[0, y, x] = True
    assert torch.equal(seen, want)


def test_known_distances_is_a_breadth_first_search_over_floor():
    known = torch.tensor([[[0, 0, 0],
                           [1, 1, 0],
                           [0, 0, 0]]])
    src = torch.zeros(1, 3, 3, dtype=torch.bool)
    src[0, 2, 0] = True
    d = known_distances(known, src)
    assert d.tolist() == [[[6, 5, 4], [10_000, 10_000, 3], [0, 1, 2]]]


def test_the_scanner_sees_and_plans_as_the_per_maze_reference():
    seeds = goal_seeds(0, 4)
    for kind in ("wall", "marker"):
        ep = Episodes(seeds, kind, "cpu")
        scanner = Scanner(ep.sim)
        maps = [KnownMap(g, goal, "corridors") for g, goal in zip(ep.sim.grid.tolist(), ep.sim.goals)]
        for frame in range(40):
            cells = ep.sim.pos.floor().long().tolist()
            for m, c in zip(maps, cells):
                m.look(tuple(c))
            for b, m in enumerate(maps):
                assert {(x, y) for y, x in scanner.seen[b].nonzero().tolist()} == m.seen
                assert scanner.planner.dist[b].tolist() == m.field(), (kind, frame, b)
            ep.step(scanner.keys())
            scanner.look()


def test_it_turns_until_the_beacon_was_in_view_then_steers_like_the_planner():
    ep = Episodes(goal_seeds(0, 16), "marker", "cpu")
    scanner = Scanner(ep.sim)
    keys = scanner.keys()
    looking = ~beacon_in_view(ep.sim)
    assert looking.any() and (~looking).any()      # some start facing their target, some not
    assert (keys[looking, KL] == 1).all() and (keys[looking].sum(1) == 1).all()
    steer = Planner(ep.sim, scanner.planner.dist).keys()
    assert torch.equal(keys[~looking], steer[~looking])
