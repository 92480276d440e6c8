"""What the event loop's Python costs a world batch while the batch is being set up (GIL hand-offs).

The engine thread and the event loop share one GIL. When the last session of batch k has
queued its next tick, the loop sends batch k's chunks (Python, uvloop holds the GIL through
its writes) while the engine thread sets up batch k+1. Every torch call drops the GIL and
must take it back from the loop: up to one switch interval each, so batch k+1's device work
starts late by up to the loop's whole send time. The bare model never pays it; on the H200
the served maze's ``model_ms`` grew by ~120 us per session over bare
(bench/results/world_serving_h200.json).

This measures it without a server: the adapter's ``run_batch`` + ``end_tick`` on a batch of
N sessions (as ``bench_served``'s bare model), alone and with a second thread that, at each
batch's start, runs ``--loop-ms`` of pure Python in ``--loop-slices`` slices (a stand-in for
the loop's chunk sends). It also counts the torch calls made from Python before the frame's
device work is launched (each one a GIL hand-off), with a ``TorchFunctionMode``:

    python -m bench.world.bench_gil_handoff --model maze-host --sessions 1 32 --loop-ms 3 \
        --out bench/results/gil_handoff_cpu.json

``--model maze`` with ``--device cuda`` times the real graph path (on the H200).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import threading
import time
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from bench.report import emit
from bench.world.bench_served import _build_model
from models.world.base import WorldTick
from models.world.maze.frame_graph import FrameRunner


class _Count(TorchFunctionMode):
    """Counts torch calls made from Python (each drops and retakes the GIL)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.at_launch: int | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        return func(*args, **(kwargs or {}))


def _ticks(model: Any, n: int, k: int) -> list[WorldTick]:
    F = model.geometry.frames_per_chunk
    return [WorldTick(f"g{i}", f"g{i}:{k}", k, (), None, tuple(frozenset("w") for _ in range(F)), seed=i)
            for i in range(n)]


def _loop_work(seconds: float, slices: int) -> None:
    """Pure Python for ``seconds`` in ``slices`` pieces (a chunk send each): holds the GIL."""
    per = seconds / slices
    for _ in range(slices):
        end = time.perf_counter() + per
        x = 0
        while time.perf_counter() < end:
            x += 1


def measure(model: Any, n: int, repeats: int, loop_ms: float, slices: int) -> dict[str, Any]:
    cuda = torch.cuda.is_available() and str(getattr(model, "device", "cpu")).startswith("cuda")
    go, stop = threading.Event(), threading.Event()
    done = threading.Event()

    def loop_thread() -> None:
        while True:
            go.wait()
            go.clear()
            if stop.is_set():
                return
            _loop_work(loop_ms / 1000.0, slices)
            done.set()

    worker = threading.Thread(target=loop_thread, name="loop-stand-in", daemon=True)
    worker.start()
    out: dict[str, Any] = {"sessions": n}
    k = 0
    try:
        for contended in (False, True, False, True):  # interleaved: drift hits both alike
            times = []
            for r in range(repeats + 2):
                works = _ticks(model, n, k)
                k += 1
                if cuda:
                    torch.cuda.synchronize()
                done.clear()
                t0 = time.perf_counter()
                if contended:
                    go.set()
                model.run_batch(works)
                for w in works:
                    model.end_tick(w.session_id, True)
                if cuda:
                    torch.cuda.synchronize()
                elapsed = time.perf_counter() - t0
                if contended:
                    done.wait()  # the next batch starts with a fresh send burst
                if r >= 2:
                    times.append(1000 * elapsed)
            key = "contended" if contended else "alone"
            out.setdefault(f"{key}_ms", []).extend(times)
        # Torch calls per batch, and how many of them come before the frame's launch.
        counter = _Count()
        run = FrameRunner.run

        def counted_run(self, *a, **kw):  # type: ignore[no-untyped-def]
            result = run(self, *a, **kw)
            counter.at_launch = counter.calls  # the replay (or the stand-in's clock) has started
            return result

        FrameRunner.run = counted_run  # type: ignore[method-assign]
        try:
            works = _ticks(model, n, k)
            with counter:
                model.run_batch(works)
                for w in works:
                    model.end_tick(w.session_id, True)
        finally:
            FrameRunner.run = run  # type: ignore[method-assign]
        out["torch_calls_per_batch"] = counter.calls
        out["torch_calls_before_launch"] = counter.at_launch
    finally:
        stop.set()
        go.set()
        worker.join(5)
        for i in range(n):
            model.release(f"g{i}")
    alone, cont = statistics.median(out.pop("alone_ms")), statistics.median(out.pop("contended_ms"))
    out.update(alone_ms_p50=alone, contended_ms_p50=cont, added_ms=cont - alone,
               added_share_of_loop=(cont - alone) / loop_ms if loop_ms else None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="maze-host")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--loop-ms", type=float, default=3.0, help="the loop's Python per batch (its sends)")
    parser.add_argument("--loop-slices", type=int, default=32, help="pieces of it (one per chunk sent)")
    parser.add_argument("--switch-interval-ms", type=float, default=None,
                        help="sys.setswitchinterval (default: realtime.engine.SWITCH_INTERVAL_S, the server's)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import realtime.engine

    switch = args.switch_interval_ms / 1000.0 if args.switch_interval_ms is not None else realtime.engine.SWITCH_INTERVAL_S
    if switch > 0:
        sys.setswitchinterval(switch)
    model = _build_model(args.model, args.device, 128, None, 2 * max(args.sessions))
    rows = []
    for n in args.sessions:
        row = measure(model, n, args.repeats, args.loop_ms, args.loop_slices)
        print(f"[gil_handoff] {row}", file=sys.stderr, flush=True)
        rows.append(row)
    import os

    emit({"benchmark": "world batch alone vs beside a thread running the loop's send Python (GIL hand-offs)",
          "command": " ".join([sys.executable.split("/")[-1], "-m", "bench.world.bench_gil_handoff", *sys.argv[1:]]),
          "model": args.model, "device": args.device, "loop_ms": args.loop_ms, "loop_slices": args.loop_slices,
          "switch_interval_ms": 1000 * sys.getswitchinterval(), "cpu": platform.processor() or platform.machine(),
          "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0], "torch": torch.__version__,
          "python": platform.python_version(),
          "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
          "rows": rows}, args.out)


if __name__ == "__main__":
    main()
