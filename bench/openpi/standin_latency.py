"""What one robot pays the protocol per call for a pi0-sized request, ours vs the reference.

A stand-in policy that takes ``--infer-ms`` (default 19 ms, the bare pi0 call on the
H200) answers the reference probe's observation (three 224x224 cameras: a 452 KB
request). Each server runs alone in its own process (``bench_loopback.Server``: ours as
``realtime serve`` runs it, the policy on the engine thread; the reference is openpi's
``WebsocketPolicyServer`` as restated in ``reference_server.py``). The robots are
``bench_fleet``'s: real ``openpi-client`` processes. A server first serves
``--warmup-robots`` of them for ``bench_fleet.WARMUP_SECONDS``, uncounted (the reference's
heap settles, as in ``bench_fleet``), then one robot calls for ``--seconds``. The figure is
the call's p50 minus the policy's time: the request's way in, the hand-offs, the reply's
way out and the client's own packing. Servers alternate for ``--rounds`` rounds, the order
flipped every round.

    python -m bench.openpi.standin_latency --rounds 4 --out bench/results/openpi_standin_latency.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.openpi.bench_fleet import WARMUP_SECONDS, Fleet, measure_server  # noqa: E402
from bench.openpi.bench_loopback import Server, hardware, log, versions  # noqa: E402
from bench.report import emit  # noqa: E402


def one_round(fleet: Fleet, kind: str, r: int, args: argparse.Namespace) -> dict[str, Any]:
    with Server(kind, args.infer_ms) as server:
        if args.warmup_robots:
            measure_server(fleet, server, kind, args.warmup_robots, WARMUP_SECONDS, -1)
        m = measure_server(fleet, server, kind, 1, args.seconds, r)
    p50 = statistics.median(m["lat"])
    return {"call_ms_p50": round(p50, 3), "protocol_ms_p50": round(p50 - args.infer_ms, 3), "calls": m["calls"],
            "server_minor_faults_per_call": round(m["server_minor_faults"] / max(m["calls"], 1), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--infer-ms", type=float, default=19.0, help="the stand-in policy's time per call")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=3.0, help="timed seconds of the one robot per round")
    ap.add_argument("--warmup-robots", type=int, default=4, help="robots of the uncounted warm-up (0: none)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    load_start = os.getloadavg()
    rounds: dict[str, list[dict[str, Any]]] = {"ours": [], "reference": []}
    fleet = Fleet(max(1, args.warmup_robots))
    try:
        for r in range(args.rounds):
            for kind in ("ours", "reference") if r % 2 == 0 else ("reference", "ours"):
                row = one_round(fleet, kind, r, args)
                rounds[kind].append(row)
                log(f"round {r}: {kind} call p50 {row['call_ms_p50']:.2f} ms, protocol {row['protocol_ms_p50']:.2f} ms")
    finally:
        fleet.close()
    summary = {k: round(statistics.median(x["protocol_ms_p50"] for x in v), 3) for k, v in rounds.items()}
    report: dict[str, Any] = {
        "benchmark": "openpi_standin_latency",
        "command": "python -m bench.openpi.standin_latency " + " ".join(sys.argv[1:]),
        "request": "the reference probe's observation: 3 cameras 224x224x3 uint8, state, prompt (~452 KB)",
        "policy": f"stand-in: sleeps {args.infer_ms:g} ms, zeros (50, 32) float32",
        "warmup": f"{args.warmup_robots} robots for {WARMUP_SECONDS:g} s per server, uncounted",
        "rounds": rounds,
        "protocol_ms_p50_median_of_rounds": summary,
        "ratio_ours_over_reference": round(summary["ours"] / summary["reference"], 3),
        "hardware": hardware(),
        "versions": versions(),
        "load_average": {"start": [round(x, 2) for x in load_start], "end": [round(x, 2) for x in os.getloadavg()]},
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
