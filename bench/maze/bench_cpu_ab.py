"""A/B of maze CPU adapter variants in one process, their ticks interleaved round-robin.

    python -m bench.maze.bench_cpu_ab [--sessions 1 4] [--ticks 20]
        [--variants "" "kv_from_last=1 shift=0.1111" "window=3" "steps=1" "dtype=bfloat16"]
        [--out bench/results/maze_cpu_ab.json]

Each variant is ``MazeWorld`` keyword words on top of what ``realtime serve`` builds on
CPU (``""``: the default). Every variant gets its own adapter and sessions; one round
ticks each variant once (all its sessions in one batch, committed), so a neighbour's
burst on a shared machine falls on every variant alike. Reported per variant and
session count: wall and process-CPU ms per tick (p50, min) and frames/s per session at
the p50 tick. On a loaded machine CPU ms per frame is the steadier figure.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.report import emit  # noqa: E402
from realtime.cli import openmp_defaults  # noqa: E402  (imports no torch)


def parse_variant(text: str) -> dict[str, Any]:
    """``"kv_from_last=1 shift=0.1111 dtype=bfloat16 gelu=tanh cpu_lanes=1"`` -> MazeWorld keyword arguments."""
    import torch

    out: dict[str, Any] = {}
    for word in text.split():
        name, _, value = word.partition("=")
        if name == "dtype":
            out[name] = getattr(torch, value)
        elif name == "kv_from_last":
            out[name] = value not in ("0", "false", "False")
        elif name == "gelu":
            out[name] = value
        elif "." in value:
            out[name] = float(value)
        else:
            out[name] = int(value)
    return out


def build(kwargs: dict[str, Any]) -> Any:
    from models.world.maze.adapter import MazeWorld

    return MazeWorld(device="cpu", max_batch=32, **kwargs)  # realtime serve's CPU defaults


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--ticks", type=int, default=20, help="timed ticks per variant and session count")
    ap.add_argument("--variants", nargs="+", default=["", "kv_from_last=1 shift=0.1111", "window=2"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    openmp_defaults(os.environ)
    import torch

    from models.base import WorldTick

    worlds = [(text.strip() or "default", build(parse_variant(text))) for text in args.variants]
    rows = []
    for n in args.sessions:
        ids = [f"ab{n}_{i}" for i in range(n)]
        times: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in worlds}
        warm = max(w.window for _, w in worlds) + 2  # every window full before timing
        print(f"[bench_cpu_ab] {n} session(s): {len(worlds)} variants x {warm + args.ticks} ticks",
              file=sys.stderr, flush=True)
        for k in range(warm + args.ticks):
            for name, world in worlds:
                works = [WorldTick(sid, f"{sid}:{k}", k, (), None, (frozenset("w"),), seed=i)
                         for i, sid in enumerate(ids)]
                t0, c0 = time.perf_counter(), time.process_time()
                world.run_batch(works)
                for sid in ids:
                    world.end_tick(sid, True)
                if k >= warm:
                    times[name].append((time.perf_counter() - t0, time.process_time() - c0))
        for name, world in worlds:
            for sid in ids:
                world.release(sid)
            wall = [w for w, _ in times[name]]
            cpu = [c for _, c in times[name]]
            d = world.details()
            rows.append({
                "variant": name, "sessions": n, "ticks": len(wall),
                "details": {k: d[k] for k in ("denoising_steps", "window_frames", "dtype", "passes_per_frame",
                                              "kv_from_last_step", "schedule_shift", "dtype_pick")},
                "tick_ms_p50": 1000 * statistics.median(wall), "tick_ms_min": 1000 * min(wall),
                "cpu_ms_per_tick_p50": 1000 * statistics.median(cpu),
                "cpu_ms_per_frame_p50": 1000 * statistics.median(cpu) / n,
                "frames_per_s_per_session": 1 / statistics.median(wall),
                "frames_per_s_per_session_at_min_tick": 1 / min(wall),
            })
            print(f"[bench_cpu_ab] {name:32s} {n} sess: tick p50 {rows[-1]['tick_ms_p50']:7.1f} ms "
                  f"min {rows[-1]['tick_ms_min']:7.1f}  cpu/frame {rows[-1]['cpu_ms_per_frame_p50']:7.1f} ms",
                  file=sys.stderr, flush=True)
    base = {r["sessions"]: r for r in rows if r["variant"] == worlds[0][0]}
    for r in rows:
        b = base[r["sessions"]]
        r["vs_first_tick_p50"] = r["tick_ms_p50"] / b["tick_ms_p50"]
        r["vs_first_cpu_per_frame"] = r["cpu_ms_per_frame_p50"] / b["cpu_ms_per_frame_p50"]
    flags = ""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        pass
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    emit({"benchmark": "maze CPU adapter variants, ticks interleaved round-robin in one process",
          "command": " ".join(["python", "-m", "bench.maze.bench_cpu_ab",
                               *(repr(a) if a == "" or " " in a else a for a in sys.argv[1:])]),
          "cpu_model": model, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
          "cpu_bf16_flags": sorted({f for f in flags.split() if "bf16" in f or f.startswith("amx")}),
          "cpu_affinity": sorted(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
          "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
          "torch": torch.__version__, "python": platform.python_version(), "load_avg_1m_end": os.getloadavg()[0],
          "rows": rows}, args.out)


if __name__ == "__main__":
    main()
