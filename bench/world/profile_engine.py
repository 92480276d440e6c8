"""Where a served world tick's time goes, per thread: cProfile of the engine thread and the loop.

``bench_served`` says how much slower served is than bare and splits each batch's
cycle into phases (serve_profile.py); this says which functions fill those phases.
Every thread the server starts (the engine, uvicorn's event loop, the encoder pool)
gets its own ``cProfile`` from its first instruction; after the server has stopped,
each thread's top functions by own time are written out:

    python -m bench.world.profile_engine --model instant --sessions 8 --seconds 6 \
        --out bench/results/engine_profile_cpu.json

cProfile slows Python code several-fold, so read the shares, not the absolute times.
"""

from __future__ import annotations

import argparse
import cProfile
import platform
import pstats
import sys
import threading
import time
from typing import Any

from bench.report import emit
from bench.world.bench_served import _build_model
from bench.world.served_client import ClientFleet


def _top(prof: cProfile.Profile, n: int) -> dict[str, Any]:
    stats = pstats.Stats(prof)
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    for (path, line, func), (cc, nc, tt, ct, _) in sorted(stats.stats.items(),  # type: ignore[attr-defined]
                                                           key=lambda kv: kv[1][2], reverse=True)[:n]:
        short = "/".join(path.split("/")[-2:])
        rows.append({"function": f"{short}:{line}({func})", "calls": nc, "own_s": round(tt, 4),
                     "own_share": round(tt / total, 4) if total else None, "cumulative_s": round(ct, 4)})
    return {"total_s": round(total, 3), "top": rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="instant")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--format", default="rgb8")
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--thread", default="",
                        help="profile only threads whose name starts with this (e.g. 'engine'); from "
                             "Python 3.12 one profiler may be active per process, so there the first "
                             "matching thread is profiled and the others are not")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import torch

    from realtime.app import build_app
    from realtime.config import EngineConfig, LimitsConfig, ServerConfig, WorldConfig
    from realtime.registry import Inventory
    from realtime.server import serve_in_thread

    model = _build_model(args.model, args.device, 128, None, 2 * args.sessions)
    inventory = Inventory()
    inventory.adapters[model.name] = model
    config = ServerConfig(engine=EngineConfig(device=args.device, batch_wait_ms=20.0),
                          world=WorldConfig(models=(model.name,), max_batch=128, max_sessions=1024),
                          limits=LimitsConfig(max_sessions_per_client=0))  # every client on loopback
    profiles: dict[str, cProfile.Profile] = {}
    lock = threading.Lock()

    def start_profile(*_: Any) -> None:
        # Runs once in each new thread (threading.setprofile): enabling cProfile here
        # replaces this hook for that thread.
        name = threading.current_thread().name
        if not name.startswith(args.thread):
            sys.setprofile(None)  # this thread runs unprofiled (and without this hook)
            return
        prof = cProfile.Profile()
        try:
            prof.enable()
        except ValueError:  # Python >= 3.12: another thread's profiler is already active
            sys.setprofile(None)
            return
        with lock:
            profiles[name if name not in profiles else f"{name}#{len(profiles)}"] = prof

    threading.setprofile(start_profile)
    app = build_app(config, inventory)
    with serve_in_thread(app) as addr:
        threading.setprofile(None)  # the client fleet's own threads stay unprofiled
        fleet = ClientFleet(f"ws://{addr}/v1/realtime/world", args.sessions, args.client_procs, 4, 0.0,
                            args.seconds, args.format)
        fleet.start()
        t0 = time.perf_counter()
        sessions = fleet.results()
        wall = time.perf_counter() - t0
    frames = sum(r["frames"] for r in sessions.values())
    report = {
        "benchmark": "cProfile of the server's threads while world sessions stream",
        "command": " ".join([sys.executable.split("/")[-1], "-m", "bench.world.profile_engine", *sys.argv[1:]]),
        "model": args.model, "device": args.device, "sessions": args.sessions, "format": args.format,
        "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
        "python": platform.python_version(),
        "thread_filter": args.thread,
        "frames_per_s_total_under_profile": frames / max(wall, 1e-9),
        "threads": {name: _top(prof, args.top) for name, prof in profiles.items()
                    if pstats.Stats(prof).total_tt > 0.01},  # type: ignore[attr-defined]
    }
    emit(report, args.out)


if __name__ == "__main__":
    main()
