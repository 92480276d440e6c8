"""Bare-model tick time of the maze DiT (no server): one frame = 4 Euler passes + 1 clean pass.

``python bench/maze/bench_model.py [--out bench/results/maze_model.json]``

Each batch row has a full cache (sink + 14 frames, bf16 on CUDA). Eager runs
the tick as written; "graph" captures the same tick in a CUDA graph and replays
it (shapes are static once the cache is full). Median of ``--reps`` ticks timed
with CUDA events after warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from models.world.maze.cache import FrameCache  # noqa: E402
from models.world.maze.rollout import SamplerConfig, denoise_frame  # noqa: E402
from models.world.maze.weights import DEFAULT_WEIGHTS, load_model  # noqa: E402


def make_tick(model, view, actions, frames, steps):
    def tick():
        x0 = denoise_frame(model, view, actions, frames, SamplerConfig(steps=steps))
        t = torch.zeros(actions.shape[0], device=actions.device)
        model.forward_frame(x0, t, actions, frames, frames == 0, view)  # the clean pass (K/V for the cache)
        return x0
    return tick


def time_fn(fn, reps: int, cuda: bool) -> list[float]:
    out = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--window", type=int, default=14)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    model = load_model(DEFAULT_WEIGHTS, dev, dtype)
    rows = []
    for B in [int(b) for b in args.batches.split(",")]:
        cache = FrameCache(model.cfg, B, args.window, dev, dtype)
        for k in cache.k + cache.v:
            k.normal_()
        cache.slot_valid[:] = True
        view = cache.view()
        actions = torch.zeros(B, 8, device=dev)
        actions[:, 0] = 1
        frames = torch.full((B,), 40, device=dev)
        tick = make_tick(model, view, actions, frames, args.steps)
        with torch.inference_mode():
            for _ in range(3):
                tick()
            eager = time_fn(tick, args.reps, cuda)
            row = {"batch": B, "eager_ms_p50": statistics.median(eager), "eager_ms_p99": sorted(eager)[int(0.99 * (len(eager) - 1))]}
            if cuda:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        tick()
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    tick()
                graph = time_fn(g.replay, args.reps, cuda)
                row.update(graph_ms_p50=statistics.median(graph), graph_ms_p99=sorted(graph)[int(0.99 * (len(graph) - 1))])
        best = row.get("graph_ms_p50", row["eager_ms_p50"])
        row["frames_per_s_total"] = B * 1000.0 / best
        row["frames_per_s_per_session"] = 1000.0 / best
        rows.append(row)
        print(json.dumps(row), flush=True)
    res = {
        "what": "bare maze DiT tick (1 frame: %d Euler passes + 1 clean pass), full sink+%d-frame cache"
                % (args.steps, args.window),
        "device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
        "dtype": str(dtype), "command": "python bench/maze/bench_model.py " + " ".join(sys.argv[1:]),
        "config": model.cfg.to_dict(), "rows": rows,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
