"""GPU check: MazeWorld's CUDA-graph frames vs its eager frames on the same state, inputs and noise.

``python -m bench.maze.check_frame_graph [--out FILE]``

For each tick the adapter runs the batch eagerly, keeps the frames and the K/V
written to each row's new page, aborts the tick (kv returns to the state before
it), runs the same batch through the graph and commits. Both start from the same
noise: a row's is a function of its session's seed and frame index. Sessions are staggered so rows hold different page counts. Prints the
max abs difference of the uint8 frames and of the written K/V, and both modes'
median tick time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from models.world.base import WorldTick
from bench.report import emit
from models.world.maze.adapter import MazeWorld


def tick(sid: str, ci: int, k: int) -> WorldTick:
    keys = ("w", "j", "l", "wd")[k % 4]
    return WorldTick(sid, f"{sid}:{ci}", ci, (), None, (frozenset(keys),), seed=int(sid[1:]))


def written(world: MazeWorld, sids: list[str]) -> torch.Tensor:
    st = world.cache.storage
    blocks = [world.cache.table(s).pending[0] for s in sids]
    return torch.stack([torch.stack([st.k[l][blocks], st.v[l][blocks]]) for l in range(len(st.k))]).float()


def compare(world: MazeWorld, n: int, ticks: int, prefix: str) -> dict:
    count: dict[str, int] = {}
    frame_diff, kv_diff, mean_frame, compared = 0, 0.0, [], 0
    buckets = world.graph_buckets
    for step in range(ticks):
        sids = [f"{prefix}{i}" for i in range(n if step >= ticks // 3 else max(1, n // 2))]
        works = [tick(s, count.get(s, 0), step + i) for i, s in enumerate(sids)]
        generated = all(count.get(s, 0) > 0 for s in sids)
        if generated:
            world.graph_buckets = ()          # eager
            eager = world.run_batch(works)
            kv_e = written(world, sids)
            for w in works:
                world.end_tick(w.session_id, False)
            world.graph_buckets = buckets
        out = world.run_batch(works)
        if generated:
            kv_g = written(world, sids)
            for a, b in zip(eager, out):
                d = (a.frames.astype(int) - b.frames.astype(int))
                frame_diff = max(frame_diff, int(abs(d).max()))
                mean_frame.append(float(abs(d).mean()))
            kv_diff = max(kv_diff, float((kv_e - kv_g).abs().max()))
            compared += 1
        for w in works:
            world.end_tick(w.session_id, True)
            count[w.session_id] = count.get(w.session_id, 0) + 1
    return {"sessions": n, "ticks_compared": compared, "frame_max_abs_diff_u8": frame_diff,
            "frame_mean_abs_diff_u8": statistics.mean(mean_frame), "kv_max_abs_diff": kv_diff,
            "held_pages": sorted({len(world.cache.table(f"{prefix}{i}").held) for i in range(n)})}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timing(world: MazeWorld, n: int, prefix: str, reps: int = 20) -> dict:
    buckets = world.graph_buckets
    res = {}
    for mode, b in (("eager", ()), ("graph", buckets)):
        world.graph_buckets = b
        times = []
        for k in range(reps + 3):
            works = [tick(f"{prefix}{i}", 100 + k, k) for i in range(n)]
            sync()
            t0 = time.perf_counter()
            world.run_batch(works)
            for w in works:
                world.end_tick(w.session_id, True)
            sync()
            if k >= 3:
                times.append((time.perf_counter() - t0) * 1e3)
        res[f"{mode}_tick_ms_p50"] = statistics.median(times)
    world.graph_buckets = buckets
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--ticks", type=int, default=18)
    args = ap.parse_args()
    world = MazeWorld(device=args.device, max_batch=128, max_sessions=80, cuda_graphs=True)
    rows = []
    for n, prefix in zip(args.sessions, "abcdefgh"):
        row = compare(world, n, args.ticks, prefix)
        row.update(timing(world, n, prefix, 20 if args.device != "cpu" else 2))
        print(json.dumps(row), flush=True)
        rows.append(row)
    report = {"check": "MazeWorld CUDA-graph vs eager frames on identical state/inputs/noise",
              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "torch": torch.__version__,
              "adapter": {k: v for k, v in world.describe().items() if k != "config"}, "rows": rows}
    emit(report, args.out, echo=False)


if __name__ == "__main__":
    main()
