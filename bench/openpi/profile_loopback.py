"""Where a single robot's call spends its time: our endpoint vs the reference, same run.

Both servers run the bench's dummy policy (0 ms) in their own process, as in
``bench_loopback.py``, with probes patched in from here (nothing in realtime/ or
models/ changes):

* socket boundary, for both servers: asyncio's socket transport is wrapped, so
  every read (a chunk of the ~452 KB request) and every write (the reply) is
  time-stamped. Per call, *residence* = reply write - last request read: the
  whole server-side cost after the request's last byte arrived. The rest of the
  round trip (client pack/unpack, kernel, the request trickling in) is the same
  code for both servers.
* stages, relative to the last read. Ours: when Starlette's ``receive`` hands
  the message over, ``decode_request`` in/out, ``Engine.submit`` in/out (the hop
  to the engine thread and back), ``send_bytes`` called. The reference: when
  ``recv`` hands the message over, ``send`` called.
* the server's minor page faults per call (/proc), while the calls are timed;
* optionally (--cprofile) a cProfile of each server's event-loop thread over the
  timed calls, top functions by own time.

Each stage also has the loop thread's CPU time (``_cpu_us``): where it is below
the wall time, the loop thread waited (the hop to the engine thread and back).
``--servers ours-malloc reference-malloc`` adds the same servers started with
glibc's ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` raised (MALLOC_ENV).

    python -m bench.openpi.profile_loopback --calls 2000 --rounds 4 \
        --servers ours reference ours-malloc reference-malloc --out bench/results/openpi_loopback_profile.json

Probes cost a few microseconds per call on both sides; cProfile costs far more
(run it separately from the timing). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np

from bench.openpi.bench_loopback import REPO, _free_port, latency_round, log, pct, stop_process, wait_healthy
from bench.report import proc_stat

PATH = "/v1/realtime/robot/openpi"

# "<server>-malloc": glibc told (through its environment variables, read at process start)
# to keep freed blocks below 16 MiB in the heap rather than give them back to the kernel.
# By default each ~452 KB request buffer is freshly mapped (or the heap top trimmed and
# regrown) per call, and the page faults of touching it again cost more than the server's
# own work on this VM.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(16 << 20), "MALLOC_TRIM_THRESHOLD_": str(128 << 20)}
SERVERS = ("ours", "reference", "ours-malloc", "reference-malloc")


# ---------------------------------------------------------------- probes (server side)
class Probes:
    """Time stamps written on the event-loop thread; dumped on SIGUSR1."""

    def __init__(self, out: str, cprofile: bool) -> None:
        self.out = out
        # (what, perf_counter, this thread's CPU time, bytes or 0): wall time minus CPU time
        # between two marks is time the event-loop thread spent off the CPU (waiting).
        self.events: list[tuple[str, float, float, int]] = []
        self.profiler = None
        if cprofile:
            import cProfile

            self.profiler = cProfile.Profile()

    def mark(self, what: str, size: int = 0) -> None:
        self.events.append((what, time.perf_counter(), time.thread_time(), size))

    def install_socket(self) -> None:
        import asyncio.selector_events as se

        transport = se._SelectorSocketTransport
        read, write = transport._read_ready__data_received, transport.write
        probes = self

        def read_ready(self: Any) -> None:
            probes.mark("read")
            read(self)

        def write_(self: Any, data: Any) -> None:
            probes.mark("write", len(data))
            write(self, data)

        transport._read_ready__data_received = read_ready
        transport.write = write_

    def install_ours(self) -> None:
        from starlette.websockets import WebSocket

        import protocols.openpi as wire
        from realtime.engine import Engine

        probes = self
        receive, send_bytes, decode, submit = WebSocket.receive, WebSocket.send_bytes, wire.decode_request, Engine.submit

        async def receive_(self: Any) -> Any:
            message = await receive(self)
            probes.mark("starlette_receive")
            return message

        def decode_(*args: Any, **kwargs: Any) -> Any:
            probes.mark("decode_in")
            try:
                return decode(*args, **kwargs)
            finally:
                probes.mark("decode_out")

        async def submit_(self: Any, *args: Any, **kwargs: Any) -> Any:
            probes.mark("submit_in")
            try:
                return await submit(self, *args, **kwargs)
            finally:
                probes.mark("submit_out")

        async def send_bytes_(self: Any, data: bytes) -> None:
            probes.mark("send_bytes")
            await send_bytes(self, data)

        WebSocket.receive, WebSocket.send_bytes, wire.decode_request, Engine.submit = receive_, send_bytes_, decode_, submit_

    def install_reference(self) -> None:
        from websockets.asyncio.connection import Connection

        probes = self
        recv, send = Connection.recv, Connection.send

        async def recv_(self: Any, *args: Any, **kwargs: Any) -> Any:
            message = await recv(self, *args, **kwargs)
            probes.mark("ws_recv")
            return message

        async def send_(self: Any, *args: Any, **kwargs: Any) -> None:
            probes.mark("ws_send")
            await send(self, *args, **kwargs)

        Connection.recv, Connection.send = recv_, send_

    def arm(self) -> None:
        """SIGUSR2: warm-up is over; forget it and start the profiler."""

        def start(signum: int, frame: Any) -> None:
            self.events.clear()
            if self.profiler is not None:
                self.profiler.enable()

        def dump(signum: int, frame: Any) -> None:
            if self.profiler is not None:
                self.profiler.disable()
            summary = {"events": self.events}
            if self.profiler is not None:
                summary["cprofile"] = _top(self.profiler, 30)
            with open(self.out + ".tmp", "w") as f:
                json.dump(summary, f)
            os.replace(self.out + ".tmp", self.out)

        signal.signal(signal.SIGUSR2, start)
        signal.signal(signal.SIGUSR1, dump)


def _top(profiler: Any, n: int) -> list[dict[str, Any]]:
    import pstats

    stats = pstats.Stats(profiler)
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{os.path.relpath(file, REPO) if file.startswith(REPO) else file}:{line}({fn})",
                     "calls": nc, "tottime_ms": round(tt * 1000, 2), "cumtime_ms": round(ct * 1000, 2)})
    rows.sort(key=lambda r: -r["tottime_ms"])
    return rows[:n]


def serve(role: str, port: int, out: str, cprofile: bool) -> None:
    from bench.openpi import bench_loopback

    probes = Probes(out, cprofile)
    probes.install_socket()
    if role == "ours":
        probes.install_ours()
    else:
        probes.install_reference()
    probes.arm()
    if role == "ours":
        bench_loopback.serve_ours(port, 0.0, None)
    else:
        bench_loopback.serve_reference(port, 0.0)


# ---------------------------------------------------------------- analysis
def per_call(events: list[tuple[str, float, float, int]]) -> dict[str, list[float]]:
    """Cut the event stream at reply writes; microseconds after the last read, wall
    (``<stage>_us``) and the loop thread's CPU (``<stage>_cpu_us``).

    ::

        read read read ... [starlette_receive decode_in decode_out submit_in submit_out send_bytes] write
        |<- request in ->|<---------------------------- residence ------------------------------->|
    """
    out: dict[str, list[float]] = {}
    first_read = last_read = None
    stamps: dict[str, tuple[float, float]] = {}
    for what, t, cpu, size in events:
        if what == "read":
            if first_read is None:
                first_read = t
            last_read = (t, cpu)
        elif what == "write":
            if last_read is not None and first_read is not None and size > 1000:  # a reply, not a pong
                out.setdefault("request_in_us", []).append((last_read[0] - first_read) * 1e6)
                for k, (vt, vc) in [*stamps.items(), ("residence", (t, cpu))]:
                    out.setdefault(f"{k}_us", []).append((vt - last_read[0]) * 1e6)
                    out.setdefault(f"{k}_cpu_us", []).append((vc - last_read[1]) * 1e6)
            first_read = last_read = None
            stamps = {}
        elif last_read is not None:
            stamps[what] = (t, cpu)
    return out


def measure(server: str, calls: int, cprofile: bool, workdir: str) -> dict[str, Any]:
    role, _, tuned = server.partition("-")
    port = _free_port()
    out = os.path.join(workdir, f"probe_{server}_{os.getpid()}.json")
    args = [sys.executable, "-W", "ignore", "-m", "bench.openpi.profile_loopback", "--role", role,
            "--port", str(port), "--probe-out", out] + (["--cprofile"] if cprofile else [])
    env = {**os.environ, **(MALLOC_ENV if tuned == "malloc" else {})}
    proc = subprocess.Popen(args, cwd=REPO, stderr=subprocess.DEVNULL, env=env)
    try:
        base = f"127.0.0.1:{port}"
        wait_healthy(proc, base, role)
        uri = f"ws://{base}{PATH}" if role == "ours" else f"ws://{base}"
        latency_round(uri, 50, 50, 30.0)  # warm-up on its own connection
        proc.send_signal(signal.SIGUSR2)
        time.sleep(0.2)
        faults = proc_stat(proc.pid)[1]
        timed = latency_round(uri, 0, calls, 60.0)
        faults = (proc_stat(proc.pid)[1] - faults) / max(1, len(timed["rtt_ms"]))
        proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while not os.path.exists(out):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{role} server wrote no probes")
            time.sleep(0.05)
        with open(out) as f:
            dumped = json.load(f)
        os.remove(out)
    finally:
        stop_process(proc)
    stages = per_call([tuple(e) for e in dumped["events"]])
    result: dict[str, Any] = {"rtt_ms": pct(timed["rtt_ms"]), "server_minor_faults_per_call": round(faults, 1),
                              "server_us": {k: pct(v) for k, v in stages.items()}}
    if "cprofile" in dumped:
        result["cprofile_top_tottime"] = dumped["cprofile"]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=["bench", "ours", "reference"], default="bench", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--probe-out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--calls", type=int, default=2000, help="timed calls per server and round")
    ap.add_argument("--rounds", type=int, default=3, help="fresh server pair per round, order alternating")
    ap.add_argument("--servers", nargs="+", choices=SERVERS, default=["ours", "reference"],
                    help="which servers to measure, alternating; '-malloc': with MALLOC_ENV")
    ap.add_argument("--cprofile", action="store_true", help="also profile the servers' event loops (slower)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.role != "bench":
        serve(args.role, args.port, args.probe_out, args.cprofile)
        return

    import tempfile

    load_start = [round(x, 2) for x in os.getloadavg()]
    log(f"load average at start: {load_start}")
    names = list(args.servers)
    rounds: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                res = measure(name, args.calls, args.cprofile, workdir)
                rounds[name].append(res)
                log(f"round {r} {name}: rtt p50 {res['rtt_ms']['p50']} ms, residence p50 "
                    f"{res['server_us']['residence_us']['p50']} us")
    # The client (this process) runs with glibc's defaults throughout.
    report: dict[str, Any] = {
        "benchmark": "openpi_loopback_profile",
        "command": "python -m bench.openpi.profile_loopback " + " ".join(sys.argv[1:]),
        "load_average": {"start": load_start, "end": [round(x, 2) for x in os.getloadavg()]},
        "cprofile": args.cprofile,
        "malloc_env": MALLOC_ENV,
        "rounds": rounds,
        "median_of_rounds_p50": {
            name: {
                "rtt_ms": round(float(np.median([r["rtt_ms"]["p50"] for r in rs])), 3),
                "server_minor_faults_per_call": float(np.median([r["server_minor_faults_per_call"] for r in rs])),
                **{k: round(float(np.median([r["server_us"][k]["p50"] for r in rs])), 1) for k in rs[0]["server_us"]},
            }
            for name, rs in rounds.items()
        },
    }
    text = json.dumps(report, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
        log(f"wrote {args.out}")
    print(json.dumps(report["median_of_rounds_p50"], indent=2))


if __name__ == "__main__":
    main()
