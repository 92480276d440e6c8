"""What a maze tick costs and what its noise draw costs in it, per batch size.

    python -m bench.maze.bench_noise [--device cuda] [--sessions 1 32 128] [--ticks 30] [--out FILE]

Times ``MazeWorld.run_batch`` + ``end_tick`` for a batch of N generated frames (every session
past its first frame, windows full), the adapter as ``realtime serve`` builds it on the device
(CUDA: bf16, graphs captured at build). Then times the noise draw alone for the same rows: the
per-session counter-based noise (``models.world.noise.normal``, what a tick draws) and one
``torch.randn`` of the same shape from one generator (what a tick drew before), each as its own
launches, synchronised; on CUDA the tick runs the draw inside its graph, so there it costs no
launch of its own. Run it in an older checkout too for the tick before the change: the script
uses only the adapter's public face, and skips the counter-based draw where the module is absent.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.report import emit  # noqa: E402
from realtime.server.cli import openmp_defaults  # noqa: E402  (imports no torch)


def _ms(fn, reps: int, sync) -> dict[str, float]:
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(1000 * (time.perf_counter() - t0))
    return {"p50_ms": statistics.median(times), "min_ms": min(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--ticks", type=int, default=30, help="timed ticks per batch size")
    ap.add_argument("--draws", type=int, default=200, help="timed noise draws per batch size")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.device == "cpu":
        openmp_defaults(os.environ)
    import torch

    from models.world.base import WorldTick
    from models.world.maze.adapter import MazeWorld

    try:
        from models.world import noise
    except ImportError:  # a checkout from before the counter-based noise
        noise = None
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    world = MazeWorld(device=args.device, max_batch=max(args.sessions), max_sessions=max(args.sessions))
    rows = []
    for n in args.sessions:
        ids = [f"b{n}_{i}" for i in range(n)]
        tick_ms: list[float] = []
        cpu_ms: list[float] = []
        warm = world.window + 2
        for k in range(warm + args.ticks):
            works = [WorldTick(sid, f"{sid}:{k}", k, (), None, (frozenset("w" if k % 3 else "l"),), seed=i)
                     for i, sid in enumerate(ids)]
            t0, c0 = time.perf_counter(), time.process_time()
            world.run_batch(works)
            for sid in ids:
                world.end_tick(sid, True)
            if k >= warm:
                tick_ms.append(1000 * (time.perf_counter() - t0))
                cpu_ms.append(1000 * (time.process_time() - c0))
        for sid in ids:
            world.drop_session(sid)
        # process CPU time: the steadier figure on a CPU shared with other work
        row = {"sessions": n, "tick_p50_ms": statistics.median(tick_ms), "tick_min_ms": min(tick_ms),
               "tick_process_cpu_p50_ms": statistics.median(cpu_ms)}
        gen = torch.Generator(device=dev).manual_seed(0)
        row["randn_draw"] = _ms(lambda: torch.randn((n, 3, 64, 64), device=dev, generator=gen), args.draws, sync)
        if noise is not None:
            seeds = torch.arange(n, dtype=torch.int64, device=dev)
            frames = torch.full((n,), 5, dtype=torch.int64, device=dev)
            row["counter_draw"] = _ms(lambda: noise.normal(seeds, frames, (3, 64, 64)), args.draws, sync)
            row["counter_draw_share_of_tick"] = row["counter_draw"]["p50_ms"] / row["tick_p50_ms"]
        rows.append(row)
        print(f"[bench_noise] {n:4d} sessions: tick p50 {row['tick_p50_ms']:8.2f} ms "
              f"(cpu {row['tick_process_cpu_p50_ms']:.2f})  randn "
              f"{row['randn_draw']['p50_ms']:.3f} ms  counter "
              f"{row.get('counter_draw', {}).get('p50_ms', float('nan')):.3f} ms", file=sys.stderr, flush=True)
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10).stdout.strip() or None
    except OSError:
        rev = None
    d = world.details()
    emit({"benchmark": "maze tick and its noise draw per batch size",
          "command": " ".join(["python", "-m", "bench.maze.bench_noise", *sys.argv[1:]]),
          "tree": str(ROOT), "git_head": rev, "counter_noise": noise is not None,
          "device": torch.cuda.get_device_name(dev) if cuda else "cpu", "torch": torch.__version__,
          "torch_threads": torch.get_num_threads(),
          "details": {k: d.get(k) for k in ("denoising_steps", "window_frames", "dtype", "cuda_graphs",
                                            "cpu_lanes", "clean_pass_ahead")},
          "rows": rows}, args.out)


if __name__ == "__main__":
    main()
