"""Two replicas on two GPUs behind nginx against one replica on one GPU, in one run, and one of
the two killed mid-run (issue 51, run 1; bench/multi_gpu.sh step ``replicas``).

    python -m bench.deploy.gpu_replicas --gpus 0 1 --sessions 64 --out OUT/multi_gpu_replicas.json
    python -m bench.deploy.gpu_replicas --cpu --sessions 4 --out /tmp/replicas.json    # CPU rehearsal

Two phases, each a ``Deployment`` (deploy/replicas.py: ``realtime serve`` processes, each with
its own ``CUDA_VISIBLE_DEVICES``, behind the shipped nginx config):

``one``  one replica on the first GPU; ``--sessions`` world sessions through nginx, every chunk
         credited back at once (``--credits`` ahead); frames received in ``--seconds`` after
         ``--warmup`` give the aggregate frames/s.
``two``  two replicas, one per GPU; the same sessions (new ids); the same window gives the
         aggregate frames/s and its ratio to ``one`` (goal >= 1.9 on GPUs). Then the replica
         holding the most sessions is killed (SIGKILL, as a crash or a lost GPU): its sessions
         must see the close docs/deploy.md documents for a dead replica (the socket drops, no
         close frame: 1006), every other session must keep streaming in order, and new
         sessions (fresh ids and the lost ones' ids) must land on the live replica and start
         at chunk 0.

The clients run in ``--client-procs`` processes of their own, so that reading 64 sessions'
frames does not make this process the bottleneck; they stamp each chunk with the system's
monotonic clock, which every process shares. Every session checks that its chunk indexes
are contiguous from 0. Progress goes to stderr; the JSON holds the machine and the command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import queue
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import websockets

from bench.parallel.record import gpus, step_report, wait_gpus_idle
from bench.report import emit
from deploy.nginx import find_nginx
from deploy.replicas import Deployment
from protocols.routing import with_session_id

PATH = "/v1/realtime/world"
# What docs/deploy.md ("When a replica dies") says a dead replica's sessions see: the socket
# drops with no close frame, which a WebSocket client reports as 1006.
CLOSE_NO_FRAME = 1006
# New sessions after the kill are opened this many at a time (each takes one chunk and closes).
FRESH_AT_ONCE = 8
# A session counts as streaming on after the kill when it gets a chunk this long after it.
AFTER_KILL_GRACE_S = 1.0


def log(msg: str) -> None:
    print(f"[gpu_replicas {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class SessionRecord:
    """What one client saw of its session: where nginx sent it, each chunk's arrival, how it ended."""

    session_id: str
    upstream: str = ""
    created: bool = False
    times: list[float] = field(default_factory=list)     # chunk arrivals, time.monotonic()
    frames: list[int] = field(default_factory=list)      # frames of each chunk
    contiguous: bool = True                              # chunk indexes 0, 1, 2, ... with no gap
    first_gap: list[int] | None = None                   # [expected, got] at the first break
    close_code: int | None = None
    close_reason: str = ""
    closed_at: float | None = None                       # when the server's side went away
    ended_by_client: bool = False
    errors: list[dict[str, Any]] = field(default_factory=list)   # world.v1 ``error`` messages


async def _session(url: str, sid: str, credits: int, stop: Any, ready: asyncio.Event) -> SessionRecord:
    rec = SessionRecord(sid)
    try:
        async with websockets.connect(with_session_id(url, sid), max_size=None, compression=None,
                                      open_timeout=60) as ws:
            # nginx's X-Upstream lists every replica it tried, the one that answered last.
            rec.upstream = ws.response.headers.get("X-Upstream", "").split(",")[-1].strip()
            await ws.send(json.dumps({"type": "session.create", "session_id": sid, "credits": credits,
                                      "format": "rgb8"}))
            created = json.loads(await asyncio.wait_for(ws.recv(), 120))
            if created.get("type") != "session.created":
                rec.errors.append(created)
                return rec
            rec.created = True
            ready.set()
            expected = 0
            while not stop.is_set():
                try:
                    async with asyncio.timeout(0.5):   # so that a session with nothing coming sees ``stop``
                        msg = await ws.recv()
                except TimeoutError:
                    continue
                data = json.loads(msg)
                if data.get("type") == "error":
                    rec.errors.append(data)
                    continue
                if data.get("type") != "chunk":
                    continue
                now = time.monotonic()
                if rec.contiguous and data["chunk_index"] != expected:
                    rec.contiguous, rec.first_gap = False, [expected, data["chunk_index"]]
                expected = data["chunk_index"] + 1
                for _ in range(data["frames"]):
                    await ws.recv()
                rec.times.append(now)
                rec.frames.append(data["frames"])
                await ws.send('{"type":"credit","chunks":1}')
            rec.ended_by_client = True
            await ws.send(json.dumps({"type": "session.close"}))
            try:
                async with asyncio.timeout(10):
                    while json.loads(await ws.recv()).get("type") != "session.closed":
                        pass
            except (asyncio.TimeoutError, websockets.ConnectionClosed, ValueError):
                pass
    except websockets.ConnectionClosed as exc:
        rec.closed_at = time.monotonic()
        rec.close_code = exc.rcvd.code if exc.rcvd is not None else CLOSE_NO_FRAME
        rec.close_reason = exc.rcvd.reason if exc.rcvd is not None else ""
    except (OSError, asyncio.TimeoutError, websockets.InvalidHandshake) as exc:
        rec.closed_at = time.monotonic()
        rec.errors.append({"type": "client", "message": f"{type(exc).__name__}: {exc}"})
    return rec


def _client_process(url: str, sids: list[str], credits: int, stop: Any, out: Any) -> None:
    """One client process: its share of the sessions, each told on ``out`` once created, then
    every record at the end."""

    async def main() -> None:
        events = [asyncio.Event() for _ in sids]
        tasks = [asyncio.create_task(_session(url, sid, credits, stop, ev)) for sid, ev in zip(sids, events)]
        pending = dict(zip(sids, events))
        while pending and not stop.is_set():
            for sid, ev in list(pending.items()):
                if ev.is_set() or tasks[sids.index(sid)].done():
                    out.put(("ready", sid))
                    del pending[sid]
            await asyncio.sleep(0.05)
        for rec in await asyncio.gather(*tasks):
            out.put(("record", asdict(rec)))

    asyncio.run(main())


class Clients:
    """``sessions`` world sessions on ``url``, spread over ``procs`` client processes."""

    def __init__(self, url: str, prefix: str, sessions: int, credits: int, procs: int) -> None:
        ctx = mp.get_context("spawn")
        self.stop = ctx.Event()
        self.out: Any = ctx.Queue()
        self.sids = [f"{prefix}-{i}" for i in range(sessions)]
        shares = [self.sids[i::procs] for i in range(max(1, min(procs, sessions)))]
        self.procs = [ctx.Process(target=_client_process, args=(url, share, credits, self.stop, self.out),
                                  daemon=True) for share in shares]
        self.records: dict[str, dict[str, Any]] = {}

    def start(self, timeout_s: float) -> float:
        """Start the clients and wait until every session was created (or failed); returns when."""
        for p in self.procs:
            p.start()
        ready: set[str] = set()
        deadline = time.monotonic() + timeout_s
        while len(ready) < len(self.sids):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"only {len(ready)} of {len(self.sids)} sessions created in {timeout_s:.0f} s")
            try:
                kind, value = self.out.get(timeout=min(1.0, remaining))
            except queue.Empty:
                continue
            if kind == "ready":
                ready.add(value)
            else:
                self.records[value["session_id"]] = value
        return time.monotonic()

    def finish(self, timeout_s: float = 60.0) -> dict[str, dict[str, Any]]:
        """Stop every session (the client closes it) and collect what each saw."""
        self.stop.set()
        deadline = time.monotonic() + timeout_s
        while len(self.records) < len(self.sids) and time.monotonic() < deadline:
            try:
                kind, value = self.out.get(timeout=1.0)
            except queue.Empty:
                continue
            if kind == "record":
                self.records[value["session_id"]] = value
        for p in self.procs:
            p.join(5.0)
            if p.is_alive():
                p.kill()
        return self.records


def frames_per_s(records: Sequence[dict[str, Any]], start: float, seconds: float) -> float:
    """Frames that arrived in ``[start, start + seconds)`` over all ``records``, per second."""
    end = start + seconds
    return sum(n for r in records for t, n in zip(r["times"], r["frames"]) if start <= t < end) / seconds


async def _fresh(addr: str, sid: str) -> dict[str, Any]:
    """A new session through nginx: where it landed and its first chunk's index."""
    row: dict[str, Any] = {"session_id": sid, "upstream": None, "first_chunk_index": None, "error": None}
    try:
        async with websockets.connect(with_session_id(f"ws://{addr}{PATH}", sid), max_size=None,
                                      open_timeout=30) as ws:
            row["upstream"] = ws.response.headers.get("X-Upstream", "").split(",")[-1].strip()
            await ws.send(json.dumps({"type": "session.create", "session_id": sid, "credits": 1, "format": "rgb8"}))
            async with asyncio.timeout(60):
                while True:
                    data = json.loads(await ws.recv())
                    if data.get("type") == "chunk":
                        row["first_chunk_index"] = data["chunk_index"]
                        for _ in range(data["frames"]):
                            await ws.recv()
                        break
                    if data.get("type") == "error":
                        row["error"] = data
                        break
            await ws.send(json.dumps({"type": "session.close"}))
    except Exception as exc:  # noqa: BLE001 - any failure is this session's row, not the run's end
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def summarise(records: Sequence[dict[str, Any]], start: float, seconds: float) -> dict[str, Any]:
    placed = Counter(r["upstream"] for r in records)
    return {
        "sessions": len(records),
        "sessions_created": sum(r["created"] for r in records),
        "frames_per_s_total": round(frames_per_s(records, start, seconds), 2),
        "frames_received": sum(sum(r["frames"]) for r in records),
        "sessions_per_replica": dict(sorted(placed.items())),
        "sessions_without_chunks": sum(not r["times"] for r in records),
        # Every session streamed, and each one's chunk indexes ran 0, 1, 2, ... with no gap.
        "all_chunks_contiguous": bool(records) and all(r["contiguous"] and r["times"] for r in records),
        "sessions_not_contiguous": [[r["session_id"], r["first_gap"]] for r in records if not r["contiguous"]],
        "errors": [[r["session_id"], e] for r in records for e in r["errors"]][:10],
    }


def run_one(args: argparse.Namespace, serve_args: list[str], env: dict[str, str]) -> dict[str, Any]:
    log(f"one replica on GPU {args.gpus[0]}: starting ...")
    with Deployment(1, gpus=args.gpus[:1], serve_args=serve_args, env=env) as dep:
        clients = Clients(f"ws://{dep.addr}{PATH}", "one", args.sessions, args.credits, args.client_procs)
        t_ready = clients.start(args.start_timeout)
        log(f"one replica: {args.sessions} sessions streaming; {args.warmup + args.seconds:.0f} s ...")
        time.sleep(max(0.0, t_ready + args.warmup + args.seconds - time.monotonic()))
        records = list(clients.finish().values())
    row = summarise(records, t_ready + args.warmup, args.seconds)
    row["gpus"] = args.gpus[:1]
    log(f"one replica: {row['frames_per_s_total']} frames/s, contiguous {row['all_chunks_contiguous']}")
    return row


def run_two(args: argparse.Namespace, serve_args: list[str], env: dict[str, str]) -> dict[str, Any]:
    waited = wait_gpus_idle()
    log(f"two replicas on GPUs {args.gpus[:2]}: starting ...")
    with Deployment(2, gpus=args.gpus[:2], serve_args=serve_args, env=env) as dep:
        clients = Clients(f"ws://{dep.addr}{PATH}", "two", args.sessions, args.credits, args.client_procs)
        t_ready = clients.start(args.start_timeout)
        log(f"two replicas: {args.sessions} sessions streaming; {args.warmup + args.seconds:.0f} s, then a kill ...")
        time.sleep(max(0.0, t_ready + args.warmup + args.seconds - time.monotonic()))
        # Where each session is, from a replica's own list: nginx's header is in the records,
        # which come back only at the end; /v1/sessions tells the victim now.
        held = {r.addr: _live_sessions(r.addr) for r in dep.replicas}
        victim = max(dep.replicas, key=lambda r: len(held[r.addr]))
        survivor = next(r for r in dep.replicas if r is not victim)
        t_kill = time.monotonic()
        victim.kill()
        log(f"killed replica {victim.spec.index} ({victim.addr}, GPU {victim.spec.gpu}) holding "
            f"{len(held[victim.addr])} sessions")
        time.sleep(AFTER_KILL_GRACE_S)
        lost = sorted(held[victim.addr])
        fresh_ids = [f"two-new-{i}" for i in range(args.fresh)] + lost
        fresh = asyncio.run(_gather_fresh(dep.addr, fresh_ids))
        time.sleep(max(0.0, t_kill + AFTER_KILL_GRACE_S + args.after_kill - time.monotonic()))
        records = list(clients.finish().values())
        survivor_alive = survivor.alive
    row = summarise(records, t_ready + args.warmup, args.seconds)
    row["gpus"] = args.gpus[:2]
    row["waited_for_idle_gpus_s"] = waited
    mine = [r for r in records if r["upstream"] == victim.addr]
    others = [r for r in records if r["upstream"] != victim.addr]
    after = t_kill + AFTER_KILL_GRACE_S
    closes = Counter(str(r["close_code"]) for r in mine)
    kill = {
        "victim": {"replica": victim.spec.index, "gpu": victim.spec.gpu, "addr": victim.addr},
        "victim_sessions": len(mine),
        "other_sessions": len(others),
        "victim_close_codes": dict(closes),
        "documented_close": "docs/deploy.md, When a replica dies: the socket drops with no close frame (1006)",
        # Each of the victim's sessions ended from the server's side, with the documented close.
        "victim_sessions_closed_as_documented": bool(mine) and all(
            not r["ended_by_client"] and r["close_code"] == CLOSE_NO_FRAME for r in mine),
        "victim_close_seen_ms_max": (round(1e3 * max(r["closed_at"] - t_kill for r in mine), 1)
                                     if mine and all(r["closed_at"] for r in mine) else None),
        # Every other session got chunks after the kill, in order, and was ended by its client only.
        "others_kept_streaming": bool(others) and all(
            r["ended_by_client"] and r["contiguous"] and any(t > after for t in r["times"]) for r in others),
        "others_chunks_after_kill_min": min((sum(t > after for t in r["times"]) for r in others), default=0),
        "others_frames_per_s_after_kill": round(frames_per_s(others, after, args.after_kill), 2),
        "new_sessions": len(fresh),
        "new_sessions_of_lost_ids": len(lost),
        "new_sessions_upstreams": dict(Counter(str(f["upstream"]) for f in fresh)),
        "new_sessions_on_live_replica": bool(fresh) and all(
            f["upstream"] == survivor.addr and f["first_chunk_index"] == 0 for f in fresh),
        "new_session_errors": [f for f in fresh if f["error"]][:5],
        "survivor_alive_at_end": survivor_alive,
    }
    row["kill"] = kill
    log(f"two replicas: {row['frames_per_s_total']} frames/s; kill: {json.dumps(kill)[:400]}")
    return row


async def _gather_fresh(addr: str, sids: list[str]) -> list[dict[str, Any]]:
    """``_fresh`` for each id, ``FRESH_AT_ONCE`` at a time: the survivor already holds its own
    sessions, and the lost ones arriving all at once could pass its session capacity (the
    maze's is 64), which would measure admission, not routing."""
    rows: list[dict[str, Any]] = []
    for i in range(0, len(sids), FRESH_AT_ONCE):
        rows += await asyncio.gather(*(_fresh(addr, sid) for sid in sids[i:i + FRESH_AT_ONCE]))
    return rows


def _live_sessions(addr: str) -> set[str]:
    import httpx

    try:
        data = httpx.get(f"http://{addr}/v1/sessions", timeout=10).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError):
        return set()
    return {s["session_id"] for s in data if s["kind"] == "world"}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true",
                        help="rehearse on CPU: --device cpu, one torch thread per replica, short windows")
    parser.add_argument("--gpus", nargs=2, default=["0", "1"], help="the two GPUs (CUDA_VISIBLE_DEVICES entries)")
    parser.add_argument("--model", default="maze", help="the world every replica serves")
    parser.add_argument("--device", default=None, help="default: cuda, or cpu with --cpu")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--credits", type=int, default=4)
    parser.add_argument("--warmup", type=float, default=None, help="seconds before the window (default 5; 2 with --cpu)")
    parser.add_argument("--seconds", type=float, default=None, help="the measured window (default 20; 5 with --cpu)")
    parser.add_argument("--after-kill", type=float, default=None,
                        help="seconds the others stream on after the kill (default 5; 3 with --cpu)")
    parser.add_argument("--fresh", type=int, default=8, help="new session ids started after the kill")
    parser.add_argument("--client-procs", type=int, default=None, help="default 8, 1 with --cpu")
    parser.add_argument("--max-batch", type=int, default=None, help="realtime serve --max-batch (default: its own)")
    parser.add_argument("--start-timeout", type=float, default=180.0, help="seconds for every session to be created")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    cpu = args.cpu
    args.device = args.device or ("cpu" if cpu else "cuda")
    args.warmup = args.warmup if args.warmup is not None else (2.0 if cpu else 5.0)
    args.seconds = args.seconds if args.seconds is not None else (5.0 if cpu else 20.0)
    args.after_kill = args.after_kill if args.after_kill is not None else (3.0 if cpu else 5.0)
    args.client_procs = args.client_procs or (1 if cpu else 8)
    if find_nginx() is None:
        sys.exit("nginx not found (as root, `make nginx` installs Debian's package)")
    if args.device != "cpu" and len(gpus()) < 2:
        sys.exit(f"two replicas on two GPUs need two GPUs; nvidia-smi lists {len(gpus())}")
    serve_args = ["--models", args.model, "--no-tts", "--policy", "", "--device", args.device,
                  "--log-level", "warning", "--max-sessions-per-client", "0",   # every client on one address
                  *(["--max-batch", str(args.max_batch)] if args.max_batch else [])]
    # On CPU each replica gets one torch thread, so two replicas do not oversubscribe the cores.
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"} if args.device == "cpu" else {}
    started = time.monotonic()
    one = run_one(args, serve_args, env)
    two = run_two(args, serve_args, env)
    ratio = two["frames_per_s_total"] / one["frames_per_s_total"] if one["frames_per_s_total"] else None
    results = {
        "question": "aggregate frames/s of 2 replicas on 2 GPUs behind nginx against 1 replica on 1 GPU, "
                    "and what a replica's death does to its sessions and the others",
        "model": args.model, "sessions": args.sessions, "credits": args.credits, "format": "rgb8",
        "warmup_s": args.warmup, "seconds": args.seconds, "after_kill_s": args.after_kill,
        "client_procs": args.client_procs, "serve_args": serve_args, "replica_env": env,
        "one_replica": one,
        "two_replicas": two,
        "two_over_one": round(ratio, 3) if ratio is not None else None,
        "goal": "two_over_one >= 1.9 on 2 GPUs",
        "goal_applies": not cpu,
        "within_goal": (ratio is not None and ratio >= 1.9) if not cpu else None,
        "all_chunks_contiguous": one["all_chunks_contiguous"] and two["all_chunks_contiguous"],
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    if cpu:
        results["caveat"] = (f"CPU rehearsal on {os.cpu_count()} shared cores: both replicas, nginx and the "
                             "clients share them, so the ratio says nothing about GPUs")
    emit(step_report("replicas", "bench.deploy.gpu_replicas", results, device=args.device, rehearsal=cpu),
         args.out, echo=False)
    log(f"two over one: {results['two_over_one']}; wrote {args.out}")


if __name__ == "__main__":
    main()
