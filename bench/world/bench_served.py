"""World sessions served through the real server and engine vs the bare model.

For each session count N it starts N world.v1 clients (a separate process, real
WebSockets over loopback) against a uvicorn server in this process, measures
frames/s per session and in total plus the tick latency the server reports, and
then times the bare adapter on the same batch size in the same run:

    python -m bench.world.bench_served --model maze --device cuda --sessions 1 8 32 128 \
        --seconds 8 --out bench/results/world_served_h200.json

``--model instant`` answers every tick at once with a fixed maze frame (``--instant-ms``
sleeps per batch instead): the server's own cost, with no model time.

Progress goes to stderr; the JSON holds hardware, versions and the command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from typing import Any, Sequence

import numpy as np

from bench.world.serve_profile import ServeProfile
from models.world.base import WorldAdapter, WorldChunk, WorldGeometry, WorldTick
from bench.report import emit


def log(msg: str) -> None:
    print(f"[bench_served {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- client process
async def _client(url: str, sid: str, keys: list[str], credits: int, warmup: float, seconds: float,
                  out: dict[str, Any], fmt: str = "rgb8") -> None:
    import websockets

    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.create", "session_id": sid, "credits": credits,
                                  "format": fmt, "seed": hash(sid) % 1000}))
        created = json.loads(await ws.recv())
        assert created["type"] == "session.created", created
        await ws.send(json.dumps({"type": "event", "event_id": 0, "controls": [
            {"track": "keys", "schema": "keys.v1", "data": {"mode": "state", "held": keys}}]}))
        start = time.perf_counter()
        frames, ticks, gaps, last = 0, [], [], None
        expected = 0
        while True:
            msg = await ws.recv()
            if isinstance(msg, bytes):
                continue
            data = json.loads(msg)
            if data["type"] != "chunk":
                continue
            assert data["chunk_index"] == expected, (data["chunk_index"], expected)
            expected += 1
            for _ in range(data["frames"]):
                await ws.recv()
            await ws.send('{"type":"credit","chunks":1}')
            now = time.perf_counter()
            if now - start >= warmup:
                frames += data["frames"]
                ticks.append(data["tick_ms"])
                if last is not None:
                    gaps.append((now - last) * 1000)
                last = now
            if now - start >= warmup + seconds:
                break
        out[sid] = {"frames": frames, "ticks": ticks, "gaps": gaps}
        await ws.send(json.dumps({"type": "session.close"}))


def _client_process(url: str, ids: list[int], credits: int, warmup: float, seconds: float,
                    queue: mp.Queue, fmt: str = "rgb8") -> None:
    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        keys = [["w"], ["j"], ["l"], ["w", "d"]]
        await asyncio.gather(*(_client(url, f"s{i}", keys[i % 4], credits, warmup, seconds, out, fmt)
                               for i in ids))
        return out

    queue.put(asyncio.run(main()))


# ---------------------------------------------------------------- server side
class InstantWorld(WorldAdapter):
    """A world adapter that answers at once with a constant maze frame: what serving itself costs.

    With it the bench measures the server's ceiling (engine hand-offs, session
    bookkeeping, WebSocket framing) with no model time at all.
    """

    name = "instant"
    max_batch = 128

    def __init__(self, delay_ms: float = 0.0) -> None:
        # A real maze view, so the bytes on the wire (and any compression) are as served.
        from models.world.maze.sim import H, W, MazeSim

        self.delay_s = delay_ms / 1000.0  # a stand-in for GPU time: sleeping releases the GIL
        self.geometry = WorldGeometry(height=H, width=W, frames_per_chunk=1, fps=15.0)
        self.frame = MazeSim([0]).render().numpy()

    def generate(self, works: Sequence[WorldTick]) -> list[WorldChunk]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return [WorldChunk.answering(w, self.frame) for w in works]


def _build_model(name: str, device: str, max_batch: int, steps: int | None, max_sessions: int,
                 instant_ms: float = 0.0):
    if name == "instant":
        return InstantWorld(instant_ms)
    if name == "tiny":
        from models.world.tiny import TinyWorld

        return TinyWorld(max_batch=max_batch, device=device)
    from models.world.maze.adapter import MazeWorld

    kwargs: dict[str, Any] = {"device": device, "max_batch": max_batch, "max_sessions": max_sessions}
    if steps is not None:
        kwargs["steps"] = steps
    return MazeWorld(**kwargs)


def _bare(model, n: int, repeats: int) -> dict[str, float]:
    """Time the adapter alone on a batch of n sessions (commit each tick)."""
    import torch

    from models.base import WorldTick

    def tick(i: int, k: int) -> WorldTick:
        return WorldTick(f"bare{i}", f"bare{i}:{k}", k, (), None,
                         tuple(frozenset("w") for _ in range(model.geometry.frames_per_chunk)), seed=i)

    times = []
    for k in range(repeats + 3):
        works = [tick(i, k) for i in range(n)]
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step = max(1, model.max_batch)  # past max_batch the engine runs several batches too
        for j in range(0, n, step):
            model.run_batch(works[j:j + step])
        for w in works:
            model.end_tick(w.session_id, True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if k >= 3:
            times.append((time.perf_counter() - t0) * 1000)
    for i in range(n):
        model.release(f"bare{i}")
    p50 = statistics.median(times)
    return {"tick_ms_p50": p50, "frames_per_s_total": n * model.geometry.frames_per_chunk * 1000 / p50}


def _plan(args: argparse.Namespace) -> list[tuple[str, str, int, float, int]]:
    """(variant, format, encode workers, switch interval s, sessions) for every row, in order."""
    import realtime.engine
    import realtime.media

    rows = []
    for spec in args.variants or [args.format]:
        head, _, counts = spec.partition("@")
        fmt, *mods = head.split("/")
        if fmt not in ("rgb8", "jpeg", "png") or set(mods) - {"inline", "gil5"}:
            raise SystemExit(f"bad variant {spec!r}")
        workers = 0 if "inline" in mods else realtime.media.ENCODE_WORKERS
        switch = 0.005 if "gil5" in mods else (realtime.engine.SWITCH_INTERVAL_S or sys.getswitchinterval())
        sessions = [int(c) for c in counts.split(",")] if counts else args.sessions
        rows += [(head, fmt, workers, switch, n) for n in sessions]
    return rows


def _kv_capacity(model: Any, device: str) -> dict[str, Any] | None:
    """The capacity formula (kv.plan_capacity) at the device's free memory: how many sessions fit."""
    geometry = getattr(model, "kv_geometry", None)
    if geometry is None:
        return None
    import torch

    from kv import plan_capacity

    free = torch.cuda.mem_get_info()[0] if device.startswith("cuda") and torch.cuda.is_available() else None
    if free is None:
        return {"available_bytes": None}
    plan = plan_capacity(geometry, available_bytes=free, fraction=0.9, ticks_in_flight=model.max_batch)
    return {"available_bytes": free, "fraction": 0.9, "sessions": plan.capacity,
            "required_one_bytes": plan.required_one_bytes}


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="maze")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--credits", type=int, default=4)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--max-batch", type=int, default=128)
    parser.add_argument("--batch-wait-ms", type=float, default=1.0)
    parser.add_argument("--instant-ms", type=float, default=0.0,
                        help="with --model instant: each batch sleeps this long (GPU time stand-in)")
    parser.add_argument("--client-procs", type=int, default=1,
                        help="client processes the sessions are spread over (the load must not be "
                             "the bottleneck: one Python process tops out near 1,000 chunks/s)")
    parser.add_argument("--deflate", action="store_true",
                        help="serve with permessage-deflate on (the server's default is off)")
    parser.add_argument("--format", choices=["rgb8", "jpeg", "png"], default="rgb8",
                        help="the frame format every client asks for")
    parser.add_argument("--switch-interval-ms", type=float, default=None,
                        help="the GIL switch interval the engine sets (realtime.engine.SWITCH_INTERVAL_S; "
                             "0 keeps Python's 5 ms)")
    parser.add_argument("--encode-workers", type=int, default=None,
                        help="realtime.media.ENCODE_WORKERS: jpeg/png encoder threads (0 encodes on the loop)")
    parser.add_argument("--variants", nargs="+", default=None,
                        help="rows to run, each FORMAT[/inline][/gil5][@N,N,...]: inline encodes on the loop, "
                             "gil5 runs with Python's 5 ms switch interval, @ its own session counts "
                             "(default: --format at --sessions)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import torch

    from realtime.app import build_app
    from realtime.config import EngineConfig, LimitsConfig, ServerConfig, WorldConfig
    from realtime.registry import Inventory
    from realtime.server import serve_in_thread

    # Room for every session of the largest run plus the bare-model sessions.
    model = _build_model(args.model, args.device, args.max_batch, args.steps, 2 * max(r[4] for r in _plan(args)),
                         args.instant_ms)
    import realtime.engine

    if args.switch_interval_ms is not None:
        realtime.engine.SWITCH_INTERVAL_S = args.switch_interval_ms / 1000.0
    import realtime.media

    if args.encode_workers is not None:
        realtime.media.ENCODE_WORKERS = args.encode_workers
    profile = ServeProfile()
    profile.attach(model)
    inventory = Inventory()
    inventory.adapters[model.name] = model
    # Every simulated client is on loopback, one address: no per-client limit.
    config = ServerConfig(engine=EngineConfig(device=args.device, batch_wait_ms=args.batch_wait_ms),
                          world=WorldConfig(models=(model.name,), max_batch=args.max_batch, max_sessions=1024),
                          limits=LimitsConfig(max_sessions_per_client=0))
    rows = []
    app = build_app(config, inventory)
    with serve_in_thread(app, per_message_deflate=args.deflate) as addr:
        url = f"ws://{addr}/v1/realtime/world"
        bares: dict[int, dict[str, float]] = {}
        for variant, fmt, workers, switch_s, n in _plan(args):
            realtime.media.ENCODE_WORKERS = workers
            sys.setswitchinterval(switch_s)
            log(f"{variant}: {n} sessions: serving for {args.warmup + args.seconds:.0f} s ...")
            ctx = mp.get_context("spawn")
            queue: mp.Queue = ctx.Queue()
            k = max(1, min(args.client_procs, n))
            procs = [ctx.Process(target=_client_process,
                                 args=(url, list(range(j, n, k)), args.credits, args.warmup, args.seconds, queue, fmt))
                     for j in range(k)]
            for proc in procs:
                proc.start()
            # Engine batches over (roughly) the measured window: do the sessions tick together?
            time.sleep(args.warmup)
            stats = app.state.engine.stats
            batches0, works0, busy0 = stats.batches, stats.works, stats.busy_seconds
            load0 = os.getloadavg()[0]
            profile.start()
            time.sleep(args.seconds)
            phases = profile.stop()
            batches, works = stats.batches - batches0, stats.works - works0
            busy = stats.busy_seconds - busy0
            result: dict[str, Any] = {}
            for _ in procs:
                result.update(queue.get(timeout=args.warmup + args.seconds + 300))
            for proc in procs:
                proc.join(30)
            per_session = [r["frames"] / args.seconds for r in result.values()]
            ticks = [t for r in result.values() for t in r["ticks"]]
            gaps = [g for r in result.values() for g in r["gaps"]]
            if n not in bares:
                log(f"{n} sessions: bare model ...")
                bares[n] = _bare(model, n, repeats=20)
            bare = bares[n]
            total = sum(per_session)
            row = {
                "variant": variant,
                "format": fmt,
                "encode_workers": workers,
                "switch_interval_ms": 1000 * switch_s,
                "sessions": n,
                "frames_per_s_per_session_mean": statistics.mean(per_session),
                "frames_per_s_per_session_min": min(per_session),
                "frames_per_s_total": total,
                "tick_ms_p50": pct(ticks, 50),
                "tick_ms_p99": pct(ticks, 99),
                "frame_gap_ms_p99": pct(gaps, 99),
                "bare_tick_ms_p50": bare["tick_ms_p50"],
                "bare_frames_per_s_total": bare["frames_per_s_total"],
                "served_over_bare_throughput": total / bare["frames_per_s_total"],
                "engine_batches_per_s": batches / args.seconds,
                "engine_mean_batch": works / max(batches, 1),
                # time inside adapter.run_batch per batch, and the share of wall time spent there
                "engine_batch_ms_mean": 1000 * busy / max(batches, 1),
                "engine_busy_share": busy / args.seconds,
                # one batch's cycle split into model / engine post / hand-off + loop / wake (serve_profile.py)
                "profile": phases,
                "load_avg_1m": [load0, os.getloadavg()[0]],
                "predicted_frames_per_s_per_session": 1000 * model.geometry.frames_per_chunk / bare["tick_ms_p50"],
            }
            log(json.dumps(row))
            rows.append(row)
    report = {
        "benchmark": "world sessions through the real server and engine vs the bare adapter",
        "command": " ".join([sys.executable.split("/")[-1], "-m", "bench.world.bench_served", *sys.argv[1:]]),
        "model": args.model,
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": mp.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "credits": args.credits,
        "client_procs": args.client_procs,
        "per_message_deflate": args.deflate,
        "seconds": args.seconds,
        "kv_capacity": _kv_capacity(model, args.device),
        # how the adapter ran (e.g. MazeWorld's cuda_graphs / graph_buckets)
        "adapter": {k: v for k, v in model.describe().items() if k != "config"},
        "rows": rows,
    }
    emit(report, args.out)


if __name__ == "__main__":
    main()
