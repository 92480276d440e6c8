"""bench/maze/policy_dream.py through a real server: the maze policy drives a (tiny, random-weight) maze
world over world.v1, and the episode is judged in the simulator."""

from __future__ import annotations

import asyncio

import torch
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from bench.maze.policy_dream import dream_episode
from models.policy.maze.adapter import MazePolicy
from models.world.maze.adapter import MazeWorld
from models.world.maze.model import MazeDiT, MazeDiTConfig
from models.world.maze.weights import save_weights
from realtime.server.app import build_app
from realtime.server.config import PolicyConfig, ServerConfig, TTSConfig, WorldConfig
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve
from tests.e2e.test_openpi_ws import PATH


def test_policy_drives_the_world_model_and_is_judged_in_the_simulator(tmp_path):
    torch.manual_seed(0)
    weights = tmp_path / "tiny_world.safetensors"
    save_weights(MazeDiT(MazeDiTConfig(dim=64, depth=2, heads=1)), weights, extra={"steps": 0})
    world = MazeWorld(weights=weights, max_sessions=2, max_batch=2)
    policy = MazePolicy(max_batch=2)
    inventory = Inventory()
    inventory.adapters[world.name] = world
    inventory.adapters[policy.name] = policy
    config = ServerConfig(world=WorldConfig(models=(world.name,)), policy=PolicyConfig(policy=""),
                          tts=TTSConfig(enabled=False))
    with serve(build_app(config, inventory)) as addr:
        robot = WebsocketClientPolicy(host=f"ws://{addr}{PATH}")
        row = asyncio.run(dream_episode(f"ws://{addr}", robot, 3, "marker", 8, "dream-test"))
    # Frame 0 is the (goal-less) simulator's first frame; 8 frames = 2 policy calls.
    assert row["first_frame_equals_simulator"] is True
    assert (row["frames"], row["policy_calls"], row["kind"], row["seed"]) == (8, 2, "marker", 3)
    assert row["success"] is False and row["prompt"].endswith("marker")
