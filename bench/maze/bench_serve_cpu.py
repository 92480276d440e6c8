"""The CPU demo measured end to end: a real ``realtime serve`` process, real world.v1 clients,
and the bare maze adapter in the same run.

    python -m bench.maze.bench_serve_cpu --out bench/results/maze_serve_cpu.json
    taskset -c 0,1 python -m bench.maze.bench_serve_cpu ...    # a 2-core pin on a bigger host
    python -m bench.maze.bench_serve_cpu --variants "" "--steps 1"  # the defaults, then 1 step

Phases, one after another so that they never compete for the cores:

1. bare: the maze adapter the server builds by default (``models.factory``, CPU, the
   server's defaults), ticked in this process: 1 session, then 4 sessions in one batch
   (the engine batches them the same way);
2. served: ``python -m realtime serve`` with its defaults (every default model loaded:
   maze, tiny, the policy, the voice) plus a variant's arguments; for each session count a
   client process opens that many sessions with ``clients.world.WorldClient`` (the
   project's Python client), asks for ``--format`` (jpeg, the page's), holds W, decodes
   every frame as the page does and hands one credit back per chunk; frames/s per session
   over ``--seconds`` after ``--warmup``;
3. bare again (the load on a shared machine drifts: both bare figures bracket the
   served ones; ``--no-bare-after`` skips it).

``--variants`` repeats all three for each string of extra ``realtime serve`` arguments.
``--page`` adds a served row per session count where one session is the demo page in real
Chromium (``bench/maze/page_pace.py``) beside the other sessions' Python clients: the frames
it drew and the chunks it received per second, and its stalls.

Every phase records the 1-minute load average before and after, the CPU seconds of the
server and client processes, and the CPU affinity (``taskset`` is inherited by the
server and the clients). Progress goes to stderr; the JSON holds the command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # also runnable as a script
    sys.path.insert(0, str(ROOT))

from bench.maze import page_pace  # noqa: E402
from bench.report import emit, proc_stat  # noqa: E402
from realtime.server.cli import openmp_defaults  # noqa: E402  (imports no torch)

KEYS = ("w",)


def log(msg: str) -> None:
    print(f"[bench_serve_cpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


# ---------------------------------------------------------------- bare adapter
def bare(sessions: int, ticks: int, serve_steps: int | None) -> dict[str, Any]:
    """The default CPU maze adapter alone: ``sessions`` sessions ticked together, committed."""
    import torch

    from models import factory
    from models.world.base import WorldTick
    from models.factory import BuildOptions

    # What realtime serve builds (realtime.server.inventory.build_inventory with the CLI's defaults).
    world = factory.build("maze", BuildOptions(device="cpu", max_batch=32, steps=serve_steps), kind="world")
    ids = [f"bare{i}" for i in range(sessions)]
    warm = world.window + 2  # the window fills before timing starts
    times, cpu = [], []
    for k in range(warm + ticks):
        works = [WorldTick(sid, f"{sid}:{k}", k, (), None, (frozenset(KEYS),), seed=i) for i, sid in enumerate(ids)]
        t0, c0 = time.perf_counter(), time.process_time()
        world.run_batch(works)
        for sid in ids:
            world.end_tick(sid, True)
        if k >= warm:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    for sid in ids:
        world.drop_session(sid)
    p50 = statistics.median(times)
    return {"sessions": sessions, "ticks": ticks, "torch_threads": torch.get_num_threads(),
            "details": {k: world.details()[k] for k in ("denoising_steps", "window_frames", "dtype")},
            "tick_ms_p50": 1000 * p50, "tick_ms_min": 1000 * min(times),
            "frames_per_s_per_session": 1 / p50, "frames_per_s_per_session_at_min_tick": 1 / min(times),
            "cpu_ms_per_tick_p50": 1000 * statistics.median(cpu),
            # CPU time per frame does not depend on how busy a shared machine is (wall time does)
            "cpu_ms_per_frame_p50": 1000 * statistics.median(cpu) / sessions}


def _bare_process(sessions: int, ticks: int, steps: int | None, queue: Any) -> None:
    queue.put(bare(sessions, ticks, steps))


def run_bare(sessions: int, ticks: int, steps: int | None) -> dict[str, Any]:
    """``bare`` in a fresh process (nothing of it stays resident beside the server)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    load0 = load1()
    proc = ctx.Process(target=_bare_process, args=(sessions, ticks, steps, queue))
    proc.start()
    out = queue.get(timeout=1800)
    proc.join(60)
    out["load_avg_1m"] = [load0, load1()]
    return out


# ---------------------------------------------------------------- clients
async def _session(url: str, sid: str, fmt: str, credits: int, warmup: float, seconds: float) -> dict[str, Any]:
    from clients.world import WorldClient

    async with WorldClient.connect(url, session_id=sid) as client:
        created = await client.create(credits=credits, format=fmt, seed=sum(map(ord, sid)) % 1000)
        await client.hold_keys(list(KEYS))
        start = time.perf_counter()
        frames, ticks, gaps, decode_ms, expected = 0, [], [], [], 0
        last = None
        while True:
            chunk = await client.next_chunk(timeout=120)
            assert chunk.chunk_index == expected, (chunk.chunk_index, expected)
            expected += 1
            d0 = time.perf_counter()
            decoded = chunk.frames()  # what the page does with every frame (createImageBitmap)
            now = time.perf_counter()
            if now - start >= warmup:
                frames += len(decoded)
                ticks.append(chunk.header["tick_ms"])
                decode_ms.append(1000 * (now - d0))
                if last is not None:
                    gaps.append(1000 * (now - last))
                last = now
            if now - start >= warmup + seconds:
                break
        await client.close()
    return {"sid": sid, "frames": frames, "seconds": seconds, "frames_per_s": frames / seconds,
            "chunks_total": expected, "fps_model": created["fps"], "tick_ms": ticks, "gap_ms": gaps,
            "decode_ms": decode_ms}


def _client_process(url: str, n: int, fmt: str, credits: int, warmup: float, seconds: float, queue: Any) -> None:
    async def main() -> list[dict[str, Any]]:
        return await asyncio.gather(*(_session(url, f"demo{i}", fmt, credits, warmup, seconds) for i in range(n)))

    c0 = time.process_time()
    out = asyncio.run(main())
    queue.put({"sessions": out, "client_cpu_s": time.process_time() - c0})


# ---------------------------------------------------------------- server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, serve_args: list[str]) -> tuple[subprocess.Popen, float]:
    # Every client is on loopback, one address: no per-client limit (a variant may set one).
    cmd = [sys.executable, "-m", "realtime", "serve", "--port", str(port), "--log-level", "warning",
           "--max-sessions-per-client", "0", *serve_args]
    log(f"starting {' '.join(cmd[1:])}")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"realtime serve exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                if r.status == 200:
                    return proc, time.perf_counter() - t0
        except OSError:
            pass
        if time.perf_counter() - t0 > 600:
            proc.kill()
            raise SystemExit("realtime serve did not become ready in 600 s")
        time.sleep(0.5)


def served(port: int, server_pid: int, n: int, args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    url = f"ws://127.0.0.1:{port}/v1/realtime/world"
    load0, s0 = load1(), proc_stat(server_pid)[0]
    t0 = time.perf_counter()
    proc = ctx.Process(target=_client_process, args=(url, n, args.format, args.credits, args.warmup, args.seconds,
                                                     queue))
    proc.start()
    res = queue.get(timeout=args.warmup + args.seconds + 600)
    proc.join(60)
    wall = time.perf_counter() - t0
    server_cpu = proc_stat(server_pid)[0] - s0
    per = [s["frames_per_s"] for s in res["sessions"]]
    ticks = [t for s in res["sessions"] for t in s["tick_ms"]]
    gaps = [g for s in res["sessions"] for g in s["gap_ms"]]
    decode = [d for s in res["sessions"] for d in s["decode_ms"]]
    fps_model = res["sessions"][0]["fps_model"]
    return {
        "sessions": n, "format": args.format, "credits": args.credits,
        "frames_per_s_per_session": per,
        "frames_per_s_per_session_mean": statistics.mean(per),
        "frames_per_s_per_session_min": min(per),
        "frames_per_s_total": sum(per),
        "model_fps": fps_model,
        # tick_ms: from the tick's submit to its result, as the server reports it in each chunk
        "server_tick_ms_p50": pct(ticks, 50), "server_tick_ms_p99": pct(ticks, 99),
        "frame_gap_ms_p50": pct(gaps, 50), "frame_gap_ms_p99": pct(gaps, 99),
        # gaps longer than the model's frame interval would stall a player pacing at fps
        "gaps_over_frame_interval_share": (sum(g > 1000 / fps_model for g in gaps) / len(gaps)) if gaps else None,
        "client_decode_ms_p50": pct(decode, 50),
        "server_cpu_s_per_s": server_cpu / wall,
        # over the whole run (warm-up included): the server's CPU per frame it sent
        "server_cpu_ms_per_frame": 1000 * server_cpu / max(1, sum(s["chunks_total"] for s in res["sessions"])),
        "client_cpu_s_per_s": res["client_cpu_s"] / wall,
        "load_avg_1m": [load0, load1()],
    }


def served_with_page(port: int, server_pid: int, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """The page as one of ``n`` sessions, the other ``n - 1`` the Python clients of ``served``
    (started first, and measured over a longer window that covers the page's)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    others = None
    if n > 1:
        others = ctx.Process(target=_client_process, args=(f"ws://127.0.0.1:{port}/v1/realtime/world", n - 1,
                                                           args.format, args.credits, args.warmup,
                                                           args.seconds + 15, queue))
        others.start()
    load0, s0, t0 = load1(), proc_stat(server_pid)[0], time.perf_counter()
    page = page_pace.measure_page(f"127.0.0.1:{port}", args.warmup, args.seconds)
    wall = time.perf_counter() - t0
    server_cpu = proc_stat(server_pid)[0] - s0
    row: dict[str, Any] = {"sessions": n, "format": "jpeg (the page's)", "page": page,
                           "server_cpu_s_per_s": server_cpu / wall, "load_avg_1m": [load0, load1()]}
    if others is not None:
        res = queue.get(timeout=args.warmup + args.seconds + 600)
        others.join(60)
        per = [s["frames_per_s"] for s in res["sessions"]]
        row["python_clients_frames_per_s"] = per
    return row


def split_variant(text: str) -> tuple[dict[str, str], list[str]]:
    """``"OMP_WAIT_POLICY=ACTIVE --steps 1"`` -> ({"OMP_WAIT_POLICY": "ACTIVE"}, ["--steps", "1"]):
    leading NAME=VALUE words are environment for the server and the bare process."""
    words = text.split()
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


def _steps(serve_args: list[str]) -> int | None:
    """The ``--steps`` a variant gives ``realtime serve`` (None: the server's default)."""
    return int(serve_args[serve_args.index("--steps") + 1]) if "--steps" in serve_args else None


def run_variant(text: str, args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """bare, served, bare again for one variant (environment and ``realtime serve`` arguments);
    (rows, server facts). The variant's environment holds for the whole variant."""
    env, serve_args = split_variant(text)
    saved = dict(os.environ)
    os.environ.update(env)  # inherited by the bare processes and the server
    try:
        return _run_variant(text.strip() or "defaults", env, serve_args, args)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _run_variant(variant: str, env: dict[str, str], serve_args: list[str],
                 args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    steps = _steps(serve_args)
    rows: list[dict[str, Any]] = []
    for n in args.sessions:
        log(f"[{variant}] bare adapter, {n} session(s) ...")
        rows.append({"variant": variant, "phase": "bare", **run_bare(n, args.bare_ticks, steps)})
        log(json.dumps(rows[-1]))
    port = free_port()
    proc, ready_s = start_server(port, serve_args)
    facts: dict[str, Any] = {"variant": variant, "env": env, "serve_args": serve_args, "server_ready_s": ready_s,
                             "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                             "gomp_spincount": os.environ.get("GOMP_SPINCOUNT")}
    log(f"[{variant}] server ready in {ready_s:.1f} s")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            facts["served_models"] = json.loads(r.read())
        for n in args.sessions:
            log(f"[{variant}] served, {n} session(s), {args.warmup + args.seconds:.0f} s ...")
            rows.append({"variant": variant, "phase": "served", **served(port, proc.pid, n, args)})
            log(json.dumps({k: v for k, v in rows[-1].items() if k != "frames_per_s_per_session"}))
            if args.page:
                log(f"[{variant}] the page in Chromium as 1 of {n} session(s) ...")
                rows.append({"variant": variant, "phase": "page", **served_with_page(port, proc.pid, n, args)})
                log(json.dumps(rows[-1]))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    if args.bare_after:
        for n in args.sessions:
            log(f"[{variant}] bare adapter again, {n} session(s) ...")
            rows.append({"variant": variant, "phase": "bare_after", **run_bare(n, args.bare_ticks, steps)})
            log(json.dumps(rows[-1]))
    return rows, facts


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant and session count: served frames/s beside the bare adapter's, and CPU per frame."""
    out: dict[str, Any] = {}
    for srv in (r for r in rows if r["phase"] == "served"):
        bare_rows = [r for r in rows if r["phase"] in ("bare", "bare_after") and r["variant"] == srv["variant"]
                     and r["sessions"] == srv["sessions"]]
        bares = [r["frames_per_s_per_session"] for r in bare_rows]
        bare_cpu = statistics.mean(r["cpu_ms_per_frame_p50"] for r in bare_rows)
        out.setdefault(srv["variant"], {})[str(srv["sessions"])] = {
            "served_frames_per_s_per_session_min": srv["frames_per_s_per_session_min"],
            "bare_frames_per_s_per_session": bares,
            "served_over_bare_mean": srv["frames_per_s_per_session_mean"] / statistics.mean(bares),
            "served_cpu_ms_per_frame": srv["server_cpu_ms_per_frame"],
            "bare_cpu_ms_per_frame": bare_cpu,
            "load_avg_1m": srv["load_avg_1m"],
        }
        page = next((r["page"] for r in rows if r["phase"] == "page" and r["variant"] == srv["variant"]
                     and r["sessions"] == srv["sessions"]), None)
        if page is not None:
            out[srv["variant"]][str(srv["sessions"])].update(
                page_frames_drawn_per_s=page["frames_drawn_per_s"],
                page_chunks_received_per_s=page["chunks_received_per_s"], page_stalls=page["stalls"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds per served row")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--bare-ticks", type=int, default=30)
    ap.add_argument("--no-bare-after", dest="bare_after", action="store_false",
                    help="skip the second bare measurement after the served rows")
    ap.add_argument("--format", choices=["jpeg", "png", "rgb8"], default="jpeg")
    ap.add_argument("--credits", type=int, default=4, help="the page's initial credit window")
    ap.add_argument("--variants", nargs="+", default=[""], metavar="SERVE_ARGS",
                    help="one run per entry, each a string of extra realtime serve arguments, optionally "
                         "after NAME=VALUE environment words (\"\" = the defaults; e.g. --variants \"\" "
                         "\"--steps 1\" \"OMP_WAIT_POLICY=ACTIVE\")")
    ap.add_argument("--page", action="store_true",
                    help="also play one of the sessions in the demo page in real Chromium")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.page and (why := page_pace.available()):
        raise SystemExit(f"--page: {why}")
    # What realtime serve sets before torch loads (realtime.server.cli.openmp_defaults), for the bare
    # processes too; a variant's own environment words come on top.
    openmp_defaults(os.environ)

    import torch

    report: dict[str, Any] = {
        "benchmark": "the default realtime serve on CPU through world.v1 vs the bare maze adapter",
        "command": " ".join(["python", "-m", "bench.maze.bench_serve_cpu",
                             *(repr(a) if a == "" or " " in a else a for a in sys.argv[1:])]),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cpu_count": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__, "python": platform.python_version(),
        "seconds": args.seconds, "warmup": args.warmup, "format": args.format,
    }
    log(f"affinity {report['cpu_affinity']}, load {load1()}")
    rows: list[dict[str, Any]] = []
    report["servers"] = []
    for text in args.variants:
        variant_rows, facts = run_variant(text, args)
        rows += variant_rows
        report["servers"].append(facts)
    report["rows"] = rows
    report["summary"] = summarise(rows)
    emit(report, args.out)


if __name__ == "__main__":
    main()
