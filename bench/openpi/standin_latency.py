"""What one robot pays the protocol per call for a pi0-sized request, ours vs the reference.

A stand-in policy that takes ``--infer-ms`` (default 19 ms, the bare pi0 call on the
H200) answers the reference probe's observation (three 224x224 cameras: a 452 KB
request). Each server runs alone in its own process (``bench_loopback.Server``: ours as
``realtime serve`` runs it, the policy on the engine thread; the reference is openpi's
``WebsocketPolicyServer`` as restated in ``reference_server.py``), and one real
``openpi-client`` robot, in a process of its own, makes ``--calls`` timed calls after
``--warmup`` untimed ones. The figure is the call's p50 minus the policy's time: the
request's way in, the hand-offs, the reply's way out and the client's own packing.
Servers alternate for ``--rounds`` rounds, the order flipped every round.

    python -m bench.openpi.standin_latency --rounds 4 --out bench/results/openpi_standin_latency.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.openpi.bench_loopback import Server, hardware, log, versions  # noqa: E402
from bench.report import emit  # noqa: E402

# The robot: prints its calls' latencies in ms, one per line.
ROBOT = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from bench.openpi.bench_loopback import make_obs
from openpi_client.websocket_client_policy import WebsocketClientPolicy
robot, obs = WebsocketClientPolicy(host=sys.argv[2]), make_obs(0)
for _ in range(int(sys.argv[3])):
    robot.infer(obs)
for _ in range(int(sys.argv[4])):
    t = time.perf_counter()
    robot.infer(obs)
    print((time.perf_counter() - t) * 1e3)
"""


def one_round(kind: str, args: argparse.Namespace) -> list[float]:
    with Server(kind, args.infer_ms) as server:
        out = subprocess.run([sys.executable, "-c", ROBOT, str(ROOT), server.uri, str(args.warmup), str(args.calls)],
                             capture_output=True, text=True, check=True, timeout=600).stdout
    return [float(x) for x in out.split()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--infer-ms", type=float, default=19.0, help="the stand-in policy's time per call")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--calls", type=int, default=150, help="timed calls per round")
    ap.add_argument("--warmup", type=int, default=20, help="untimed calls first")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    load_start = os.getloadavg()
    rounds: dict[str, list[dict[str, float]]] = {"ours": [], "reference": []}
    for r in range(args.rounds):
        for kind in ("ours", "reference") if r % 2 == 0 else ("reference", "ours"):
            ms = one_round(kind, args)
            p50 = statistics.median(ms)
            rounds[kind].append({"call_ms_p50": round(p50, 3), "protocol_ms_p50": round(p50 - args.infer_ms, 3),
                                 "calls": len(ms)})
            log(f"round {r}: {kind} call p50 {p50:.2f} ms, protocol {p50 - args.infer_ms:.2f} ms")
    summary = {k: round(statistics.median(x["protocol_ms_p50"] for x in v), 3) for k, v in rounds.items()}
    report: dict[str, Any] = {
        "benchmark": "openpi_standin_latency",
        "command": "python -m bench.openpi.standin_latency " + " ".join(sys.argv[1:]),
        "request": "the reference probe's observation: 3 cameras 224x224x3 uint8, state, prompt (~452 KB)",
        "policy": f"stand-in: sleeps {args.infer_ms:g} ms, zeros (50, 32) float32",
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
