"""Fuzz benchmark: N hypothesis cases per protocol through each decoder and on live sockets.

    PYTHONPATH=$PWD python -m bench.fuzz.run_fuzz --cases 10000 --out bench/results/fuzz.json

Decoders: world.v1 (``parse_client`` + an event's track checks), tts.v1 (``parse_client``),
OpenPI (``parse_client``). Live: a real server process (``python -m realtime serve``:
tiny world, dummy policy, the voice when the tts extra is installed), one probe per
protocol (bench/fuzz/live.py), the server's whole log scanned for tracebacks at the end.
The JSON counts cases, outcomes (error codes, close codes, accepted types), crashes
(must be 0) with their first examples, and log problems (must be 0).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import sys
import time
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, Callable

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from bench.fuzz import cases
from bench.fuzz.decoders import Crash, decode_openpi, decode_tts, decode_world
from bench.fuzz.live import OpenPIProbe, TTSProbe, WorldProbe
from deploy.server_process import ServerProcess
from protocols import openpi

REPO = Path(__file__).resolve().parents[2]
# The decoder-level OpenPI policy (the live one uses the server's own metadata).
META = openpi.PolicyMetadata(action_horizon=4, action_dim=2, image_keys=("cam_high", "cam_wrist"),
                             image_resolution=(8, 8), state_dim=3)


class Tally:
    def __init__(self, name: str, total: int) -> None:
        self.name, self.total = name, total
        self.cases = 0
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.generators: collections.Counter[str] = collections.Counter()
        self.crashes: list[str] = []
        self.crash_count = 0
        self.started = time.perf_counter()

    def record(self, frame: cases.Frame, run: Callable[[cases.Frame], Any]) -> None:
        self.cases += 1
        self.generators[frame.label] += 1
        try:
            out = run(frame)
            self.outcomes.update(out if isinstance(out, list) else [out])
        except Crash as exc:
            self.crash_count += 1
            if len(self.crashes) < 20:
                self.crashes.append(str(exc)[:400])
        if self.cases % 1000 == 0 or self.cases == self.total:
            rate = self.cases / (time.perf_counter() - self.started)
            print(f"[fuzz] {self.name}: {self.cases}/{self.total} cases, {self.crash_count} crashes, "
                  f"{rate:.0f} cases/s", flush=True)

    def report(self) -> dict[str, Any]:
        return {"cases": self.cases, "crashes": self.crash_count, "crash_examples": self.crashes,
                "outcomes": dict(sorted(self.outcomes.items())), "generators": dict(sorted(self.generators.items())),
                "seconds": round(time.perf_counter() - self.started, 2)}


def drive(strategy: st.SearchStrategy[cases.Frame], n: int, tally: Tally, run: Callable[[cases.Frame], Any],
          random_seed: int) -> None:
    """Run ``n`` generated cases (generation only: a crash is recorded, not shrunk)."""

    @seed(random_seed)
    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one(frame: cases.Frame) -> None:
        if tally.cases < n:
            tally.record(frame, run)

    one()


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("hypothesis", "uvicorn", "websockets", "h11", "starlette", "msgpack", "numpy"):
        try:
            out[pkg] = importlib_metadata.version(pkg)
        except importlib_metadata.PackageNotFoundError:
            out[pkg] = "absent"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=10_000, help="cases per protocol, for decoders and live each")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--no-live", action="store_true", help="decoders only")
    parser.add_argument("--no-tts", action="store_true", help="skip live TTS (voice synthesis is the slow part)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "fuzz.json")
    args = parser.parse_args(argv)
    n = args.cases
    started = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "fuzz", "command": "python -m bench.fuzz.run_fuzz " + " ".join(argv or sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seed": args.seed,
        "hardware": {"machine": platform.machine(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "versions": versions(), "decoders": {}, "live": {},
    }
    valid_obs = cases.policy_metadata_template(META.to_wire())
    for name, strategy, run in (
        ("world.v1", cases.world_frames(), decode_world),
        ("tts.v1", cases.tts_frames(with_close=True), decode_tts),
        ("openpi", cases.openpi_frames(valid_obs), lambda f: decode_openpi(f, META)),
    ):
        tally = Tally(f"decoder {name}", n)
        drive(strategy, n, tally, run, args.seed)
        result["decoders"][name] = tally.report()

    if not args.no_live:
        with ServerProcess(tts=not args.no_tts) as server:
            models = {m["name"]: m for m in _get_json(f"http://{server.addr}/v1/models")["data"]}
            tts_live = not args.no_tts and any(m["kind"] == "tts" and m["available"] for m in models.values())
            openpi_probe = OpenPIProbe(server.addr)
            openpi_probe._connect()
            live_obs = cases.policy_metadata_template(openpi_probe.metadata)
            probes: list[tuple[str, Any, st.SearchStrategy[cases.Frame]]] = [
                ("world.v1", WorldProbe(server.addr), cases.world_frames()),
                ("openpi", openpi_probe, cases.openpi_frames(live_obs)),
            ]
            if tts_live:
                # No session.close in the mix: it ends the connection, which reconnecting covers.
                probes.insert(1, ("tts.v1", TTSProbe(server.addr), cases.tts_frames()))
            for name, probe, strategy in probes:
                tally = Tally(f"live {name}", n)
                drive(strategy, n, tally, probe.case, args.seed)
                probe.close()
                result["live"][name] = tally.report()
            if not tts_live:
                result["live"]["tts.v1"] = {"skipped": "the tts extra is not installed" if not args.no_tts
                                            else "--no-tts"}
            time.sleep(1.0)  # let the last closes be logged
            problems = server.problems()
            result["server"] = {"alive": server.alive, "healthz": "OK" if server.healthy() else "not OK",
                                "log_lines": len(server.log_text().splitlines()), "log_problems": len(problems),
                                "log_problem_examples": problems[:5]}
    result["crashes"] = sum(r.get("crashes", 0) for part in ("decoders", "live") for r in result[part].values())
    result["seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"[fuzz] {result['crashes']} crashes, log problems {result.get('server', {}).get('log_problems', '-')}; "
          f"wrote {args.out}", flush=True)
    ok = result["crashes"] == 0 and result.get("server", {}).get("log_problems", 0) == 0
    return 0 if ok else 1


def _get_json(url: str) -> Any:
    import httpx

    return httpx.get(url, timeout=10).json()


if __name__ == "__main__":
    sys.exit(main())
