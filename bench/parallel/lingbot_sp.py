"""One LingBot-World session served with ``--sequence-parallel`` 1, 2 and 4 (issue 51, run 2;
bench/multi_gpu.sh step ``lingbot-sp``).

    python -m bench.parallel.lingbot_sp --checkpoint /tmp/lingbot-random-14b --out OUT/multi_gpu_lingbot_sp.json
    python -m bench.parallel.lingbot_sp --cpu --out /tmp/lingbot_sp.json     # CPU rehearsal: tiny, gloo

For each rank count N (``--ranks``, in order, 1 first: it is what the others are divided by) a
``realtime serve --models 'lingbot=CKPT?size=HxW' --sequence-parallel N`` process of its own
(ranks 1..N-1 started by the server on GPUs 1..N-1), and one world.v1 client session on it
with a first image:

``chunk``  ``--warmup`` chunks (the sink and window fill), then ``--chunks`` timed with two
           credits ahead: each 12-frame chunk's ``tick_ms`` (the server's tick) and the period
           between chunk headers at the client.
``ttff``   key press to first frame, ``--presses`` times: the session idle (no credit), a
           keys event and one credit sent together, the first frame of the chunk that
           applies it timed from the press.

Then the ratios of each N's medians to N = 1's (goals: <= 0.55 at 2, <= 0.3 at 4). The
checkpoint is full size with random weights (``bench/parallel/random_lingbot.py``, written
first when missing); ``--cpu`` writes and serves the tiny one at ``--size 32x32`` on gloo
ranks with one torch thread each. Every N is a fresh process, so each pays its own load
(recorded as ``start_s``); an N that would start after ``--budget-s`` is skipped, named.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import httpx

from bench.parallel.random_lingbot import MARK as RANDOM_MARK
from bench.parallel.random_lingbot import write as write_checkpoint
from bench.parallel.record import gpus, step_report, wait_gpus_idle
from bench.report import emit
from deploy.server_process import ServerProcess

# Goals of issue 51: N ranks' chunk time (and key to frame) over one rank's.
GOALS = {2: 0.55, 4: 0.3}
START = time.monotonic()


def log(msg: str) -> None:
    print(f"[lingbot_sp {time.monotonic() - START:6.1f}s] {msg}", file=sys.stderr, flush=True)


def med(xs: Sequence[float]) -> float | None:
    return round(statistics.median(xs), 2) if xs else None


def is_checkpoint(folder: str) -> bool:
    """Whether ``folder`` already holds a whole LingBot checkpoint (random or real)."""
    from models.world.lingbot.checkpoint import validate_checkpoint

    try:
        validate_checkpoint(folder)
    except ValueError:
        return False
    return True


def models_entry(addr: str, name: str) -> dict[str, Any]:
    """The ``/v1/models`` entry of ``name``."""
    data = httpx.get(f"http://{addr}/v1/models", timeout=30).json()["data"]
    return next(m for m in data if m["id"] == name)


async def measure(addr: str, size: tuple[int, int], warmup: int, chunks: int, presses: int) -> dict[str, Any]:
    # The world.v1 client of bench_lingbot: a reader task stamps each chunk's header and frames.
    from bench.world.bench_lingbot import Stream, first_image, periods, stream_chunks

    lead = 2
    url = f"ws://{addr}/v1/realtime/world"
    s = await Stream.open(url, "sp", first_image(*size), credits=lead, seed=1)
    try:
        frames_per_chunk = s.created["frames_per_chunk"]
        t0 = time.monotonic()
        await stream_chunks(s, warmup, lead)   # the last ``lead`` are not credited back ...
        await s.credit(lead)                   # ... so the timed run keeps two ahead again
        timed = await stream_chunks(s, chunks, lead)
        log(f"{warmup + chunks} chunks in {time.monotonic() - t0:.1f} s")
        await s.drain()
        rows = []
        for i in range(presses):
            eid, t_press = await s.press(["d"] if i % 2 == 0 else ["a"])
            await s.credit(1)
            c = await s.next_chunk()
            await s.expect("event.accepted")
            if eid not in c.header["applied_event_ids"]:
                raise RuntimeError(f"press {eid} not applied by the next chunk: {c.header}")
            rows.append({"ttff_ms": round(1e3 * (c.t_first - t_press), 2),
                         "last_frame_ms": round(1e3 * (c.t_last - t_press), 2), "tick_ms": c.header["tick_ms"]})
        frames = [c.header["frames"] for c in timed]
        return {
            "frames_per_chunk": frames_per_chunk,
            "chunk_frames": sorted(set(frames)),
            "chunk_tick_ms": [round(c.header["tick_ms"], 2) for c in timed],
            "chunk_tick_ms_median": med([c.header["tick_ms"] for c in timed]),
            "chunk_period_ms": [round(p, 2) for p in periods(timed)],
            "chunk_period_ms_median": med(periods(timed)),
            "chunk_indexes_contiguous": all(b.header["chunk_index"] == a.header["chunk_index"] + 1
                                            for a, b in zip(timed, timed[1:])),
            "ttff": rows,
            "ttff_ms_median": med([r["ttff_ms"] for r in rows]),
        }
    finally:
        await s.close()


def one_rank_count(args: argparse.Namespace, ranks: int) -> dict[str, Any]:
    entry = f"lingbot={args.checkpoint}?size={args.size[0]}x{args.size[1]}"
    serve_args = ["--sequence-parallel", str(ranks), "--max-batch", "1"]
    row: dict[str, Any] = {"ranks": ranks, "serve": ["realtime", "serve", "--models", entry, "--policy", "",
                                                     "--no-tts", "--device", args.device, *serve_args]}
    row["waited_for_idle_gpus_s"] = wait_gpus_idle()
    log(f"{ranks} rank(s): starting {entry} ...")
    started = time.monotonic()
    with ServerProcess(models=entry, policy="", device=args.device, start_timeout_s=args.start_timeout,
                       serve_args=serve_args) as server:
        row["start_s"] = round(time.monotonic() - started, 1)
        model = models_entry(server.addr, "lingbot")
        row["model"] = {k: model.get(k) for k in ("sequence_parallel", "height", "width", "frames_per_chunk",
                                                   "device", "dtype", "denoising_steps", "max_sessions",
                                                   "tokens_per_latent_frame", "checkpoint")}
        if model.get("sequence_parallel") != ranks:
            raise RuntimeError(f"/v1/models says sequence_parallel {model.get('sequence_parallel')}, asked {ranks}")
        log(f"{ranks} rank(s): up in {row['start_s']} s; {args.warmup} + {args.chunks} chunks, {args.presses} presses")
        row.update(asyncio.run(measure(server.addr, args.size, args.warmup, args.chunks, args.presses)))
        row["server_problems"] = server.problems()[:5]
    log(f"{ranks} rank(s): chunk {row['chunk_tick_ms_median']} ms, key to first frame {row['ttff_ms_median']} ms")
    return row


def ratios(rows: dict[int, dict[str, Any]], goals_apply: bool) -> dict[str, Any]:
    """Each N's medians over N = 1's, beside the goal."""
    base = rows.get(1)
    out: dict[str, Any] = {}
    if base is None or "chunk_tick_ms_median" not in base:
        return {"missing": "no one-rank figures to divide by"}
    for n, row in rows.items():
        if n == 1 or "chunk_tick_ms_median" not in row:
            continue
        chunk = row["chunk_tick_ms_median"] / base["chunk_tick_ms_median"]
        ttff = row["ttff_ms_median"] / base["ttff_ms_median"] if base["ttff_ms_median"] else None
        goal = GOALS.get(n)
        out[str(n)] = {"chunk_over_1": round(chunk, 3), "ttff_over_1": round(ttff, 3) if ttff else None,
                       "goal": f"<= {goal}x one rank" if goal else None,
                       "within_goal": ((chunk <= goal and ttff is not None and ttff <= goal)
                                       if goal and goals_apply else None)}
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="rehearse on CPU: the tiny checkpoint, gloo ranks")
    parser.add_argument("--checkpoint", default=None,
                        help="a LingBot checkpoint folder, served as it is when whole; else written there with "
                             "random weights "
                             "(default /tmp/lingbot-random-14b, /tmp/lingbot-random-tiny with --cpu)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--size", default=None, help="HxW (default 480x832, 32x32 with --cpu)")
    parser.add_argument("--warmup", type=int, default=None, help="chunks before the timed ones (default 6; 2 with --cpu)")
    parser.add_argument("--chunks", type=int, default=None, help="timed chunks (default 4; 3 with --cpu)")
    parser.add_argument("--presses", type=int, default=3)
    parser.add_argument("--start-timeout", type=float, default=400.0, help="seconds for a server to load")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="no rank count starts after this many seconds (default 400; none with --cpu)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    cpu = args.cpu
    args.device = "cpu" if cpu else "cuda"
    args.checkpoint = args.checkpoint or ("/tmp/lingbot-random-tiny" if cpu else "/tmp/lingbot-random-14b")
    args.size = tuple(int(v) for v in (args.size or ("32x32" if cpu else "480x832")).split("x"))
    args.warmup = args.warmup if args.warmup is not None else (2 if cpu else 6)
    args.chunks = args.chunks if args.chunks is not None else (3 if cpu else 4)
    args.budget_s = args.budget_s if args.budget_s is not None else (None if cpu else 400.0)
    if cpu:
        # One torch thread a rank: 4 gloo ranks on a small machine do not fight over its cores.
        os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    t = time.monotonic()
    mark = Path(args.checkpoint) / RANDOM_MARK
    random_weights = mark.is_file() or not is_checkpoint(args.checkpoint)   # a real one is served as it is
    if random_weights:
        write_checkpoint(args.checkpoint, tiny=cpu)
    checkpoint_s = round(time.monotonic() - t, 1)
    rows: dict[int, dict[str, Any]] = {}
    skipped: list[str] = []
    out = {"question": "one LingBot-World session over 1, 2, 4 GPUs with sequence parallel: 12-frame chunk time "
                       "and key press to first frame against one GPU",
           "checkpoint": args.checkpoint,
           "random_weights": random_weights, "tiny": cpu,
           "size": f"{args.size[0]}x{args.size[1]}", "warmup_chunks": args.warmup, "timed_chunks": args.chunks,
           "presses": args.presses, "checkpoint_ready_s": checkpoint_s}
    if cpu:
        out["caveat"] = (f"CPU rehearsal: the tiny checkpoint (4 heads) at {args.size[0]}x{args.size[1]} on gloo "
                         f"ranks sharing {os.cpu_count()} cores, one torch thread each; the ratios say nothing "
                         "about GPUs and are no goal here")

    def save() -> None:
        results = {**out, "rows": [rows[n] for n in sorted(rows)], "ratios": ratios(rows, not cpu),
                   "skipped": skipped, "elapsed_s": round(time.monotonic() - START, 1)}
        emit(step_report("lingbot-sp", "bench.parallel.lingbot_sp", results, device=args.device, rehearsal=cpu),
             args.out, echo=False)

    visible = None if cpu else len(gpus())
    for n in args.ranks:
        if visible is not None and n > visible:
            skipped.append(f"{n} ranks: this machine has {visible} GPU(s)")
            continue
        if args.budget_s is not None and time.monotonic() - START > args.budget_s:
            skipped.append(f"{n} ranks: the budget of {args.budget_s:.0f} s was spent")
            continue
        try:
            rows[n] = one_rank_count(args, n)
        except Exception as exc:  # noqa: BLE001 - one rank count's failure is its row; the others still run
            log(f"{n} rank(s) failed: {type(exc).__name__}: {exc}")
            rows[n] = {"ranks": n, "error": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
        save()
    save()
    log(f"ratios: {json.dumps(ratios(rows, not cpu))}; wrote {args.out}")


if __name__ == "__main__":
    main()
