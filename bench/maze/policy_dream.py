"""Dreaming: the maze policy drives the maze *world model* instead of the simulator.

    python -m bench.maze.policy_dream --server ws://127.0.0.1:8000 --episodes 2 --budget 120 \
        --out bench/results/maze_policy_dream_cpu.json

(a server started with ``python -m realtime serve --models maze --policy maze-policy``).

Per episode: a world.v1 session on maze ``seed`` (its frame 0 is the simulator's
first frame of that maze; every later frame is generated) and an openpi-client
connection to the policy. The world's frames are the policy's camera; each
frame's keys become a keys.v1 ``state`` event, then one credit asks for the
next frame, so frame t+1 is made with exactly the keys chosen for it.

How success is judged in the dream: the executed keys are re-simulated, in
lockstep, in the true goal simulator from the same start (``Episodes``); the
episode succeeds if that re-simulation reaches the target within the budget.
The same re-simulation gives the policy's state vector (heading, pitch, last
keys, and for the ``memory`` layout the odometry and visit counts), which
depends only on the keys pressed; for the ``map`` layout (the shipped weights)
the map as seen is the true maze's along those keys (the robot's range sensor
and beacon bearings in the real maze), so in the dream only the camera is
the world model's. The simulator baseline drives
the same policy, same seeds and budget, from the simulator's own frames
(``evaluate.drive_policy``).

Expected gap: the world model was trained on goal-less mazes, so its frames
never show the goal walls, markers or beacons; the dream tests how the policy
behaves on the learned world's pictures, not whether that world can show goals.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time

import numpy as np
import torch
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from clients.world import WorldClient
from bench.report import emit
from models.maze.goals import GOAL_KINDS
from models.maze.planner import goal_seeds
from models.maze.sim import MazeSim
from models.policy.maze.adapter import MazePolicy
from models.policy.maze.episodes import Episodes, call_seed
from models.policy.maze.model import IMAGE_KEY
from models.policy.maze.robot import check_metadata, state_layout
from models.policy.maze.training.evaluate import drive_policy
from protocols.world_v1 import KEY_NAMES


async def dream_episode(server: str, robot: WebsocketClientPolicy, seed: int, kind: str, budget: int,
                        session: str) -> dict:
    meta = robot.get_server_metadata()
    horizon = check_metadata(meta)
    shadow = Episodes([seed], kind, "cpu", budget, state_layout(meta))
    prompt = shadow.prompts()[0]
    started = time.perf_counter()
    calls = 0
    async with WorldClient.connect(f"{server}/v1/realtime/world") as world:
        await world.create(session, model="maze", seed=seed, credits=1, format="rgb8")
        frame = (await world.next_chunk(credit=False)).frames()[0]
        # The world starts from the goal-less simulator's first frame of this maze.
        first_equal = bool(np.array_equal(frame, MazeSim([seed]).render()[0].numpy()))
        # The policy's memory (the memory layout's sky panorama) holds what it saw: the dream's frames.
        shadow.see_first(torch.from_numpy(np.array(frame))[None])
        while not shadow.all_done:
            _, state = shadow.observe()
            obs = {IMAGE_KEY: np.ascontiguousarray(frame), "state": state[0].numpy(), "prompt": prompt,
                   "sampling_params": {"seed": call_seed(seed, calls)}}
            chunk = np.asarray(robot.infer(obs)["actions"], np.float32)
            calls += 1
            for keys in chunk[:horizon]:
                if shadow.all_done:
                    break
                await world.hold_keys([k for k, b in zip(KEY_NAMES, keys) if b > 0.5])
                await world.credit(1)
                frame = (await world.next_chunk(credit=False)).frames()[0]
                shadow.step(torch.from_numpy((keys > 0.5).astype(np.float32))[None],
                            camera=torch.from_numpy(np.array(frame))[None])
        await world.close()
    return {"seed": seed, "kind": kind, "prompt": prompt, "success": bool(shadow.success[0]),
            "frames": int(shadow.frames[0]), "policy_calls": calls, "first_frame_equals_simulator": first_equal,
            "seconds": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="ws://127.0.0.1:8000")
    ap.add_argument("--episodes", type=int, default=2, help="per goal kind")
    ap.add_argument("--budget", type=int, default=120)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    robot = WebsocketClientPolicy(host=f"{args.server}/v1/realtime/robot/openpi")
    seeds = goal_seeds(args.seed0, args.episodes)
    reference = MazePolicy(max_batch=1)
    rows = []
    for kind in GOAL_KINDS:
        for seed in seeds:
            dream = asyncio.run(dream_episode(args.server, robot, seed, kind, args.budget, f"dream-{kind}-{seed}"))
            ep = Episodes([seed], kind, "cpu", args.budget, reference.state_layout)
            drive_policy(ep, reference)
            dream["simulator_success"] = bool(ep.success[0])
            dream["simulator_frames"] = int(ep.frames[0])
            rows.append(dream)
            print(json.dumps(dream), file=sys.stderr, flush=True)
    report = {
        "benchmark": "maze_policy_dream",
        "command": "python -m bench.maze.policy_dream " + " ".join(sys.argv[1:] if argv is None else argv),
        "success_judged_by": "the executed keys re-simulated in the true goal simulator from the same start",
        "budget_frames": args.budget,
        "dream_success": sum(r["success"] for r in rows) / len(rows),
        "simulator_success": sum(r["simulator_success"] for r in rows) / len(rows),
        "episodes": rows,
        "hardware": {"cpu": platform.processor() or platform.machine()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
    }
    emit(report, args.out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
