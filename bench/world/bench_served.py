"""World sessions served through the real server and engine vs the bare model.

For each session count N it starts N world.v1 clients (a separate process, real
WebSockets over loopback) against a uvicorn server in this process, measures
frames/s per session and in total plus the tick latency the server reports, and
then times the bare adapter on the same batch size in the same run:

    python -m bench.world.bench_served --model maze --device cuda --sessions 1 8 32 128 \
        --seconds 8 --out bench/results/world_served_h200.json

``--model instant`` answers every tick at once with a fixed maze frame (``--instant-ms``
sleeps per batch instead): the server's own cost, with no model time. ``--model maze-host``
is the maze's real host path on CPU with its device passes replaced by a wait as long as the
H200's (bench/world/host_maze.py): the H200's served-vs-bare gap on a CPU box.

Progress goes to stderr; the JSON holds hardware, versions and the command.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from bench.report import emit
from bench.world.serve_profile import ServeProfile
from bench.world.served_client import ClientFailure, ClientFleet
from models.world.base import WorldAdapter, WorldChunk, WorldGeometry, WorldTick


def log(msg: str) -> None:
    print(f"[bench_served {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


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
        from models.maze.sim import H, W, MazeSim

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
    if name == "maze-host":
        from bench.world.host_maze import HostPathMaze

        return HostPathMaze(max_batch=max_batch, max_sessions=max_sessions)
    if name == "tiny":
        from models.world.tiny import TinyWorld

        return TinyWorld(max_batch=max_batch, device=device)
    from models.world.maze.adapter import MazeWorld

    kwargs: dict[str, Any] = {"device": device, "max_batch": max_batch, "max_sessions": max_sessions}
    if steps is not None:
        kwargs["steps"] = steps
    return MazeWorld(**kwargs)


def _bare(model, n: int, repeats: int, warm: int | None = None) -> dict[str, float]:
    """Time the adapter alone on a batch of n sessions (commit each tick).

    The timed ticks start once every session's context window is full, as it is for the
    served sessions, which run hundreds of frames: a tick over a short context attends
    over fewer keys and would time the model faster than it serves.
    """
    import torch

    if warm is None:  # untimed ticks (MazeWorld: its context window)
        warm = 3 + getattr(model, "window", 0)

    def tick(i: int, k: int) -> WorldTick:
        return WorldTick(f"bare{i}", f"bare{i}:{k}", k, (), None,
                         tuple(frozenset("w") for _ in range(model.geometry.frames_per_chunk)), seed=i)

    times = []
    for k in range(repeats + warm):
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
        if k >= warm:
            times.append((time.perf_counter() - t0) * 1000)
    for i in range(n):
        model.drop_session(f"bare{i}")
    p50 = statistics.median(times)
    return {"tick_ms_p50": p50, "frames_per_s_total": n * model.geometry.frames_per_chunk * 1000 / p50,
            "untimed_ticks": warm}


@dataclass(frozen=True)
class RowPlan:
    """One row: a variant (``FORMAT[/mod...]``) at one session count."""

    variant: str
    format: str
    encode_workers: int
    switch_s: float
    sessions: int
    jpeg_path: str | None  # CUDA frames' jpeg path (realtime/media.py DeviceJpeg): forced, or None to measure
    ticks_in_flight: int = 1  # per session (WorldConfig.session_ticks_in_flight; ``ahead2``, ``auto``: 2)
    ticks_in_flight_alone: int | None = None  # WorldConfig.session_ticks_in_flight_alone (``auto``: 1)
    pin: bool = False  # server threads on --server-cpus, client processes on the rest (``pin``)


# ``gil<MS>`` (gil5, gil0.1, ...): that GIL switch interval in ms instead of the engine's.
MODS = {"gil5": "Python's 5 ms switch interval",
        "nvjpeg": "CUDA frames' jpeg on the GPU", "pil": "CUDA frames' jpeg on the CPU pool",
        "ahead2": "two ticks per session in flight: the next queued while one runs (--ticks-in-flight 2)",
        "auto": "two ticks in flight, one for a session alone on the server (--ticks-in-flight auto)",
        "pin": "the server's threads on --server-cpus, the client processes on every other core"}


def _on_engine(engine: Any, fn: Any, timeout_s: float = 300.0) -> Any:
    """``fn()`` on the engine thread (its control lane), from this thread; its value or error.

    The bare model must not run beside the engine thread: the served sessions' releases
    may still be running there, on the same KV pool.
    """
    done = threading.Event()
    box: dict[str, Any] = {}

    def job() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = exc
        finally:
            done.set()

    engine.post_control(job)
    if not done.wait(timeout_s):
        raise TimeoutError(f"the engine did not run the bare model in {timeout_s:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _gil_ms(mod: str) -> float | None:
    """The switch interval a ``gil<MS>`` mod names (ms), or None for another mod."""
    if not mod.startswith("gil"):
        return None
    try:
        ms = float(mod[3:])
    except ValueError:
        return None
    return ms if ms > 0 else None


def _switch_interval_s(args: argparse.Namespace) -> float:
    """The switch interval the server's engine sets: ``--switch-interval-ms`` or the config's default."""
    from realtime.server.config import EngineConfig

    return EngineConfig().switch_interval_s if args.switch_interval_ms is None else args.switch_interval_ms / 1000.0


def _plan(args: argparse.Namespace) -> list[RowPlan]:
    """Every row, in order (``--variants``)."""
    from realtime.media import default_workers
    from realtime.server.config import WorldConfig

    auto = WorldConfig()  # ``auto``: the server's default ticks in flight (--ticks-in-flight auto)
    rows = []
    for spec in args.variants or [args.format]:
        head, _, counts = spec.partition("@")
        fmt, *mods = head.split("/")
        gil = [_gil_ms(m) for m in mods if _gil_ms(m) is not None]
        if fmt not in ("rgb8", "jpeg", "png") or set(mods) - set(MODS) - {m for m in mods if _gil_ms(m)} \
                or {"nvjpeg", "pil"} <= set(mods) or len(gil) > 1:
            raise SystemExit(f"bad variant {spec!r}: FORMAT[/MOD...][@N,...], MOD one of {sorted(MODS)} "
                             "or gil<MS>")
        workers = default_workers() if args.encode_workers is None else args.encode_workers
        switch = gil[0] / 1000.0 if gil else (_switch_interval_s(args) or sys.getswitchinterval())
        path = "nvjpeg" if "nvjpeg" in mods else "pil" if "pil" in mods else None
        sessions = [int(c) for c in counts.split(",")] if counts else args.sessions
        rows += [RowPlan(head, fmt, workers, switch, n, path,
                         auto.session_ticks_in_flight if "auto" in mods else 2 if "ahead2" in mods else 1,
                         ticks_in_flight_alone=auto.session_ticks_in_flight_alone if "auto" in mods else None,
                         pin="pin" in mods) for n in sessions]
    return rows


def _kv_capacity(model: Any, device: str) -> dict[str, Any] | None:
    """The capacity formula (kv.plan_capacity) at the memory the server planned from: how
    many sessions fit, beside the pool this run built and the device memory in use now.

    The memory is the model's own plan's ``available_bytes`` (free after its weights
    loaded, before its pool), so the prediction is for a server started fresh; the
    device's free memory now (the pool allocated) would under-count by the pool.
    """
    geometry = getattr(model, "kv_geometry", None)
    if geometry is None:
        return None
    import torch

    from kv import plan_capacity

    built = getattr(model, "plan", None)
    cuda = device.startswith("cuda") and torch.cuda.is_available()
    available = getattr(built, "available_bytes", None) or (torch.cuda.mem_get_info()[0] if cuda else None)
    if available is None:
        return {"available_bytes": None}
    plan = plan_capacity(geometry, available_bytes=available, fraction=0.9, ticks_in_flight=model.max_batch)
    out: dict[str, Any] = {"available_bytes": available, "fraction": 0.9, "sessions": plan.capacity,
                           "required_one_bytes": plan.required_one_bytes,
                           "per_session_bytes": plan_capacity(geometry, None, requested_sessions=2,
                                                              ticks_in_flight=model.max_batch).required_bytes
                           - plan.required_one_bytes}
    if built is not None:
        out["built_pool"] = {"sessions": built.capacity, "required_bytes": built.required_bytes}
    if cuda:
        out["allocated_bytes_now"] = torch.cuda.memory_allocated()
    return out


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _gpu_memory() -> dict[str, int] | None:
    """Device memory now: allocated by torch, its peak since the last reset, and used in all."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return {"allocated_bytes": torch.cuda.memory_allocated(), "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
            "used_bytes": total - free, "total_bytes": total}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
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
    parser.add_argument("--bare-repeats", type=int, default=20)
    parser.add_argument("--instant-ms", type=float, default=0.0,
                        help="with --model instant: each batch sleeps this long (GPU time stand-in)")
    parser.add_argument("--client-procs", type=int, default=1,
                        help="client processes the sessions are spread over (the load must not be "
                             "the bottleneck: one Python process tops out near 1,000 chunks/s)")
    parser.add_argument("--format", choices=["rgb8", "jpeg", "png"], default="rgb8",
                        help="the frame format every client asks for")
    parser.add_argument("--switch-interval-ms", type=float, default=None,
                        help="the GIL switch interval the engine sets (EngineConfig.switch_interval_s; "
                             "0 keeps Python's 5 ms)")
    parser.add_argument("--encode-workers", type=int, default=None,
                        help="EncodeConfig.workers: jpeg/png encoder processes (0 encodes on the loop; "
                             "default: realtime.media.default_workers())")
    parser.add_argument("--variants", nargs="+", default=None,
                        help="rows to run, each FORMAT[/gil<MS>][@N,N,...]: "
                             "gil<MS> runs with that switch interval (gil5: Python's 5 ms), @ its own session counts "
                             "(default: --format at --sessions)")
    parser.add_argument("--server-cpus", default="0-3",
                        help="cores for the server's threads in ``pin`` rows (taskset's list syntax); "
                             "the clients get every other core")
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def _cpu_list(spec: str) -> list[int]:
    """taskset's list syntax (``0-3,8``) as core numbers."""
    cpus: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus += range(int(lo), int(hi or lo) + 1)
    return cpus


def _pin_process(cpus: list[int]) -> None:
    """Every thread of this process on ``cpus`` (threads started later inherit it from theirs)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # a thread that ended meanwhile
            pass


def _row(variant: str, fmt: str, workers: int, switch_s: float, n: int, args: argparse.Namespace,
         sessions: dict[str, dict[str, Any]], engine_delta: dict[str, float], phases: dict[str, Any],
         bare: dict[str, float], model: Any, load0: float) -> dict[str, Any]:
    per_session = [r["frames"] / args.seconds for r in sessions.values()]
    ticks = [t for r in sessions.values() for t in r["ticks"]]
    gaps = [g for r in sessions.values() for g in r["gaps"]]
    batches, works, busy = engine_delta["batches"], engine_delta["works"], engine_delta["busy"]
    total = sum(per_session)
    return {
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
        "bare_untimed_ticks": bare["untimed_ticks"],
        "bare_short_context_tick_ms_p50": bare["short_context_tick_ms_p50"],
        "served_over_bare_throughput": total / bare["frames_per_s_total"],
        "engine_batches_per_s": batches / args.seconds,
        "engine_mean_batch": works / max(batches, 1),
        # time inside adapter.run_batch per batch, and the share of wall time spent there
        "engine_batch_ms_mean": 1000 * busy / max(batches, 1),
        "engine_busy_share": busy / args.seconds,
        # one batch's cycle split into model / engine post / hand-off + loop / wake (serve_profile.py)
        "profile": phases,
        "gpu_memory": _gpu_memory(),
        "load_avg_1m": [load0, os.getloadavg()[0]],
        "predicted_frames_per_s_per_session": 1000 * model.geometry.frames_per_chunk / bare["tick_ms_p50"],
    }


def _capacity(model: Any, device: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Where memory and compute run out: the capacity formula beside the measured curve.

    Memory: ``kv.plan_capacity`` at the device's free memory (sessions whose KV fits).
    Compute: the bare model's best total frames/s over the model's own fps (sessions
    it can serve in real time). Measured: the first session count whose slowest
    session fell below the model's fps.
    """
    fps = model.geometry.fps
    best_bare = max((r["bare_frames_per_s_total"] for r in rows), default=float("nan"))
    served = sorted((r for r in rows if r["format"] == "rgb8" and "error" not in r), key=lambda r: r["sessions"])
    below = next((r["sessions"] for r in served if r["frames_per_s_per_session_min"] < fps), None)
    return {
        "model_fps": fps,
        "memory": _kv_capacity(model, device),
        "compute_sessions_at_model_fps": best_bare / fps,
        "measured_first_sessions_below_model_fps": below,
        "measured_max_sessions_tried": served[-1]["sessions"] if served else None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every row of ``args`` against one server in this process; the report (see the module doc)."""
    import torch

    from realtime.media import DeviceJpeg
    from realtime.server.app import build_app
    from realtime.server.config import EncodeConfig, EngineConfig, LimitsConfig, ServerConfig, WorldConfig
    from realtime.server.inventory import Inventory
    from realtime.server.server import serve_in_thread

    plan = _plan(args)
    # Room for every session of the largest run plus the bare-model sessions.
    model = _build_model(args.model, args.device, args.max_batch, args.steps, 2 * max(r.sessions for r in plan),
                         args.instant_ms)
    measured_jpeg = DeviceJpeg()  # the path picked by measurement on the first CUDA jpeg batch
    profile = ServeProfile()
    profile.attach(model)
    inventory = Inventory()
    inventory.adapters[model.name] = model
    # Every simulated client is on loopback, one address: no per-client limit.
    config = ServerConfig(engine=EngineConfig(device=args.device, batch_wait_ms=args.batch_wait_ms,
                                              switch_interval_s=_switch_interval_s(args)),
                          world=WorldConfig(models=(model.name,), max_batch=args.max_batch, max_sessions=1024),
                          encode=EncodeConfig(workers=args.encode_workers),
                          limits=LimitsConfig(max_sessions_per_client=0))
    rows: list[dict[str, Any]] = []

    def report() -> dict[str, Any]:
        return {
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
            "per_message_deflate": False,  # the server never compresses (realtime/server/server.py)
            "seconds": args.seconds,
            # the measured pick for CUDA frames (None: no jpeg row had CUDA frames to measure)
            "cuda_frames_jpeg": measured_jpeg.measurement,
            "capacity": _capacity(model, args.device, [r for r in rows if "error" not in r]),
            # how the adapter ran (e.g. MazeWorld's cuda_graphs / graph_buckets)
            "adapter": {k: v for k, v in model.describe().items() if k != "config"},
            "rows": rows,
            "complete": len(rows) == len(plan),
        }

    app = build_app(config, inventory)
    with serve_in_thread(app) as addr:
        url = f"ws://{addr}/v1/realtime/world"
        bares: dict[int, dict[str, float]] = {}
        all_cpus = sorted(os.sched_getaffinity(0))
        for p in plan:
            variant, fmt, workers, switch_s, n = p.variant, p.format, p.encode_workers, p.switch_s, p.sessions
            sys.setswitchinterval(switch_s)
            # Read by each new connection (realtime/endpoints/world.py): this row's sessions get it.
            app.state.config = dataclasses.replace(
                config, world=dataclasses.replace(config.world, session_ticks_in_flight=p.ticks_in_flight,
                                                  session_ticks_in_flight_alone=p.ticks_in_flight_alone))
            model.device_jpeg = measured_jpeg if p.jpeg_path is None else DeviceJpeg(p.jpeg_path)
            log(f"{variant}: {n} sessions: serving for {args.warmup + args.seconds:.0f} s ...")
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            client_cpus = None
            if p.pin:
                server_cpus = [c for c in _cpu_list(args.server_cpus) if c in all_cpus]
                client_cpus = [c for c in all_cpus if c not in server_cpus] or None
                _pin_process(server_cpus)
            else:
                _pin_process(all_cpus)
            fleet = ClientFleet(url, n, args.client_procs, args.credits, args.warmup, args.seconds, fmt,
                                client_cpus)
            try:
                fleet.start()  # every session created; their windows start now
            except ClientFailure as exc:
                log(f"{variant}: {n} sessions FAILED to start: {exc}")
                rows.append({"variant": variant, "format": fmt, "sessions": n, "error": str(exc)})
                continue
            # Engine batches over the clients' measured window: do the sessions tick together?
            time.sleep(args.warmup)
            stats = app.state.engine.stats
            batches0, works0, busy0 = stats.batches, stats.works, stats.busy_seconds
            load0 = os.getloadavg()[0]
            profile.start()
            time.sleep(args.seconds)
            phases = profile.stop()
            delta = {"batches": stats.batches - batches0, "works": stats.works - works0,
                     "busy": stats.busy_seconds - busy0}
            try:
                sessions = fleet.results()
            except ClientFailure as exc:
                log(f"{variant}: {n} sessions FAILED: {exc}")
                rows.append({"variant": variant, "format": fmt, "sessions": n, "error": str(exc)})
                continue
            if n not in bares:
                log(f"{n} sessions: bare model ...")
                _pin_process(all_cpus)  # the bare model alone, on every core whatever the row was
                bares[n] = _on_engine(app.state.engine, lambda: _bare(model, n, repeats=args.bare_repeats))
                # beside it, how this bench timed it before (3 untimed ticks: a context still filling)
                short = _on_engine(app.state.engine, lambda: _bare(model, n, repeats=args.bare_repeats, warm=3))
                bares[n]["short_context_tick_ms_p50"] = short["tick_ms_p50"]
            row = _row(variant, fmt, workers, switch_s, n, args, sessions, delta, phases, bares[n], model, load0)
            row["encode_processes"] = workers > 0
            row["ticks_in_flight"] = p.ticks_in_flight
            row["ticks_in_flight_alone"] = p.ticks_in_flight_alone
            row["server_cpus"] = sorted(os.sched_getaffinity(0))
            row["client_cpus"] = client_cpus or sorted(all_cpus)
            if fmt == "jpeg":
                # "pil" also when the frames are on the host: the server's pool encodes them.
                row["cuda_frames_jpeg_path"] = model.device_jpeg.path
            log(json.dumps(row))
            rows.append(row)
            if args.out:  # what is done so far survives a timeout of the whole run
                emit(report(), args.out, echo=False)
    return report()


def main() -> None:
    args = parse_args()
    report = run(args)
    emit(report, args.out)
    failed = [r for r in report["rows"] if "error" in r]
    if failed:
        raise SystemExit(f"{len(failed)} row(s) failed: see their 'error' in the report")


if __name__ == "__main__":
    main()
