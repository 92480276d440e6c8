"""DROID robots for ``bench/policy/bench_dreamzero.py``: the observation a robot sends (the same
for a given robot and call, wherever it is made) and N robots driven at once through the real
``openpi_client.websocket_client_policy.WebsocketClientPolicy``.

numpy and openpi-client only: the served sections run ``drive`` in a process of its own, so
the clients' packing and the server's engine do not share one interpreter.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Sequence

import numpy as np

PROMPT = "put the marker in the cup"
# A call after the first sends the last 4 frames of each camera, as DreamZero's DROID client does.
FRAMES_PER_CALL = 4


def droid_obs(robot: int, call: int, image_keys: Sequence[str], resolution: tuple[int, int],
              session_id: str | None = None, seed: int = 0) -> dict[str, Any]:
    """Call ``call`` of robot ``robot``: uint8 cameras (one frame on the first call, then
    ``[4, H, W, 3]``), 7 joint positions, the gripper, the prompt, and ``session_id``."""
    rng = np.random.default_rng([seed, robot, call])
    h, w = resolution
    shape = (h, w, 3) if call == 0 else (FRAMES_PER_CALL, h, w, 3)
    obs: dict[str, Any] = {k: rng.integers(0, 256, shape, dtype=np.uint8) for k in image_keys}
    obs["observation/joint_position"] = rng.uniform(-1.0, 1.0, 7)
    obs["observation/gripper_position"] = rng.uniform(0.0, 1.0, 1)
    obs["prompt"] = PROMPT
    if session_id is not None:
        obs["session_id"] = session_id
    return obs


def session_id(robot: int, tag: str) -> str:
    return f"{tag}-robot-{robot}"


def drive(url: str, robots: int, calls: int, image_keys: Sequence[str], resolution: tuple[int, int],
          tag: str = "served", seed: int = 0) -> list[dict[str, Any]]:
    """``robots`` clients (one thread and one connection each) make ``calls`` calls each, all
    starting together; per robot its session id, each call's latency (send to reply, ms),
    the server's handshake and the chunks it got."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    clients = [WebsocketClientPolicy(host=url) for _ in range(robots)]
    barrier = threading.Barrier(robots)
    out: list[dict[str, Any]] = [{} for _ in range(robots)]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        sid = session_id(i, tag)
        latency, actions, t_reply = [], [], []
        try:
            barrier.wait()
            for call in range(calls):
                obs = droid_obs(i, call, image_keys, resolution, sid, seed)
                t0 = time.perf_counter()
                reply = clients[i].infer(obs)
                t1 = time.perf_counter()
                latency.append(1e3 * (t1 - t0))
                t_reply.append(t1)
                actions.append(np.asarray(reply["actions"]))
        except BaseException as e:     # reported to the caller with the robot's id
            errors.append(RuntimeError(f"robot {sid}: {type(e).__name__}: {e}"))
            barrier.abort()
        out[i] = {"session_id": sid, "latency_ms": latency, "t_reply": t_reply, "actions": actions}

    threads = [threading.Thread(target=run, args=(i,)) for i in range(robots)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    metadata = clients[0].get_server_metadata()
    for c in clients:
        c._ws.close()
    if errors:
        raise errors[0]
    for o in out:
        o["server_metadata"] = {k: metadata.get(k) for k in ("policy", "action_horizon", "action_dim",
                                                             "needs_session_id", "image_resolution")}
    return out
