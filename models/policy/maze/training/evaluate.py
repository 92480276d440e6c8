"""Evaluate the maze policy: ``python -m models.policy.maze.training.evaluate [--mazes 200] [--out JSON]``.

For each goal kind, ``--mazes`` unseen mazes (seeds ``EVAL_SEED0``..; training
uses ``TRAIN_SEED0`` upwards) are run with three drivers from the same starts:

* ``planner``: the shortest-path expert on the true map (the ceiling);
* ``random``:  the world model's scripted data policy (sticky random key
               combinations, forward-biased), for the floor;
* ``policy``:  the served adapter (``MazePolicy.infer_batch``, the code a robot
               reaches over OpenPI), observed every ``execute_horizon`` frames,
               each call seeded by (maze, call number) as the robot does.

Success: the target reached (``goals.py``) within ``BUDGET`` frames. The
headline is ``policy_vs_planner``: the share of the episodes the planner
solves that the policy solves too (goal >= 0.8).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from models.maze.goals import GOAL_KINDS
from models.maze.planner import Planner, goal_seeds
from models.maze.training.scripted import ScriptedPolicy
from models.policy.base import PolicyWork
from models.policy.maze.adapter import MazePolicy
from models.policy.maze.episodes import BUDGET, Episodes, call_seed
from models.policy.maze.model import EXECUTE, IMAGE_KEY
from protocols.openpi import Observation, SamplingParams

EVAL_SEED0 = 0


def drive_planner(ep: Episodes) -> None:
    planner = Planner(ep.sim)
    while not ep.all_done:
        ep.step(planner.keys())


def drive_random(ep: Episodes, seed: int = 0) -> None:
    pol = ScriptedPolicy(ep.sim.batch, seed, ep.sim.device)
    while not ep.all_done:
        ep.step(pol.next())


def drive_policy(ep: Episodes, policy: MazePolicy, execute: int = EXECUTE, fixed_noise: bool = False) -> int:
    """Run ``ep`` with ``policy``; returns the number of policy calls (observations) made.

    ``fixed_noise``: every call of an episode uses the episode's first seed (the
    same noise each time), instead of a new seed per call.
    """
    if ep.layout != policy.state_layout:
        raise ValueError(f"episodes build the {ep.layout!r} state, the policy reads {policy.state_layout!r}")
    prompts = ep.prompts()
    calls = 0
    call_no = 0
    while not ep.all_done:
        images, state = ep.observe()
        images, state = images.cpu().numpy(), state.cpu().numpy()
        live = np.flatnonzero(~ep.done.cpu().numpy())
        chunk = np.zeros((ep.sim.batch, policy.metadata.action_horizon, 8), np.float32)
        for lo in range(0, len(live), policy.max_batch):
            rows = live[lo:lo + policy.max_batch]
            works = [PolicyWork(f"eval-{i}", f"r{call_no}", Observation({IMAGE_KEY: images[i]}, state[i], prompts[i]),
                                SamplingParams(seed=call_seed(ep.sim.seeds[i], 0 if fixed_noise else call_no)))
                     for i in rows]
            for i, out in zip(rows, policy.run_batch(works)):
                chunk[i] = out.actions
            calls += len(rows)
        ep.execute(torch.from_numpy(chunk[:, :execute]))
        call_no += 1
    return calls


def summarise(ep: Episodes) -> dict:
    ok = ep.success.cpu()
    frames = ep.frames.cpu()
    return {"success": round(float(ok.float().mean()), 4), "solved": int(ok.sum()), "episodes": len(ok),
            "mean_frames_when_solved": round(float(frames[ok].float().mean()), 1) if ok.any() else None,
            "_ok": ok.tolist()}


def evaluate(policy: MazePolicy, mazes: int, device: str, seed0: int = EVAL_SEED0, budget: int = BUDGET,
             log: Callable[[str], None] = print, execute: int = EXECUTE, fixed_noise: bool = False) -> dict:
    seeds = goal_seeds(seed0, mazes)
    results: dict = {}
    for kind in GOAL_KINDS:
        row: dict = {}
        for name in ("planner", "random", "policy"):
            started = time.perf_counter()
            # Only the policy reads a state; the others skip the memory layout's bookkeeping.
            ep = Episodes(seeds, kind, device, budget, policy.state_layout if name == "policy" else "keys")
            if name == "planner":
                drive_planner(ep)
            elif name == "random":
                drive_random(ep)
            else:
                row["policy_calls"] = drive_policy(ep, policy, execute, fixed_noise)
            row[name] = summarise(ep)
            row[name]["seconds"] = round(time.perf_counter() - started, 1)
            log(f"{kind:6s} {name:8s} success {row[name]['success']:.3f} ({row[name]['seconds']} s)")
        planned = np.array(row["planner"].pop("_ok"))
        mine = np.array(row["policy"].pop("_ok"))
        row["random"].pop("_ok")
        row["policy_vs_planner"] = round(float(mine[planned].mean()) if planned.any() else 0.0, 4)
        results[kind] = row
    both = [results[k]["policy_vs_planner"] for k in GOAL_KINDS]
    return {"per_kind": results, "policy_vs_planner_mean": round(float(np.mean(both)), 4), "goal": 0.8,
            "mazes_per_kind": mazes, "seeds": [seeds[0], seeds[-1]], "budget_frames": budget,
            "execute_horizon": execute, "fixed_noise": fixed_noise, "num_inference_steps": policy.cfg.num_inference_steps,
            "state_layout": policy.state_layout}


VALIDATION_SEED0 = 10_000


def sweep(policy: MazePolicy, mazes: int, device: str, budget: int) -> tuple[list[dict], dict]:
    """Execute horizons x noise modes on validation mazes; returns the table and the best setting."""
    table = []
    for execute in (2, 4, 8):
        for fixed in (False, True):
            r = evaluate(policy, mazes, device, VALIDATION_SEED0, budget, log=lambda _: None, execute=execute,
                         fixed_noise=fixed)
            table.append({"execute_horizon": execute, "fixed_noise": fixed,
                          "policy_vs_planner_mean": r["policy_vs_planner_mean"]})
            print(table[-1], flush=True)
    best = max(table, key=lambda row: row["policy_vs_planner_mean"])
    return table, best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default=None)
    ap.add_argument("--mazes", type=int, default=200)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budget", type=int, default=BUDGET)
    ap.add_argument("--seed0", type=int, default=EVAL_SEED0, help="first maze seed (validation: another range)")
    ap.add_argument("--execute", type=int, default=EXECUTE, help="frames of each chunk executed")
    ap.add_argument("--fixed-noise", action="store_true", help="one noise seed per episode")
    ap.add_argument("--steps", type=int, default=None, help="Euler steps (default: the trained 10)")
    ap.add_argument("--sweep", type=int, default=0, metavar="MAZES",
                    help="first pick --execute / --fixed-noise on MAZES validation mazes (seeds from 10000)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    policy = MazePolicy(args.weights, device=args.device, max_batch=256, num_inference_steps=args.steps)
    t0 = time.perf_counter()
    table: list[dict] = []
    if args.sweep:
        table, best = sweep(policy, args.sweep, args.device, args.budget)
        args.execute, args.fixed_noise = best["execute_horizon"], best["fixed_noise"]
    res = evaluate(policy, args.mazes, args.device, args.seed0, args.budget, execute=args.execute,
                   fixed_noise=args.fixed_noise)
    if table:
        res["validation_sweep"] = {"mazes_per_kind": args.sweep, "seed0": VALIDATION_SEED0, "rows": table}
    res.update({
        "weights": str(policy.weights.name), "device": args.device, "seconds": round(time.perf_counter() - t0, 1),
        "command": "python -m models.policy.maze.training.evaluate " + " ".join(sys.argv[1:] if argv is None else argv),
        "hardware": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu",
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
    })
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
