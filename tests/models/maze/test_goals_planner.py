"""Goals in the maze simulator and the planner: seeded placement, rendering, success, expert keys."""

import hashlib

import pytest
import torch

from models.maze.goals import (
    COLOUR_NAMES, GOAL_COLOURS, MAX_PATH, MIN_PATH, WALL_REACH, floor_distances, make_goals, parse_prompt, reached,
)
from models.maze.planner import UNREACHABLE, Planner, goal_seeds, goal_sim
from models.maze.sim import MazeSim, make_maze
from models.world.maze.training.data import render_trajectories


def test_without_goals_the_world_models_training_data_is_bit_identical():
    # Hashes taken from the simulator before goals existed (main at a810569).
    f, a = render_trajectories([5, 6, 7], 20, policy_seed=3, device="cpu")
    assert hashlib.sha256(f.numpy().tobytes()).hexdigest()[:16] == "fa582957e132810f"
    assert hashlib.sha256(a.numpy().tobytes()).hexdigest()[:16] == "f998da950ef26224"


def test_goal_placement_is_seeded_and_leaves_the_maze_alone():
    grid, start, yaw = make_maze(0)
    wall = make_goals(0, "wall", grid, start)
    marker = make_goals(0, "marker", grid, start)
    assert (wall.cells, wall.target, wall.prompt()) == (((2, 10), (2, 11), (6, 4)), 2, "go to the blue wall")
    assert (marker.cells, marker.target, marker.prompt()) == (((12, 4), (3, 9), (5, 9)), 1, "find the yellow marker")
    assert make_goals(0, "marker", grid, start) == marker
    assert make_maze(0) == (grid, start, yaw)
    # Walls are wall cells, markers floor cells; the target is MIN_PATH..MAX_PATH from the start.
    assert all(grid[y][x] for x, y in wall.cells) and not any(grid[y][x] for x, y in marker.cells)
    d = floor_distances(grid, [(int(start[0]), int(start[1]))])
    assert MIN_PATH <= d[marker.target_cell] <= MAX_PATH
    assert make_goals(0, "marker", grid, start, colour="red").colour == "red"
    with pytest.raises(ValueError, match="goal kind"):
        make_goals(0, "door", grid, start)


def test_goal_seeds_skip_a_walled_in_start():
    # Maze 2001339 starts in a pillar cell that an extra opening carved out: nothing to reach.
    grid, start, _ = make_maze(2001339)
    assert floor_distances(grid, [(int(start[0]), int(start[1]))]) == {(8, 10): 0}
    with pytest.raises(ValueError, match="no marker goal"):
        make_goals(2001339, "marker", grid, start)
    assert goal_seeds(2001338, 3) == [2001338, 2001340, 2001341]


def test_prompts_parse_back_to_their_goal():
    assert parse_prompt("go to the red wall") == ("wall", "red")
    assert parse_prompt("Find the YELLOW marker, please") == ("marker", "yellow")
    with pytest.raises(ValueError, match="names no goal"):
        parse_prompt("go to the green wall")


def test_reached_rules():
    assert reached("marker", (3, 4), 3.01, 4.99) and not reached("marker", (3, 4), 2.99, 4.5)
    # A wall cell (3, 4): within WALL_REACH of its square.
    assert reached("wall", (3, 4), 3.5, 4 - WALL_REACH + 0.01)
    assert not reached("wall", (3, 4), 3.5, 4 - WALL_REACH - 0.01)
    assert not reached("wall", (3, 4), 2.5 - WALL_REACH, 3.5)


def test_goals_show_in_the_render_in_goal_colours():
    sim = goal_sim([0, 1, 2, 3], "wall")
    plain = MazeSim([0, 1, 2, 3])
    planner = Planner(sim)
    goal_rgb = torch.tensor(list(GOAL_COLOURS.values()), dtype=torch.uint8)
    changed = exact = 0
    for t in range(60):
        sim.step(planner.keys())
        if t % 10 == 9:
            plain.set_state(sim.state())
            a, b = sim.render(), plain.render()
            diff = (a != b).any(-1)
            changed += int(diff.sum())
            # Beacons are drawn in the exact goal colours.
            exact += int((a[diff][:, None] == goal_rgb[None]).all(-1).any(-1).sum())
    assert changed > 0 and exact > 0
    # With the cameras where the goal-less sim has them, the goal-less render is unchanged.


def test_planner_solves_every_maze_and_never_sees_through_walls():
    for kind in ("wall", "marker"):
        seeds = goal_seeds(100, 24)
        sim = goal_sim(seeds, kind)
        planner = Planner(sim)
        assert int(planner.dist.max()) == UNREACHABLE  # walls
        done = torch.zeros(len(seeds), dtype=torch.bool)
        for _ in range(200):
            done |= sim.reached()
            sim.step(planner.keys())
        assert bool(done.all()), kind


def test_sim_without_goals_refuses_goal_questions():
    with pytest.raises(ValueError, match="no goals"):
        MazeSim([0]).reached()
    with pytest.raises(ValueError, match="one GoalEpisode per maze"):
        grid, start, _ = make_maze(1)
        MazeSim([0], goals=[make_goals(1, "wall", grid, start)])
    assert len(COLOUR_NAMES) == 3
