"""The default OpenPI policy on one GPU: robots batched by the engine vs one at a time.

An in-process benchmark (no HTTP server: the GPU box has torch, numpy and msgpack
but not starlette/uvicorn). Each robot is an asyncio task doing what the endpoint
does per call, minus the socket: decode + validate the packed observation
(``protocols.openpi``), ``await engine.submit`` on the real engine thread, build
and pack the reply. Robots loop as fast as they are answered.

For 1, 8 and 32 robots it measures calls/s in total and p50/p99 per call with

* ``batched``: the policy with ``max_batch=32`` on the engine as committed
  (it waits, at most ``--batch-wait-ms`` after a batch ended, only for that
  batch's robots to queue again: ``config.policy.batch_wait_ms``, default 20);
* ``one-at-a-time``: the same policy with ``max_batch=1`` (what the reference
  server does: one forward per robot, one after the other),

all in the same run, plus the bare forward time at each batch size.

    python -m bench.openpi.bench_gpu_policy --device cuda --robots 1 8 32 --seconds 3 \
        --out bench/results/openpi_gpu_h200.json

(at most 6 x (2 s warm-up + 3 s) of fleets plus the bare forwards and CUDA start-up).

Every measurement is bounded (--seconds, --max-calls). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from typing import Any

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402

from models.policy.base import PolicyResult, PolicyWork  # noqa: E402
from bench.report import emit
from models.policy.flow import FlowMatchingPolicy, FlowPolicyConfig  # noqa: E402
from protocols import openpi as wire  # noqa: E402
from realtime.engine import Engine  # noqa: E402


def log(msg: str) -> None:
    print(f"[openpi_gpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs, dtype=np.float64)
    if a.size == 0:
        return {"n": 0}
    return {"p50": round(float(np.percentile(a, 50)), 3), "p90": round(float(np.percentile(a, 90)), 3),
            "p99": round(float(np.percentile(a, 99)), 3), "mean": round(float(a.mean()), 3),
            "max": round(float(a.max()), 3), "n": int(a.size)}


def packed_obs(meta: wire.PolicyMetadata, seed: int) -> bytes:
    """The request bytes a robot would send (openpi-client packs exactly like this)."""
    rng = np.random.default_rng(seed)
    h, w = meta.image_resolution
    obs: dict[str, Any] = {k: rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for k in meta.image_keys}
    obs[meta.state_key] = rng.standard_normal(meta.state_dim).astype(np.float32)
    obs[meta.prompt_key] = ["pick up the red block", "open the drawer", "fold the towel"][seed % 3]
    return wire.pack(obs)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_forward_ms(policy: FlowMatchingPolicy, requests: list[bytes], batch: int, reps: int) -> dict[str, float]:
    works = [_work(policy, requests[i % len(requests)], f"bare{i}", "r") for i in range(batch)]
    # 3 warm-ups left batch 1 (the first size measured) at 26 ms p50 on an H200 vs 17 ms per
    # whole call later in the same run: lazy CUDA/cuDNN set-up and clocks still settling.
    for _ in range(10):
        policy.run_batch(works)
    times = []
    for _ in range(reps):
        sync(policy.device)
        t0 = time.perf_counter()
        policy.run_batch(works)  # ends with .cpu(): synchronous
        times.append((time.perf_counter() - t0) * 1000)
    return pct(times)


def _work(policy: FlowMatchingPolicy, data: bytes, sid: str, rid: str) -> PolicyWork:
    req = wire.parse_client(data, policy.metadata)
    assert isinstance(req, wire.InferRequest)
    return PolicyWork(sid, rid, req.observation, req.sampling)


async def _robot(engine: Engine, policy: FlowMatchingPolicy, model: str, data: bytes, sid: str,
                 stop_at: float, max_calls: int, lat: list[float]) -> None:
    packer = wire.make_packer()
    n = 0
    prev = None
    while n < max_calls and time.perf_counter() < stop_at:
        t0 = time.perf_counter()
        work = _work(policy, data, sid, f"{sid}:{n}")
        result: PolicyResult = await engine.submit(model, work, session_id=sid)
        infer_ms = (time.perf_counter() - t0) * 1000
        packer.pack(wire.infer_reply(result.actions, infer_ms=infer_ms, policy_infer_ms=result.policy_ms,
                                     prev_total_ms=prev))
        prev = (time.perf_counter() - t0) * 1000
        lat.append(prev)
        n += 1


async def _fleet(engine: Engine, policy: FlowMatchingPolicy, model: str, requests: list[bytes], robots: int,
                 seconds: float, max_calls: int) -> dict[str, Any]:
    # Warm-up: every robot a few calls (also settles the batch sizes).
    warm_until = time.perf_counter() + min(2.0, seconds)
    await asyncio.gather(*(_robot(engine, policy, model, requests[i % len(requests)], f"w{i}", warm_until, 3, [])
                           for i in range(robots)))
    before = dict(engine.stats.batch_sizes)
    lats: list[list[float]] = [[] for _ in range(robots)]
    t0 = time.perf_counter()
    stop_at = t0 + seconds
    await asyncio.gather(*(_robot(engine, policy, model, requests[i % len(requests)], f"robot{i}", stop_at,
                                  max_calls, lats[i]) for i in range(robots)))
    wall = time.perf_counter() - t0
    delta = {k: v - before.get(k, 0) for k, v in sorted(engine.stats.batch_sizes.items())}
    delta = {k: v for k, v in delta.items() if v}
    forwards = sum(delta.values())
    total = sum(len(x) for x in lats)
    return {
        "robots": robots,
        "total_calls": total,
        "wall_s": round(wall, 3),
        "calls_per_s": round(total / wall, 1),
        "latency_ms": pct([x for lat in lats for x in lat]),
        "forwards": forwards,
        "mean_batch": round(sum(k * v for k, v in delta.items()) / forwards, 2) if forwards else 0.0,
        "batch_sizes": delta,
    }


def run_mode(mode: str, policy: FlowMatchingPolicy, requests: list[bytes], robots: int, args: argparse.Namespace) -> dict[str, Any]:
    policy.max_batch = 1 if mode == "one-at-a-time" else args.max_batch
    engine = Engine({policy.name: policy}, batch_wait_ms=args.batch_wait_ms)
    engine.start()
    try:
        return asyncio.run(_fleet(engine, policy, policy.name, requests, robots, args.seconds, args.max_calls))
    finally:
        engine.stop()


def environment(device: torch.device) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    versions = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    for pkg in ("msgpack",):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    hw: dict[str, Any] = {"cpu_cores": os.cpu_count(), "machine": platform.machine()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        hw.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return {"hardware": hw, "versions": versions}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--robots", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--modes", nargs="+", choices=["batched", "one-at-a-time"], default=["batched", "one-at-a-time"])
    ap.add_argument("--seconds", type=float, default=4.0, help="timed seconds per (mode, robots), at most")
    ap.add_argument("--max-calls", type=int, default=20000, help="calls per robot, at most")
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--batch-wait-ms", type=float, default=20.0,
                    help="the engine's returner wait (the server's config.policy.batch_wait_ms)")
    ap.add_argument("--steps", type=int, default=10, help="flow-matching Euler steps per call")
    ap.add_argument("--policy", choices=["flow", "maze"], default="flow",
                    help="flow: the random-weight default; maze: the trained maze policy")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    started = time.perf_counter()
    device = torch.device(args.device)
    if args.policy == "maze":
        from models.policy.maze.adapter import MazePolicy

        policy: FlowMatchingPolicy = MazePolicy(device=args.device, max_batch=args.max_batch,
                                                num_inference_steps=args.steps)
        cfg = policy.cfg
    else:
        cfg = FlowPolicyConfig(num_inference_steps=args.steps, max_batch=args.max_batch)
        policy = FlowMatchingPolicy(cfg, device=args.device)
    requests = [packed_obs(policy.metadata, i) for i in range(8)]
    report: dict[str, Any] = {
        "benchmark": "openpi_gpu_policy",
        "command": "python -m bench.openpi.bench_gpu_policy " + " ".join(sys.argv[1:]),
        **environment(device),
        "policy": {**policy.describe(), "config": {k: v for k, v in cfg.__dict__.items()}},
        "request_bytes": len(requests[0]),
    }
    log(f"policy {policy.name} on {device}: {report['policy']['parameters']} parameters, {args.steps} steps")

    report["bare_forward_ms"] = {}
    for b in sorted(set(args.robots) | {1}):
        report["bare_forward_ms"][str(b)] = bare_forward_ms(policy, requests, b, reps=20)
        log(f"bare forward, batch {b}: p50 {report['bare_forward_ms'][str(b)]['p50']} ms")

    results: dict[str, dict[str, Any]] = {m: {} for m in args.modes}
    for robots in args.robots:
        for mode in args.modes:
            r = run_mode(mode, policy, requests, robots, args)
            results[mode][str(robots)] = r
            log(f"{mode:>17} {robots:>3} robots: {r['calls_per_s']:>8} calls/s, p50 {r['latency_ms'].get('p50')} ms, "
                f"p99 {r['latency_ms'].get('p99')} ms, mean batch {r['mean_batch']}")
    report["results"] = results
    report["wall_s"] = round(time.perf_counter() - started, 1)
    if "one-at-a-time" in results:
        report["speedup_calls_per_s_over_one_at_a_time"] = {
            mode: {n: round(results[mode][n]["calls_per_s"] / results["one-at-a-time"][n]["calls_per_s"], 2)
                   for n in results[mode]}
            for mode in results if mode != "one-at-a-time"
        }
    emit(report, args.out, log=log)


if __name__ == "__main__":
    main()
