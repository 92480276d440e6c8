"""OpenPI robot fleets on loopback: calls/s of our endpoint vs the reference, interleaved.

Both servers run at once, each in its own process, for the whole run, serving an
instant policy (zeros 50x32 float32, no delay: what is measured is the protocol's
own cost): ours is ``realtime/`` as ``realtime serve`` runs it (uvicorn, the
OpenPI endpoint, the engine thread, ``DummyPolicy``), the reference is openpi's
``WebsocketPolicyServer`` as restated in ``bench/openpi/reference_server.py``.

Robots are the real ``openpi-client`` ``WebsocketClientPolicy``, one process each
(a fleet of robots is a fleet of processes), kept alive between measurements and
told where to connect: each measurement opens fresh connections, makes a few
warm-up calls, then every robot calls as fast as it is answered from one shared
start instant for ``--seconds``. Calls that end after the window are not counted.

Rounds interleave the servers, ``for round: for clients in --clients: ours, reference``
with the order flipped every round, so the shared machine's load falls on both
alike. Per (server, clients): calls/s over all rounds (calls / seconds), the
per-round figures, p50/p99 per call, and the server process's CPU time per call
(/proc utime + stime). Ratios ours / reference: of the totals and the median of
the per-round ratios.

    python -m bench.openpi.bench_fleet --clients 1 4 16 --rounds 5 --seconds 3 --with-hop \
        --out bench/results/openpi_fleet.json

A before/after comparison in one run: ``--servers ours reference baseline --baseline
/path/to/other/checkout`` (its ``bench/openpi/bench_loopback.py`` starts its server).
``--no-uvloop`` runs ours on asyncio's loop, as on a host without uvloop (the reference
always is); ``ours-uvloop`` is ours on uvloop beside it.

Before the first round every server serves the largest fleet for ``--warmup-seconds``,
uncounted (``WARMUP_SECONDS`` says why); each measurement also records the server's
minor page faults per call.

Bounded: rounds x clients x 2 measurements of --seconds (+ ~1 s set-up each).
Progress goes to stderr. The load average is recorded at start and end.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench.openpi.bench_loopback import Server, hardware, log, make_obs, pct, versions  # noqa: E402
from bench.report import proc_stat  # noqa: E402

NAMES = ("ours", "reference")
# With --with-hop: ours again with the policy's inline forwards off (every forward handed
# to the engine thread and back), to show what running a fast policy inline is worth.
HOP = "ours-hop"
# With --baseline PATH: ours as another checkout (say main before a change) serves it, in
# the same run: a before/after comparison under the same load.
BASELINE = "baseline"
# With --no-uvloop, every one of ours runs on asyncio's loop (a host without uvloop, like the
# reference, which always does); "ours-uvloop" is ours with uvloop all the same.
UVLOOP = "ours-uvloop"
SERVERS = ("ours", "reference", HOP, BASELINE, UVLOOP)
WARMUP_CALLS = 5
# Before the first round, every server serves the largest fleet this long, uncounted. Without
# it the run's first window (ours, in round 0) measured 20-60% above the same server's later
# rounds, and the reference's glibc heap was still settling: its page faults per call fall
# from ~100 to ~1 at some point of its first thousands of calls, at no fixed count, which is
# what made its calls/s rise round after round (bench/results/openpi_fleet_epyc.json records
# faults per call; ours runs with fixed malloc thresholds, realtime/server/allocator.py).
WARMUP_SECONDS = 3.0


# ---------------------------------------------------------------- robots (child processes)
def _robot_main(conn: Any, idx: int) -> None:
    """One robot process: for each command (uri, start_at, seconds), connect, warm up,
    call from start_at for seconds, and send back the latencies (ms) of counted calls."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    obs = make_obs(idx)
    while True:
        cmd = conn.recv()
        if cmd is None:
            return
        uri, seconds = cmd
        try:
            robot = WebsocketClientPolicy(host=uri)
            for _ in range(WARMUP_CALLS):
                robot.infer(obs)
            conn.send(("ready", time.monotonic()))
            start_at = conn.recv()
            end_at = start_at + seconds
            while time.monotonic() < start_at:
                time.sleep(0.0005)
            lat: list[float] = []
            while True:
                t0 = time.monotonic()
                if t0 >= end_at:
                    break
                reply = robot.infer(obs)
                t1 = time.monotonic()
                if t1 > end_at:
                    break
                lat.append((t1 - t0) * 1000)
            if reply["actions"].shape != (50, 32):
                raise AssertionError(f"actions {reply['actions'].shape}")
            robot._ws.close()
            conn.send(("done", lat))
        except Exception as exc:  # noqa: BLE001 - reported in the JSON
            conn.send(("error", repr(exc)))


class Fleet:
    """``n`` robot processes, reused for every measurement."""

    def __init__(self, n: int) -> None:
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for i in range(n):
            here, there = ctx.Pipe()
            proc = ctx.Process(target=_robot_main, args=(there, i), daemon=True)
            proc.start()
            self.conns.append(here)
            self.procs.append(proc)

    def measure(self, uri: str, robots: int, seconds: float) -> dict[str, Any]:
        conns = self.conns[:robots]
        for c in conns:
            c.send((uri, seconds))
        errors = []
        for c in conns:
            kind, value = c.recv()
            if kind == "error":
                errors.append(value)
        if errors:
            return {"errors": errors}
        start_at = time.monotonic() + 0.2
        for c in conns:
            c.send(start_at)
        lats = []
        for c in conns:
            kind, value = c.recv()
            if kind == "error":
                errors.append(value)
            else:
                lats.append(value)
        return {"errors": errors, "lat": lats}

    def close(self) -> None:
        for c in self.conns:
            c.send(None)
        for p in self.procs:
            p.join(10)


# ---------------------------------------------------------------- main
def run(args: argparse.Namespace) -> dict[str, Any]:
    load_start = [round(x, 2) for x in os.getloadavg()]
    log(f"load average at start: {load_start}")
    names = tuple(args.servers) + ((HOP,) if args.with_hop and HOP not in args.servers else ())
    if BASELINE in names and not args.baseline:
        raise SystemExit("--servers baseline needs --baseline PATH (a checkout of the code to compare with)")
    if "ours" not in names or "reference" not in names:
        raise SystemExit("--servers must include ours and reference")
    servers = {name: Server(name, 0.0, repo=os.path.abspath(args.baseline) if name == BASELINE else REPO,
                            no_uvloop=args.no_uvloop and name not in ("reference", UVLOOP))
               for name in names}
    raw = measure_rounds(servers, names, args.clients, args.rounds, args.seconds, args.warmup_seconds)

    results: dict[str, Any] = {}
    for clients in args.clients:
        row: dict[str, Any] = {}
        for name in names:
            rs = raw[name][clients]
            calls = sum(x["calls"] for x in rs)
            row[name] = {
                "calls_per_s": round(calls / (args.seconds * len(rs)), 1),
                "rounds_calls_per_s": [round(x["calls_per_s"], 1) for x in rs],
                "rtt_ms": pct([y for x in rs for y in x["lat"]]),
                "server_cpu_ms_per_call": round(1000 * sum(x["server_cpu_s"] for x in rs) / max(calls, 1), 4),
                "server_minor_faults_per_call": round(sum(x["server_minor_faults"] for x in rs) / max(calls, 1), 2),
                "rounds_minor_faults_per_call": [round(x["server_minor_faults"] / max(x["calls"], 1), 2) for x in rs],
            }
        per_round = [o["calls_per_s"] / f["calls_per_s"] for o, f in zip(raw["ours"][clients], raw["reference"][clients])]
        row["ratio_calls_per_s_ours_over_reference"] = round(row["ours"]["calls_per_s"] / row["reference"]["calls_per_s"], 3)
        for name in names:
            if name not in ("ours", "reference"):
                key = name.replace("-", "_")
                row[f"ratio_calls_per_s_{key}_over_reference"] = round(
                    row[name]["calls_per_s"] / row["reference"]["calls_per_s"], 3)
                row[f"ratio_median_of_rounds_{key}"] = round(statistics.median(
                    o["calls_per_s"] / f["calls_per_s"] for o, f in zip(raw[name][clients], raw["reference"][clients])), 3)
        row["ratio_median_of_rounds"] = round(statistics.median(per_round), 3)
        row["ratio_rounds"] = [round(x, 3) for x in per_round]
        for q in ("p50", "p99"):
            row[f"ratio_{q}_ours_over_reference"] = round(row["ours"]["rtt_ms"][q] / row["reference"]["rtt_ms"][q], 3)
        results[str(clients)] = row
        log(f"{clients:>2} clients: ours {row['ours']['calls_per_s']} vs reference {row['reference']['calls_per_s']} "
            f"calls/s: {row['ratio_calls_per_s_ours_over_reference']}x (median of rounds "
            f"{row['ratio_median_of_rounds']}x)")
    load_end = [round(x, 2) for x in os.getloadavg()]
    return {
        "benchmark": "openpi_fleet",
        "command": "python -m bench.openpi.bench_fleet " + " ".join(sys.argv[1:]),
        "hardware": hardware(),
        "versions": versions(),
        "observation": {"cameras": 3, "image": [224, 224, 3], "state": 32, "prompt": True},
        "policy": "instant: actions zeros (50, 32) float32, no delay (ours: DummyPolicy; reference: its probe's)",
        "clients": "openpi-client WebsocketClientPolicy, one process per robot",
        "servers": list(names),
        "baseline": os.path.abspath(args.baseline) if args.baseline else None,
        "baseline_label": args.baseline_label,
        "no_uvloop": args.no_uvloop,
        "rounds": args.rounds,
        "seconds_per_measurement": args.seconds,
        "warmup_seconds_per_server": args.warmup_seconds,
        "results": results,
        "goals": {f"calls_per_s_at_least_reference_{c}_clients": results[str(c)]["ratio_calls_per_s_ours_over_reference"] >= 1.0
                  for c in args.clients},
        "load_average": {"start": load_start, "end": load_end},
        "notes": (f"All servers up for the whole run; measurements interleaved, order flipped each round. "
                  "ours answers this policy inline on its event loop once measured (realtime/engine/loop.py, 'Inline "
                  f"forwards'); {HOP} is the same server with that off (the hop to the engine thread and back); "
                  f"{BASELINE} is ours from the --baseline checkout; {UVLOOP} is ours on uvloop. "
                  f"Before round 0 every server served {max(args.clients)} robots for {args.warmup_seconds:g} s, "
                  "uncounted. "
                  f"uvloop {'hidden from' if args.no_uvloop else 'as installed for'} ours (--no-uvloop). "
                  f"Load average (1, 5, 15 min) {load_start} at start, {load_end} at end, on {os.cpu_count()} cores "
                  "shared with other jobs: robots, both servers and everything else share them."),
    }


def measure_rounds(servers: dict[str, Any], names: Sequence[str], clients_list: Sequence[int], rounds: int,
                   seconds: float, warmup_seconds: float = 0.0) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """``rounds`` windows of each robot count on each server (``measure_server``), the servers'
    order reversed every other round, after one uncounted window of ``warmup_seconds`` per
    server at the most robots (round -1 in the log); the fleet and then every server are
    stopped at the end."""
    fleet = Fleet(max(clients_list))
    raw: dict[str, dict[int, list[dict[str, Any]]]] = {n: {c: [] for c in clients_list} for n in names}
    try:
        if warmup_seconds > 0:  # not counted: see WARMUP_SECONDS
            for name in names:
                measure_server(fleet, servers[name], name, max(clients_list), warmup_seconds, -1)
        for r in range(rounds):
            order = list(names) if r % 2 == 0 else list(names)[::-1]
            for clients in clients_list:
                for name in order:
                    raw[name][clients].append(measure_server(fleet, servers[name], name, clients, seconds, r))
    finally:
        fleet.close()
        for server in servers.values():
            server.stop()
    return raw


def measure_server(fleet: "Fleet", server: Any, name: str, clients: int, seconds: float, round_no: int) -> dict[str, Any]:
    """One timed window of ``clients`` robots on ``server`` (anything with ``.proc`` and ``.uri``):
    calls, calls/s, the server process's CPU seconds and every call's latency; logged."""
    cpu0, faults0 = proc_stat(server.proc.pid)
    m = fleet.measure(server.uri, clients, seconds)
    cpu1, faults1 = proc_stat(server.proc.pid)
    cpu, faults = cpu1 - cpu0, faults1 - faults0
    if m["errors"]:
        raise RuntimeError(f"{name}, {clients} clients: {m['errors'][:3]}")
    calls = sum(len(x) for x in m["lat"])
    log(f"round {round_no} {name:>11} {clients:>2} clients: {calls / seconds:8.1f} calls/s, "
        f"server CPU {1000 * cpu / max(calls, 1):.3f} ms/call, {faults / max(calls, 1):.1f} page faults/call")
    return {"calls": calls, "calls_per_s": calls / seconds, "server_cpu_s": cpu, "server_minor_faults": faults,
            "lat": [y for x in m["lat"] for y in x]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0, help="timed seconds per measurement")
    ap.add_argument("--warmup-seconds", type=float, default=WARMUP_SECONDS,
                    help="uncounted seconds per server at the most robots before the first round (0: none)")
    ap.add_argument("--with-hop", action="store_true", help=f"also measure {HOP!r} (inline forwards off)")
    ap.add_argument("--servers", nargs="+", choices=SERVERS, default=list(NAMES),
                    help=f"which servers to measure (ours and reference always); {BASELINE!r} needs --baseline, "
                         f"{UVLOOP!r} is ours on uvloop whatever --no-uvloop says")
    ap.add_argument("--baseline", default=None, help=f"a checkout of this repository that serves {BASELINE!r}")
    ap.add_argument("--baseline-label", default=None, help="what the baseline is (a commit), for the JSON")
    ap.add_argument("--no-uvloop", action="store_true",
                    help="ours on asyncio's loop even where uvloop is installed (as on a host without it)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    report = run(args)
    from bench.report import emit

    emit(report, args.out, log=log)


if __name__ == "__main__":
    main()
