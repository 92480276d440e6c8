"""Where the CPU time of one maze tick goes: torch.profiler over the served adapter's ticks.

    python -m bench.maze.profile_cpu [--sessions 1 4] [--ticks 6] [--variants "" "--steps 1"]
                                      [--out bench/results/maze_profile_cpu.json]

Builds the adapter ``realtime serve`` builds on CPU (``models.factory``, the server's
defaults plus a variant's ``MazeWorld`` keyword arguments as ``name=value`` words), fills
the window, then profiles ``--ticks`` committed ticks of 1 and of 4 sessions in one
batch. Each aten op's self CPU time is summed into buckets (linear layers, attention,
the KV gather and write, element-wise and norms, copies/reshapes, other), and the wall
time of the ticks not covered by any op is reported as Python and dispatch overhead.
Self CPU time is summed over the OpenMP team's parent thread only, so it is close to
wall time per op, not CPU-seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.report import emit  # noqa: E402
from realtime.cli import openmp_defaults  # noqa: E402  (imports no torch)

BUCKETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("linear (addmm/mm/linear)", ("aten::addmm", "aten::mm", "aten::bmm", "aten::linear", "aten::matmul",
                                  "quantized::linear_dynamic", "mkldnn::", "aten::_mkl")),
    ("attention (sdpa)", ("aten::_scaled_dot_product", "aten::scaled_dot_product", "aten::_flash_attention",
                          "aten::baddbmm", "aten::_softmax", "aten::softmax")),
    ("kv gather / write", ("aten::index_select", "aten::index_put", "aten::index_copy", "aten::index",
                           "aten::scatter")),
    ("norms", ("aten::native_layer_norm", "aten::layer_norm", "aten::rms_norm", "aten::_fused_rms_norm",
               "aten::rsqrt", "aten::pow", "aten::mean")),
    ("element-wise", ("aten::mul", "aten::add", "aten::sub", "aten::gelu", "aten::silu", "aten::cos",
                      "aten::sin", "aten::where", "aten::clamp", "aten::div", "aten::remainder", "aten::exp",
                      "aten::neg", "aten::round", "aten::lerp")),
    ("copies / cat / layout", ("aten::copy_", "aten::cat", "aten::contiguous", "aten::clone", "aten::_to_copy",
                               "aten::to", "aten::fill_", "aten::zero_", "aten::empty", "aten::reshape",
                               "aten::view", "aten::permute", "aten::transpose", "aten::expand",
                               "aten::repeat_interleave", "aten::slice", "aten::select", "aten::chunk",
                               "aten::split", "aten::unsqueeze", "aten::as_strided", "aten::t",
                               "aten::_unsafe_view", "aten::detach", "aten::resize_", "aten::stack")),
)


def bucket(name: str) -> str:
    for label, prefixes in BUCKETS:
        if any(name.startswith(p) for p in prefixes):
            return label
    return "other ops"


def profile(sessions: int, ticks: int, kwargs: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile as tprofile

    from models import factory
    from models.base import WorldTick
    from models.factory import BuildOptions

    world = factory.build("maze", BuildOptions(device="cpu", max_batch=32), kind="world")
    if kwargs:  # a variant: the same adapter with some keyword arguments changed
        from models.world.maze.adapter import MazeWorld

        world = MazeWorld(device="cpu", max_batch=32, **kwargs)
    ids = [f"p{i}" for i in range(sessions)]

    def tick(k: int) -> None:
        works = [WorldTick(sid, f"{sid}:{k}", k, (), None, (frozenset("w"),), seed=i) for i, sid in enumerate(ids)]
        world.run_batch(works)
        for sid in ids:
            world.end_tick(sid, True)

    warm = world.window + 3
    for k in range(warm):
        tick(k)
    walls = []
    for k in range(warm, warm + ticks):  # unprofiled: the reference wall time
        t0 = time.perf_counter()
        tick(k)
        walls.append(time.perf_counter() - t0)
    with tprofile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for k in range(warm + ticks, warm + 2 * ticks):
            tick(k)
        prof_wall = time.perf_counter() - t0
    per_op: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for ev in prof.key_averages():
        per_op[ev.key] += ev.self_cpu_time_total / 1000.0  # ms
        counts[ev.key] += ev.count
    op_ms = sum(per_op.values())
    buckets: dict[str, float] = defaultdict(float)
    for name, ms in per_op.items():
        buckets[bucket(name)] += ms / ticks
    top = sorted(per_op.items(), key=lambda kv: -kv[1])[:25]
    wall_ms = 1000 * prof_wall / ticks
    return {
        "sessions": sessions, "ticks": ticks, "variant": kwargs, "threads": torch.get_num_threads(),
        "details": {k: world.details()[k] for k in ("denoising_steps", "window_frames", "dtype")},
        "tick_ms_p50_unprofiled": 1000 * statistics.median(walls),
        "tick_ms_profiled": wall_ms,
        "ops_per_tick": sum(counts.values()) / ticks,
        "buckets_ms_per_tick": dict(sorted(buckets.items(), key=lambda kv: -kv[1])),
        "python_and_dispatch_ms_per_tick": wall_ms - op_ms / ticks,
        "top_ops_ms_per_tick": {name: {"ms": ms / ticks, "calls": counts[name] / ticks} for name, ms in top},
    }


def parse_variant(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for word in text.split():
        name, _, value = word.partition("=")
        out[name] = int(value) if value.lstrip("-").isdigit() else value
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--ticks", type=int, default=6)
    ap.add_argument("--variants", nargs="+", default=[""], help="MazeWorld keyword words, e.g. \"steps=1\"")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    openmp_defaults(os.environ)
    import torch

    rows = []
    for text in args.variants:
        for n in args.sessions:
            row = profile(n, args.ticks, parse_variant(text))
            print(json.dumps({k: row[k] for k in ("sessions", "variant", "tick_ms_p50_unprofiled",
                                                  "buckets_ms_per_tick", "python_and_dispatch_ms_per_tick")}),
                  file=sys.stderr, flush=True)
            rows.append(row)
    emit({"benchmark": "where the CPU time of a maze tick goes (torch.profiler, self CPU time per op)",
          "command": " ".join(["python", "-m", "bench.maze.profile_cpu", *sys.argv[1:]]),
          "cpu_affinity": sorted(os.sched_getaffinity(0)), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
          "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "cpu": platform.processor() or platform.machine(),
          "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
          "load_avg_1m": os.getloadavg()[0], "rows": rows}, args.out)


if __name__ == "__main__":
    main()
