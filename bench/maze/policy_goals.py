"""Which goal object the maze policy reaches: its target, or a distractor of another colour (issue 18).

Each evaluation episode holds three goal objects of its kind, one per colour; the prompt names
one. Success counts the target only, so a policy that walks to goal objects without telling
their colours apart scores a third of what it reaches. This drives the evaluation's episodes
(``goal_seeds(0, N)``, the same budget, noise and execute horizon as ``evaluate.py``) with the
served policy and records, per episode, every goal object the camera reached on the way::

    python -m bench.maze.policy_goals --mazes 60 --out bench/results/maze_policy_goals_cpu.json
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from typing import Any

import torch

from bench.report import emit
from models.policy.maze.adapter import MazePolicy
from models.policy.maze.episodes import Episodes
from models.policy.maze.evaluate import drive_policy
from models.world.maze.goals import COLOUR_NAMES, GOAL_KINDS
from models.world.maze.planner import goal_seeds


class GoalTracks(Episodes):
    """Episodes that also note every goal object (target and distractors) each camera reached."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.touched = torch.zeros(self.sim.batch, len(COLOUR_NAMES), dtype=torch.bool, device=self.sim.device)

    def step(self, keys: torch.Tensor, camera: torch.Tensor | None = None) -> None:
        live = ~self.done
        super().step(keys, camera)
        self.touched |= self.sim.reached_objects() & live[:, None]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mazes", type=int, default=60)
    ap.add_argument("--weights", default=None, help="default: the shipped weights")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    policy = MazePolicy(args.weights, device=args.device, max_batch=256)
    seeds = goal_seeds(0, args.mazes)
    rows: dict[str, Any] = {}
    for kind in GOAL_KINDS:
        t0 = time.perf_counter()
        ep = GoalTracks(seeds, kind, args.device, layout=policy.state_layout)
        drive_policy(ep, policy)
        b = torch.arange(len(seeds))
        touched = ep.touched.cpu()
        target = touched[b, ep.sim.goal_target.cpu()]
        others = touched.clone()
        others[b, ep.sim.goal_target.cpu()] = False
        rows[kind] = {"success": round(float(ep.success.float().mean()), 4),
                      "reached_target": round(float(target.float().mean()), 4),
                      "reached_a_distractor": round(float(others.any(1).float().mean()), 4),
                      "reached_any_goal_object": round(float(touched.any(1).float().mean()), 4),
                      "seconds": round(time.perf_counter() - t0, 1)}
        print(f"[policy_goals] {kind}: {rows[kind]}", file=sys.stderr, flush=True)
    res = {"benchmark": "maze policy: target vs distractor goal objects reached",
           "command": " ".join(["python", "-m", "bench.maze.policy_goals", *sys.argv[1:]]),
           "mazes_per_kind": args.mazes, "weights": str(policy.weights.name), "per_kind": rows,
           "versions": {"python": platform.python_version(), "torch": torch.__version__},
           "cpu": platform.processor() or platform.machine()}
    emit(res, args.out)


if __name__ == "__main__":
    main()
