"""Frames/s of the maze world on CPU through its adapter (the kv paged cache included, no server).

``python bench/maze/bench_cpu.py [--threads 2] [--ticks 30] [--out bench/results/maze_cpu.json]``

One session, one frame per tick, keys cycling W, W+L, J, A; the window fills
before timing starts. Configs: the CPU default (``SERVING_DEFAULTS["cpu"]``: 2 steps,
a 2-frame window), 1 step, the CPU default's steps with the 4-frame window it had until
2026-12-02, and the GPU default (4 steps, 14-frame window). The 1-minute load average
is recorded: on a shared machine it says how much of the CPU the run had, and
the fastest tick (``tick_ms_min``) is the best estimate of the uncontended cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from models.base import WorldTick  # noqa: E402
from models.world.maze.adapter import SERVING_DEFAULTS, MazeWorld  # noqa: E402

KEYS = ("w", "wl", "j", "a")


def run(steps: int, window: int, ticks: int) -> dict:
    world = MazeWorld(device="cpu", steps=steps, window=window, max_sessions=1, max_batch=1)
    times, cpu = [], []
    for i in range(window + 2 + ticks):
        t = WorldTick(session_id="s", request_id=str(i), chunk_index=i, applied_event_ids=(), prompt=None,
                      actions=(frozenset(KEYS[i % 4]),), seed=0)
        t0, c0 = time.perf_counter(), time.process_time()
        world.run_batch([t])
        world.end_tick("s", True)
        if i >= window + 2:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    p50 = statistics.median(times)
    cpu50 = statistics.median(cpu)
    threads = torch.get_num_threads()
    # On a shared machine wall time includes waiting for a core; CPU seconds spent by this process
    # over the thread count is what the tick would take with the cores to itself (an estimate:
    # it assumes the threads parallelise perfectly, so it is optimistic by their imbalance).
    return {"steps": steps, "window": window, "ticks": len(times), "tick_ms_p50": p50 * 1e3,
            "tick_ms_min": min(times) * 1e3, "tick_ms_max": max(times) * 1e3, "frames_per_s": 1.0 / p50,
            "frames_per_s_at_min_tick": 1.0 / min(times),
            "cpu_ms_p50": cpu50 * 1e3, "est_uncontended_frames_per_s": threads / cpu50}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ticks", type=int, default=30)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    cpu, gpu = SERVING_DEFAULTS["cpu"], SERVING_DEFAULTS["cuda"]
    for steps, window in ((cpu.steps, cpu.window), (1, cpu.window), (cpu.steps, 4), (gpu.steps, gpu.window)):
        load = os.getloadavg()[0]
        r = run(steps, window, args.ticks if window < gpu.window else max(5, args.ticks // 3))
        r["loadavg_1min_before"] = load
        rows.append(r)
        print(json.dumps(r), flush=True)
    res = {"what": "maze world adapter on CPU, 1 session, 1 frame per tick, kv paged cache, float32",
           "threads": args.threads, "cpu_count": os.cpu_count(), "torch": torch.__version__,
           "command": "python bench/maze/bench_cpu.py " + " ".join(sys.argv[1:]), "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
