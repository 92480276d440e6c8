"""The bare CPU maze tick under each OpenMP wait policy, on the cores as they are (shared or not).

    python -m bench.maze.bench_omp_wait --steps 1 --rounds 2 --out bench/results/maze_omp_wait_cpu.json

Each (round, policy) is a fresh process (libgomp reads its environment when it loads)
that ticks one session of ``MazeWorld(device="cpu")`` with 2 torch threads; a process
that does not finish its ticks within ``--timeout`` seconds is recorded as such. Policies:
``passive`` (OMP_WAIT_POLICY=PASSIVE, what ``realtime serve`` sets), ``spin10000``
(GOMP_SPINCOUNT=10000) and ``spin`` (neither set: libgomp spins up to 300,000 rounds).
On an idle machine the three differ little; with anything else running on the cores
(the event loop, a client, other jobs) a spinning team waits at every barrier for a
preempted partner. Rounds interleave the policies, so a drifting load hits each alike.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.report import emit  # noqa: E402

POLICIES = {"passive": {"OMP_WAIT_POLICY": "PASSIVE"}, "spin10000": {"GOMP_SPINCOUNT": "10000"}, "spin": {}}


def child(steps: int, ticks: int, threads: int) -> None:
    import statistics

    import torch

    from models.base import WorldTick
    from models.world.maze.adapter import MazeWorld

    torch.set_num_threads(threads)
    world = MazeWorld(device="cpu", steps=steps, max_sessions=1, max_batch=1)
    wall, cpu = [], []
    warm = world.window + 2
    for i in range(warm + ticks):
        t = WorldTick("s", str(i), i, (), None, (frozenset("w"),), seed=0)
        t0, c0 = time.perf_counter(), time.process_time()
        world.run_batch([t])
        world.end_tick("s", True)
        if i >= warm:
            wall.append(1000 * (time.perf_counter() - t0))
            cpu.append(1000 * (time.process_time() - c0))
    print(json.dumps({"tick_ms_p50": statistics.median(wall), "tick_ms_min": min(wall),
                      "cpu_ms_per_tick_p50": statistics.median(cpu), "torch_threads": torch.get_num_threads()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--ticks", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=150.0)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.child:
        child(args.steps, args.ticks, args.threads)
        return
    rows = []
    for r in range(args.rounds):
        for name, env in POLICIES.items():
            base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
            load0 = os.getloadavg()[0]
            t0 = time.perf_counter()
            cmd = [sys.executable, "-m", "bench.maze.bench_omp_wait", "--child", "--steps", str(args.steps),
                   "--ticks", str(args.ticks), "--threads", str(args.threads)]
            row = {"round": r, "policy": name, "env": env}
            try:
                out = subprocess.run(cmd, cwd=ROOT, env={**base, **env, "PYTHONPATH": str(ROOT)},
                                     capture_output=True, text=True, timeout=args.timeout, check=True)
                row.update(json.loads(out.stdout.strip().splitlines()[-1]))
            except subprocess.TimeoutExpired:
                row["timed_out"] = f"loading, 6 warm-up ticks and {args.ticks} ticks " \
                                   f"not done in {args.timeout:.0f} s"
            row["process_s"] = time.perf_counter() - t0
            row["load_avg_1m"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
            print(f"[bench_omp_wait] {json.dumps(row)}", file=sys.stderr, flush=True)
            rows.append(row)
    emit({"benchmark": "bare CPU maze tick per OpenMP wait policy", "steps": args.steps, "ticks": args.ticks,
          "threads": args.threads, "cpu_affinity": sorted(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(),
          "command": " ".join(["python", "-m", "bench.maze.bench_omp_wait", *sys.argv[1:]]), "rows": rows},
         args.out)


if __name__ == "__main__":
    main()
