"""A fleet of robots, each its own process with the real ``openpi-client``, for bench_pi0.

    python -m bench.pi0.robots --uri ws://127.0.0.1:PORT/v1/realtime/robot/openpi --robots 8 \
        --seconds 3 --cameras a,b,c --size 224 --state 32

Each robot connects, does ``--warmup`` calls, waits for the others, then calls as
fast as it is answered for ``--seconds`` (at most ``--max-calls``). Prints one JSON
line: calls/s in total and per-call latency percentiles (ms, client side: pack,
send, wait, receive, unpack). Imports no torch, so it can fork.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from typing import Any

import numpy as np


def make_obs(seed: int, cameras: list[str], size: int, state: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    obs: dict[str, Any] = {k: rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for k in cameras}
    obs["state"] = rng.standard_normal(state).astype(np.float32)
    obs["prompt"] = "pick up the red block"
    return obs


def _robot(args: argparse.Namespace, idx: int, barrier: Any, queue: Any) -> None:
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    robot = WebsocketClientPolicy(host=args.uri)
    obs = make_obs(idx, args.cameras.split(","), args.size, args.state)
    for _ in range(args.warmup):
        robot.infer(obs)
    barrier.wait()
    lat: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds and len(lat) < args.max_calls:
        t = time.perf_counter()
        robot.infer(obs)
        lat.append((time.perf_counter() - t) * 1000.0)
    wall = time.perf_counter() - start
    from openpi_client import msgpack_numpy

    pack = []
    for _ in range(20):  # the client's own share of a call: packing the observation
        t = time.perf_counter()
        msgpack_numpy.packb(obs)
        pack.append((time.perf_counter() - t) * 1000.0)
    queue.put((lat, wall, pack))


def pct(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs, dtype=np.float64)
    if a.size == 0:
        return {"n": 0}
    return {"n": int(a.size), "mean": round(float(a.mean()), 3), "p50": round(float(np.percentile(a, 50)), 3),
            "p90": round(float(np.percentile(a, 90)), 3), "p99": round(float(np.percentile(a, 99)), 3),
            "max": round(float(a.max()), 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--uri", required=True)
    ap.add_argument("--robots", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--max-calls", type=int, default=5000)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--cameras", default="cam")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--state", type=int, default=32)
    args = ap.parse_args()
    ctx = mp.get_context("fork")
    barrier, queue = ctx.Barrier(args.robots), ctx.Queue()
    procs = [ctx.Process(target=_robot, args=(args, i, barrier, queue)) for i in range(args.robots)]
    for p in procs:
        p.start()
    got = [queue.get(timeout=args.seconds + 300) for _ in procs]
    for p in procs:
        p.join(30)
    lat = [x for g in got for x in g[0]]
    wall = max(g[1] for g in got)
    pack = [x for g in got for x in g[2]]
    print(json.dumps({"robots": args.robots, "calls": len(lat), "seconds": round(wall, 3),
                      "calls_per_s": round(len(lat) / wall, 2), "latency_ms": pct(lat),
                      "client_pack_ms": pct(pack)}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
