"""World frames/s with 1, 2, 3 replicas behind nginx vs direct connections, and the proxy's
added latency per chunk.

    python -m bench.deploy.bench_replicas --replicas 1 2 3 --sessions 12 \
        --out bench/results/deploy_replicas_cpu.json

For each replica count it starts that many ``realtime serve`` processes plus nginx
(deploy/replicas.py), then runs the same sessions for ``--seconds`` in ``--rounds``
alternating rounds: through nginx (``?session_id=``, hashed) and straight to the replicas
(session i to replica i mod N), counting the frames every client received. Latency: one session, one credit at a time, so
each chunk is asked for (a ``credit``) and answered with nothing queued; per chunk,
``round trip - tick_ms`` (the server's own tick time) is the transport's share, and its
difference between nginx and direct is what the proxy adds (two extra loopback hops: the
credit in, the chunk out). Direct and proxied chunks alternate (and so do the throughput
rounds) so that other load on the machine hits both alike.

Progress goes to stderr; the JSON holds hardware, versions and the command.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import sys
import time
from collections import Counter
from typing import Any

import numpy as np
import websockets

from deploy.nginx import find_nginx
from bench.report import emit
from deploy.replicas import Deployment
from protocols.routing import with_session_id

PATH = "/v1/realtime/world"


def log(msg: str) -> None:
    print(f"[bench_replicas {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


async def _stream(url: str, sid: str, credits: int, warmup: float, seconds: float) -> dict[str, Any]:
    """One session that credits every chunk at once; frames received in the measured window."""
    async with websockets.connect(with_session_id(url, sid), max_size=None, compression=None) as ws:
        # Through nginx its X-Upstream names the replica; straight to one, the URL does.
        upstream = ws.response.headers.get("X-Upstream", url.split("/")[2]).split(",")[-1].strip()
        await ws.send(json.dumps({"type": "session.create", "session_id": sid, "credits": credits,
                                  "format": "rgb8"}))
        created = json.loads(await ws.recv())
        assert created["type"] == "session.created", created
        start = time.perf_counter()
        frames, expected = 0, 0
        while True:
            data = json.loads(await ws.recv())
            if data["type"] != "chunk":
                continue
            assert data["chunk_index"] == expected, (sid, data["chunk_index"], expected)
            expected += 1
            for _ in range(data["frames"]):
                await ws.recv()
            await ws.send('{"type":"credit","chunks":1}')
            elapsed = time.perf_counter() - start
            if elapsed >= warmup + seconds:
                break
            if elapsed >= warmup:
                frames += data["frames"]
        await ws.send(json.dumps({"type": "session.close"}))
        return {"frames": frames, "upstream": upstream}


async def _throughput(urls: list[str], tag: str, sessions: int, credits: int, warmup: float,
                      seconds: float) -> dict[str, Any]:
    results = await asyncio.gather(*(_stream(urls[i % len(urls)], f"{tag}-{i}", credits, warmup, seconds)
                                     for i in range(sessions)))
    return {"frames_per_s_total": sum(r["frames"] for r in results) / seconds,
            "sessions_per_replica": sorted(Counter(r["upstream"] for r in results).values(), reverse=True)}


async def _latency(urls: dict[str, str], chunks: int, block: int) -> dict[str, dict[str, list[float]]]:
    """Round trip and tick time per chunk, one credit at a time, blocks alternating over ``urls``."""
    out: dict[str, dict[str, list[float]]] = {name: {"rtt_ms": [], "tick_ms": []} for name in urls}
    socks = {}
    for name, url in urls.items():
        sid = f"lat-{name}"
        ws = await websockets.connect(with_session_id(url, sid), max_size=None, compression=None)
        await ws.send(json.dumps({"type": "session.create", "session_id": sid, "credits": 0, "format": "rgb8"}))
        assert json.loads(await ws.recv())["type"] == "session.created"
        socks[name] = ws
    try:
        done = 0
        while done < chunks:
            for name, ws in socks.items():
                for _ in range(block):
                    sent = time.perf_counter()
                    await ws.send('{"type":"credit","chunks":1}')
                    data = json.loads(await ws.recv())
                    for _ in range(data["frames"]):
                        await ws.recv()
                    out[name]["rtt_ms"].append((time.perf_counter() - sent) * 1000)
                    out[name]["tick_ms"].append(data["tick_ms"])
            done += block
    finally:
        for ws in socks.values():
            await ws.close()
    return out


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--model", default="tiny", help="world model every replica serves")
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--credits", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3, help="alternating direct / nginx runs per replica count")
    parser.add_argument("--warmup", type=float, default=1.5)
    parser.add_argument("--latency-chunks", type=int, default=1000, help="per path (direct, nginx)")
    parser.add_argument("--latency-block", type=int, default=1, help="chunks per path before switching")
    parser.add_argument("--threads-per-replica", type=int, default=1,
                        help="torch CPU threads in each replica (OMP_NUM_THREADS), so replicas do not oversubscribe")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if find_nginx() is None:
        sys.exit("nginx not found (as root, `make nginx` installs Debian's package)")
    serve_args = ["--models", args.model, "--no-tts", "--policy", "", "--device", "cpu", "--log-level", "warning",
                  "--max-sessions-per-client", "0"]  # every client on loopback, one address
    rows = []
    latency: dict[str, Any] = {}
    for count in args.replicas:
        log(f"{count} replicas: starting ...")
        threads = str(args.threads_per_replica)
        with Deployment(count, serve_args=serve_args, env={"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}) as dep:
            direct = [f"ws://{r.addr}{PATH}" for r in dep.replicas]
            proxied = [f"ws://{dep.addr}{PATH}"]
            row: dict[str, Any] = {"replicas": count, "sessions": args.sessions, "rounds": args.rounds}
            runs: dict[str, list[float]] = {"direct": [], "nginx": []}
            for k in range(args.rounds):
                # Direct and nginx alternate, so that drifting load elsewhere hits both alike.
                for name, urls in (("direct", direct), ("nginx", proxied)):
                    log(f"{count} replicas, round {k + 1}/{args.rounds}, {name}: {args.sessions} sessions "
                        f"for {args.warmup + args.seconds:.0f} s ...")
                    result = asyncio.run(_throughput(urls, f"{name}{count}-{k}", args.sessions, args.credits,
                                                     args.warmup, args.seconds))
                    runs[name].append(result["frames_per_s_total"])
                    row[f"{name}_sessions_per_replica"] = result["sessions_per_replica"]
            for name, values in runs.items():
                row[f"{name}_frames_per_s_total_rounds"] = values
                row[f"{name}_frames_per_s_total_median"] = float(np.median(values))
            row["nginx_over_direct"] = row["nginx_frames_per_s_total_median"] / row["direct_frames_per_s_total_median"]
            log(json.dumps(row))
            rows.append(row)
            if count == args.replicas[0]:
                log(f"latency: {args.latency_chunks} chunks per path, one credit at a time ...")
                lat = asyncio.run(_latency({"direct": direct[0], "nginx": proxied[0]}, args.latency_chunks,
                                           args.latency_block))
                for name, series in lat.items():
                    transport = [r - t for r, t in zip(series["rtt_ms"], series["tick_ms"])]
                    latency[name] = {"chunks": len(transport),
                                     "round_trip_ms_p50": _pct(series["rtt_ms"], 50),
                                     "round_trip_ms_p99": _pct(series["rtt_ms"], 99),
                                     "transport_ms_p50": _pct(transport, 50),
                                     "transport_ms_p99": _pct(transport, 99)}
                latency["proxy_added_ms_p50"] = latency["nginx"]["transport_ms_p50"] - latency["direct"]["transport_ms_p50"]
                latency["proxy_added_ms_p99"] = latency["nginx"]["transport_ms_p99"] - latency["direct"]["transport_ms_p99"]
                # Chunk k through nginx minus chunk k direct, asked for one after the other: the
                # median of these pairs is less moved by load that drifts over the run.
                pairs = [(rn - tn) - (rd - td) for rn, tn, rd, td in zip(
                    lat["nginx"]["rtt_ms"], lat["nginx"]["tick_ms"], lat["direct"]["rtt_ms"], lat["direct"]["tick_ms"])]
                latency["proxy_added_ms_paired_median"] = _pct(pairs, 50)
                log(json.dumps(latency))
    nginx_version = os.popen(f"{find_nginx()} -v 2>&1").read().strip()
    report = {
        "benchmark": "world frames/s with N replicas behind nginx vs direct connections; nginx's added latency per chunk",
        "command": " ".join(["python", "-m", "bench.deploy.bench_replicas", *sys.argv[1:]]),
        "caveat": ("CPU-bound and noisy: every replica, nginx and the clients share the machine's "
                   f"{os.cpu_count()} cores with other work (load average {os.getloadavg()[0]:.1f} at the end), "
                   "so more replicas add no compute here, only a larger share of the contended cores "
                   "(one process per replica, one torch thread each), and every client runs in this one "
                   "Python process; the figures show the proxy's cost and the routing, not GPU scaling"),
        "model": args.model,
        "device": "cpu",
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": importlib.metadata.version("torch"),
        "python": platform.python_version(),
        "nginx": nginx_version,
        "credits": args.credits,
        "threads_per_replica": args.threads_per_replica,
        "seconds": args.seconds,
        "rows": rows,
        "latency_one_session_one_replica": latency,
    }
    emit(report, args.out)


if __name__ == "__main__":
    main()
