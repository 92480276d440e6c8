"""The maze simulator as a robot: ``python -m models.policy.maze.robot --url ws://HOST:PORT/v1/realtime/robot/openpi``.

Each episode is one goal episode in ``MazeSim`` (``episodes.py``). Every frame
the robot builds the observation a real robot would (its camera, its state
vector, the prompt) and asks ``openpi-client``'s ``ActionChunkBroker`` for the
frame's keys: the broker sends one observation every ``execute_horizon`` frames
(the server's metadata says how many) over ``WebsocketClientPolicy`` and hands
out the chunk's rows in between. It reports success and frames per episode.
The state follows the server's ``state_layout`` (``model.py``; the ``memory``
layout's odometry and visit counts are the robot's own, kept by ``Episodes``).

Why it lives here and not in ``clients/``: the robot side is the simulator,
which is torch and lives in ``models/``; ``clients/`` depends on ``protocols``
only. The wire side is the unmodified ``openpi-client``, exactly what a robot
would run.

Each observation also carries the OpenPI extension ``sampling_params.seed``
(``call_seed``: episode seed and call number), so a run is reproducible and
equals the in-process evaluation (``evaluate.drive_policy``) of the same episode.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
try:
    from openpi_client.action_chunk_broker import ActionChunkBroker
    from openpi_client.websocket_client_policy import WebsocketClientPolicy
except ImportError as exc:  # the robot side's one extra dependency
    if __name__ == "__main__":
        raise SystemExit("the robot needs openpi-client: pip install -e '.[robot]'") from exc
    raise

from models.maze.goals import GOAL_KINDS
from models.maze.planner import goal_seeds
from models.policy.maze.episodes import BUDGET, Episodes, call_seed
from models.policy.maze.model import IMAGE_KEY, STATE_LAYOUTS
from protocols.world_v1 import KEY_NAMES

log = logging.getLogger("models.policy.maze.robot")


@dataclass(frozen=True)
class EpisodeReport:
    seed: int
    kind: str
    prompt: str
    success: bool
    frames: int
    policy_calls: int
    seconds: float
    pose: tuple[float, float, float]  # final x, y, yaw


class _Counting:
    """Counts the broker's calls to the server and stamps each with its seed."""

    def __init__(self, policy: WebsocketClientPolicy, seed: int) -> None:
        self.policy, self.seed, self.calls = policy, seed, 0

    def infer(self, obs: dict) -> dict:
        obs = {**obs, "sampling_params": {"seed": call_seed(self.seed, self.calls)}}
        self.calls += 1
        return self.policy.infer(obs)

    def reset(self) -> None:
        self.calls = 0


def check_metadata(meta: dict[str, Any]) -> int:
    """The server's ``execute_horizon``, after checking it serves maze key chunks."""
    if meta.get("action_keys") != "".join(KEY_NAMES) or meta.get("action_dim") != len(KEY_NAMES):
        raise RuntimeError(f"the server's policy does not drive the maze (metadata {meta!r:.300})")
    if list(meta.get("image_keys", [])) != [IMAGE_KEY] or list(meta.get("image_resolution", [])) != [64, 64]:
        raise RuntimeError(f"the server's policy wants cameras {meta.get('image_keys')} at "
                           f"{meta.get('image_resolution')}, the maze has one 64x64 camera {IMAGE_KEY!r}")
    return int(meta.get("execute_horizon", meta["action_horizon"]))


def state_layout(meta: dict[str, Any]) -> str:
    """The state layout the server's policy reads (``model.py``); servers that predate the key read ``keys``."""
    layout = str(meta.get("state_layout", "keys"))
    if STATE_LAYOUTS.get(layout) != meta.get("state_dim"):
        raise RuntimeError(f"the server's policy reads a {meta.get('state_dim')}-float state in layout {layout!r}; "
                           f"this robot builds {STATE_LAYOUTS}")
    return layout


def run_episode(policy: WebsocketClientPolicy, seed: int, kind: str, budget: int = BUDGET) -> EpisodeReport:
    """One episode through the server; the connection is reused across episodes."""
    meta = policy.get_server_metadata()
    horizon = check_metadata(meta)
    started = time.perf_counter()
    ep = Episodes([seed], kind, "cpu", budget, state_layout(meta))
    prompt = ep.prompts()[0]
    counting = _Counting(policy, seed)
    broker = ActionChunkBroker(counting, action_horizon=horizon)  # type: ignore[arg-type]
    broker.reset()
    while not ep.all_done:
        image, state = ep.observe()
        obs = {IMAGE_KEY: image[0].numpy(), "state": state[0].numpy(), "prompt": prompt}
        keys = np.asarray(broker.infer(obs)["actions"], np.float32)
        ep.step(_keys_tensor(keys))
    pose = (float(ep.sim.pos[0, 0]), float(ep.sim.pos[0, 1]), float(ep.sim.yaw[0]))
    report = EpisodeReport(seed, kind, prompt, bool(ep.success[0]), int(ep.frames[0]), counting.calls,
                           round(time.perf_counter() - started, 3), pose)
    log.info("episode seed=%d kind=%s %s in %d frames (%d calls)", seed, kind,
             "reached" if report.success else "missed", report.frames, report.policy_calls)
    return report


def _keys_tensor(keys: np.ndarray) -> torch.Tensor:
    return torch.from_numpy((keys > 0.5).astype(np.float32))[None]


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime/robot/openpi")
    ap.add_argument("--episodes", type=_count, default=4, help="per goal kind")
    ap.add_argument("--kind", choices=[*GOAL_KINDS, "both"], default="both")
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--budget", type=int, default=BUDGET)
    ap.add_argument("--out", default=None, help="write the reports as JSON")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    try:
        policy = WebsocketClientPolicy(host=args.url)
    except OSError as exc:  # openpi-client waits for a server that refuses, not for no listener
        print(f"cannot talk to {args.url}: {exc}", file=sys.stderr)
        return 2
    kinds = GOAL_KINDS if args.kind == "both" else (args.kind,)
    started = time.perf_counter()
    reports = [run_episode(policy, s, k, args.budget) for k in kinds for s in goal_seeds(args.seed0, args.episodes)]
    wall = time.perf_counter() - started
    summary = {"benchmark": "maze_robot_closed_loop",
               "command": "python -m models.policy.maze.robot " + " ".join(sys.argv[1:] if argv is None else argv),
               "policy": {k: policy.get_server_metadata().get(k) for k in ("policy", "state_layout", "state_dim")},
               "episodes": len(reports), "success": sum(r.success for r in reports) / max(len(reports), 1),
               "episodes_per_s": round(len(reports) / wall, 3), "seconds": round(wall, 2),
               "hardware": {"cpu_cores": os.cpu_count()},
               "versions": {"python": platform.python_version(), "torch": torch.__version__},
               "reports": [asdict(r) for r in reports]}
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
