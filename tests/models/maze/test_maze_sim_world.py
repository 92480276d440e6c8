"""models/maze/sim_world.py: the goal simulator served as a world (factory row maze-sim)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.factory import BuildOptions, FactoryError, build
from models.maze.goals import make_goals
from models.maze.planner import Planner, goal_sim
from models.maze.seen_map import MAP_POSE
from models.maze.sim import MazeSim, make_maze
from models.maze.sim_world import MazeSimWorld
from models.world.base import WorldTick
from protocols.world_v1 import KEY_NAMES
from tests.support.map_info import map_from_info

PROMPT = "go to the red wall"


def tick(sid: str, index: int, keys: list[frozenset[str]], prompt: str | None = PROMPT, seed: int = 3) -> WorldTick:
    return WorldTick(sid, f"{sid}:{index}", index, (), prompt, tuple(keys), seed=seed)


def keys_of(bits: torch.Tensor) -> frozenset[str]:
    return frozenset(k for k, b in zip(KEY_NAMES, bits.tolist()) if b > 0.5)


def reference(seed: int, kind: str, colour: str) -> MazeSim:
    """The simulator with the goal episode a prompt naming ``colour`` ``kind`` picks."""
    grid, start, _ = make_maze(seed)
    drawn = make_goals(seed, kind, grid, start)
    goal = drawn if drawn.colour == colour else make_goals(seed, kind, grid, start, colour)
    return MazeSim([seed], goals=[goal])


def test_frames_and_info_are_the_goal_simulators_and_the_planner_reaches_the_goal():
    world = MazeSimWorld()
    ref = reference(3, "wall", "red")
    planner = Planner(ref)
    first, = world.run_batch([tick("a", 0, [frozenset()])])
    world.end_tick("a", True)
    assert np.array_equal(first.frames[0], ref.render()[0].numpy())
    assert set(first.info.pop("map")) == {"pose", "cells"}
    assert first.info == {"x": float(ref.pos[0, 0]), "y": float(ref.pos[0, 1]), "yaw": float(ref.yaw[0]),
                          "pitch": 0, "goal": {"kind": "wall", "colour": "red",
                                               "cell": list(ref.goals[0].target_cell)}, "reached": False}
    for index in range(1, 200):
        keys = planner.keys()
        ref.step(keys)
        chunk, = world.run_batch([tick("a", index, [keys_of(keys[0])])])
        world.end_tick("a", True)
        assert np.array_equal(chunk.frames[0], ref.render()[0].numpy()), index
        assert chunk.info["yaw"] == float(ref.yaw[0]) and chunk.info["pitch"] == int(ref.pitch[0])
        assert chunk.info["reached"] == bool(ref.reached()[0])
        if chunk.info["reached"]:
            break
    assert chunk.info["reached"] is True and index > 4


def test_the_evaluations_prompt_shows_the_evaluations_episode():
    ep = goal_sim([0], "wall")
    world = MazeSimWorld()
    chunk, = world.run_batch([tick("f", 0, [frozenset()], prompt=ep.goals[0].prompt(), seed=0)])
    assert np.array_equal(chunk.frames[0], ep.render()[0].numpy())
    assert chunk.info["goal"]["cell"] == list(ep.goals[0].target_cell)
    other = next(c for c in ("red", "yellow", "blue") if c != ep.goals[0].colour)
    chunk, = world.run_batch([tick("g", 0, [frozenset()], prompt=f"go to the {other} wall", seed=0)])
    assert np.array_equal(chunk.frames[0], reference(0, "wall", other).render()[0].numpy())


def test_a_prompt_without_a_goal_is_the_goal_less_simulator_and_a_new_prompt_repaints():
    world = MazeSimWorld()
    chunk, = world.run_batch([tick("b", 0, [frozenset()], prompt=None, seed=5)])
    world.end_tick("b", True)
    assert np.array_equal(chunk.frames[0], MazeSim([5]).render()[0].numpy())
    assert set(chunk.info) == {"x", "y", "yaw", "pitch"}
    chunk, = world.run_batch([tick("b", 1, [frozenset("j")], prompt="find the blue marker", seed=5)])
    world.end_tick("b", True)
    ref = reference(5, "marker", "blue")
    ref.step(torch.tensor([[0, 0, 0, 0, 0, 1, 0, 0]], dtype=torch.float32))
    assert np.array_equal(chunk.frames[0], ref.render()[0].numpy())
    assert chunk.info["goal"]["colour"] == "blue" and chunk.info["yaw"] == float(ref.yaw[0])


def test_an_uncommitted_tick_and_a_failed_batch_leave_the_pose_as_it_was():
    world = MazeSimWorld(frames_per_chunk=2)
    world.run_batch([tick("c", 0, [frozenset(), frozenset("w")])])
    world.end_tick("c", True)
    first, = world.run_batch([tick("c", 1, [frozenset("w"), frozenset("l")])])
    world.end_tick("c", False)
    again, = world.run_batch([tick("c", 1, [frozenset("w"), frozenset("l")])])
    assert np.array_equal(first.frames, again.frames) and first.info == again.info
    world.end_tick("c", False)
    # A batch whose second tick cannot build its maze (a seed that is no int) fails whole;
    # the first session, stepped before it, is back where it was.
    with pytest.raises(ValueError, match="invalid literal"):
        world.run_batch([tick("c", 1, [frozenset("w"), frozenset("l")]), tick("d", 0, [frozenset()], seed="x")])
    third, = world.run_batch([tick("c", 1, [frozenset("w"), frozenset("l")])])
    assert np.array_equal(first.frames, third.frames) and first.info == third.info


def test_the_info_map_is_the_state_the_policy_episodes_build():
    from models.policy.maze.episodes import Episodes
    from models.policy.maze.model import KEYS_STATE
    from protocols.world_v1 import info_problem

    ep = Episodes([0], "wall", layout="map")
    planner = Planner(ep.sim)
    world = MazeSimWorld()
    sid, prompt = "m", ep.prompts()[0]
    chunk, = world.run_batch([tick(sid, 0, [frozenset()], prompt=prompt, seed=0)])
    world.end_tick(sid, True)
    at_start = int(map_from_info(chunk.info["map"])[MAP_POSE:].sum())
    for index in range(1, 60):
        want = ep.observe()[1][0, KEYS_STATE:].numpy()
        got = map_from_info(chunk.info["map"])
        assert got.dtype == np.float32 and np.array_equal(got, want), index
        assert info_problem(chunk.info) is None
        keys = planner.keys()
        # An uncommitted tick first: its corridors are unseen again afterwards.
        world.run_batch([tick(sid, index, [frozenset("w")], prompt=prompt, seed=0)])
        world.end_tick(sid, False)
        ep.step(keys)
        chunk, = world.run_batch([tick(sid, index, [keys_of(keys[0])], prompt=prompt, seed=0)])
        world.end_tick(sid, True)
        if ep.all_done:
            break
    assert int(map_from_info(chunk.info["map"])[MAP_POSE:].sum()) > at_start   # corridors seen on the way
    # Without a goal there is no map (the map marks goal objects).
    chunk, = world.run_batch([tick("n", 0, [frozenset()], prompt=None, seed=0)])
    assert "map" not in chunk.info


def test_admission_is_bounded_and_release_frees_it():
    world = MazeSimWorld(max_sessions=2)
    assert world.admit("x", {}) is None and world.admit("y", {}) is None and world.admit("x", {}) is None
    assert world.admit("z", {}) == "world maze-sim holds its limit of 2 sessions"
    world.drop_session("x")
    assert world.admit("z", {}) is None


def test_factory_row():
    world = build("maze-sim", BuildOptions(max_batch=3))
    assert (world.kind, world.name, world.max_batch, world.uses_prompts) == ("world", "maze-sim", 3, True)
    assert world.describe()["simulator"] is True
    with pytest.raises(FactoryError, match="takes no path"):
        build("maze-sim=/x")
