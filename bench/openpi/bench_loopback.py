"""OpenPI on loopback (CPU): our endpoint vs the reference ``openpi-server``, same run.

Both servers serve the same dummy policy (``actions`` zeros 50x32 float32, an
optional fixed delay per forward) to the real ``openpi-client`` with the same
observation (three 224x224x3 uint8 cameras, float32 state of 32, a prompt: the
reference probe's). Each server runs in its own process; each robot is its own
process too, as robots would be.

1. latency: one robot, 20 warm-ups, then timed calls (at most --calls or
   --seconds per round); each round starts fresh server processes, in a rotating
   order, to cancel drift and placement luck.
2. throughput: 16 robots at once against a policy that takes 50 ms per forward
   whatever its batch size; calls/s in total, p50/p99 per call, and /healthz
   latency polled during the run.
3. keepalive: the real client with its 20 s ping timeout squeezed to 0.3 s,
   against a 2 s inference (the reference drops the robot at its ping timeout).

    python -m bench.openpi.bench_loopback --out bench/results/openpi_loopback.json

Every measurement is bounded in calls and seconds. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATH = "/v1/realtime/robot/openpi"


def log(msg: str) -> None:
    print(f"[openpi_loopback {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_obs(seed: int) -> dict[str, Any]:
    """The benchmarks' observation (DROID-style: three 224x224 cameras, a 32-float state, a prompt)."""
    rng = np.random.default_rng(seed)
    return {
        "observation/exterior_image_1_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/exterior_image_2_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/state": rng.standard_normal(32).astype(np.float32),
        "prompt": "pick up the red block and put it in the bowl",
    }


def pct(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs, dtype=np.float64)
    if a.size == 0:
        return {"n": 0}
    return {"p50": round(float(np.percentile(a, 50)), 3), "p90": round(float(np.percentile(a, 90)), 3),
            "p99": round(float(np.percentile(a, 99)), 3), "mean": round(float(a.mean()), 3),
            "min": round(float(a.min()), 3), "max": round(float(a.max()), 3), "n": int(a.size)}


# ---------------------------------------------------------------- servers (child processes)
def ours_app(port: int = 0, infer_ms: float = 0.0, batch_wait_ms: float | None = None, inline: bool = True) -> Any:
    """Our app serving only the probe's ``DummyPolicy`` (the benches' instant policy)."""
    sys.path.insert(0, REPO)
    from models.policy import PROBE_METADATA, DummyPolicy
    from realtime.server.app import build_app
    from realtime.server.config import LimitsConfig, PolicyConfig, ServerConfig, TTSConfig, WorldConfig
    from realtime.server.inventory import Inventory

    # The app gives policy models config.policy.batch_wait_ms (the engine's returner wait).
    policy_config = PolicyConfig(policy="") if batch_wait_ms is None else PolicyConfig(policy="", batch_wait_ms=batch_wait_ms)
    # Every simulated robot is on loopback, one address: no per-client limit.
    config = ServerConfig(port=port, world=WorldConfig(models=()), policy=policy_config, tts=TTSConfig(enabled=False),
                          limits=LimitsConfig(max_sessions_per_client=0))
    inventory = Inventory()
    policy = DummyPolicy(metadata=PROBE_METADATA, infer_ms=infer_ms, max_batch=32)
    if not inline:  # "ours-hop": every forward handed to the engine thread and back
        policy.inline_forward_s = 0.0
    inventory.adapters[policy.name] = policy
    return build_app(config, inventory)


def serve_ours(port: int, infer_ms: float, batch_wait_ms: float | None, inline: bool = True) -> None:
    # The same process set-up and uvicorn settings as ``realtime serve``.
    app = ours_app(port, infer_ms, batch_wait_ms, inline)
    from realtime.server.server import bind_socket, run

    run(app, sock=bind_socket("127.0.0.1", port), log_level="warning")


def serve_reference(port: int, infer_ms: float) -> None:
    import logging

    sys.path.insert(0, REPO)
    from bench.openpi.reference_server import METADATA, InstantPolicy, ReferencePolicyServer

    logging.basicConfig(level=logging.WARNING)
    ReferencePolicyServer(InstantPolicy(infer_ms), host="127.0.0.1", port=port, metadata=METADATA).serve_forever()


# A folder whose ``uvloop`` cannot be imported: first on a server's PYTHONPATH, uvicorn's
# "auto" loop is then asyncio's, as on a machine without uvloop (Server(no_uvloop=True)).
_NO_UVLOOP = os.path.join(tempfile.gettempdir(), f"openpi_bench_no_uvloop_{os.getuid()}")


def _no_uvloop_path() -> str:
    os.makedirs(os.path.join(_NO_UVLOOP, "uvloop"), exist_ok=True)
    with open(os.path.join(_NO_UVLOOP, "uvloop", "__init__.py"), "w") as f:
        f.write('raise ImportError("uvloop hidden by bench/openpi/bench_loopback.py")\n')
    return _NO_UVLOOP


def wait_healthy(proc: subprocess.Popen, base: str, what: str, timeout_s: float = 60.0) -> None:
    """Until ``base``'s ``/healthz`` answers; RuntimeError if ``proc`` exits or ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if healthz(base) is not None:
                return
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"{what} server did not start")
        time.sleep(0.1)


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


class Server:
    """A server child process; ``uri`` is what a robot passes as ``host``."""

    def __init__(self, kind: str, infer_ms: float, batch_wait_ms: float | None = None, *,
                 repo: str = REPO, no_uvloop: bool = False) -> None:
        """``kind``: "ours" (realtime/ as committed), "ours-hop" (the same with the policy's
        inline forwards off) or "reference" (bench/openpi/reference_server.py). ``repo``:
        the checkout whose code serves (another one: a before/after comparison in one run).
        ``no_uvloop``: uvloop cannot be imported by the server (asyncio's loop)."""
        self.kind = kind
        self.port = _free_port()
        role = "reference" if kind == "reference" else ("ours-hop" if kind.endswith("-hop") else "ours")
        args = [sys.executable, "-W", "ignore", os.path.join(repo, "bench", "openpi", "bench_loopback.py"),
                "--role", role, "--port", str(self.port), "--infer-ms", str(infer_ms)]
        if batch_wait_ms is not None:
            args += ["--batch-wait-ms", str(batch_wait_ms)]
        env = dict(os.environ)
        if no_uvloop:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (_no_uvloop_path(), env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(args, cwd=repo, env=env)
        self.base = f"127.0.0.1:{self.port}"
        self.uri = f"ws://{self.base}" if role == "reference" else f"ws://{self.base}{PATH}"
        wait_healthy(self.proc, self.base, kind)

    def stop(self) -> None:
        stop_process(self.proc)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def healthz(base: str) -> float | None:
    """GET /healthz; the time it took in ms, or None if it did not answer 200 OK."""
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"http://{base}/healthz", timeout=10) as resp:
        ok = resp.status == 200 and resp.read().strip() == b"OK"
    return (time.perf_counter() - t0) * 1000 if ok else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- robots
def connect(uri: str):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    return WebsocketClientPolicy(host=uri)


def latency_round(uri: str, warmup: int, calls: int, seconds: float) -> dict[str, Any]:
    robot = connect(uri)
    obs = make_obs(0)
    for _ in range(warmup):
        robot.infer(obs)
    lat, server_infer = [], []
    deadline = time.monotonic() + seconds
    while len(lat) < calls and time.monotonic() < deadline:
        t0 = time.perf_counter()
        reply = robot.infer(obs)
        lat.append((time.perf_counter() - t0) * 1000)
        assert reply["actions"].shape == (50, 32) and reply["actions"].dtype == np.float32
        server_infer.append(reply["server_timing"]["infer_ms"])
    robot._ws.close()
    return {"rtt_ms": lat, "server_infer_ms": server_infer}


def _robot(uri: str, idx: int, warmup: int, seconds: float, max_calls: int, barrier: Any, queue: Any) -> None:
    try:
        robot = connect(uri)
        obs = make_obs(idx)
        for _ in range(warmup):
            robot.infer(obs)
        barrier.wait(timeout=120)
        lat: list[float] = []
        start = time.monotonic()
        while len(lat) < max_calls and time.monotonic() - start < seconds:
            t0 = time.perf_counter()
            robot.infer(obs)
            lat.append((time.perf_counter() - t0) * 1000)
        queue.put({"idx": idx, "wall": time.monotonic() - start, "lat": lat})
        robot._ws.close()
    except Exception as exc:  # noqa: BLE001 - reported in the JSON
        queue.put({"idx": idx, "error": repr(exc)})


def throughput(server: Server, robots: int, seconds: float, max_calls: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(robots + 1), ctx.Queue()
    procs = [ctx.Process(target=_robot, args=(server.uri, i, 3, seconds, max_calls, barrier, queue))
             for i in range(robots)]
    for p in procs:
        p.start()
    barrier.wait(timeout=180)
    before = batch_sizes(server)
    # /healthz while the robots run: the reference serves it on the loop its policy blocks.
    health: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                ms = healthz(server.base)
                if ms is not None:
                    health.append(ms)
            except OSError:
                pass
            stop.wait(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    results = [queue.get(timeout=seconds + 120) for _ in procs]
    stop.set()
    poller.join(15)
    after = batch_sizes(server)
    for p in procs:
        p.join(30)
    ok = [r for r in results if "error" not in r]
    total = sum(len(r["lat"]) for r in ok)
    wall = max(r["wall"] for r in ok) if ok else float("nan")
    return {
        "robots": robots,
        "errors": [r for r in results if "error" in r],
        "total_calls": total,
        "wall_s": round(wall, 3),
        "calls_per_s": round(total / wall, 1),
        "rtt_ms": pct([x for r in ok for x in r["lat"]]),
        "healthz_ms": pct(health),
        **_batch_summary(before, after),
    }


def batch_sizes(server: Server) -> dict[int, int] | None:
    """Forwards per batch size so far, from our server's /metrics (None for the reference)."""
    if not server.kind.startswith("ours"):
        return None
    with urllib.request.urlopen(f"http://{server.base}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("realtime_engine_batch_size_total{"):
            size = int(line.split('size="')[1].split('"')[0])
            out[size] = int(float(line.rsplit(" ", 1)[1]))
    return out


def _batch_summary(before: dict[int, int] | None, after: dict[int, int] | None) -> dict[str, Any]:
    if before is None or after is None:
        return {}
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    delta = {k: v for k, v in sorted(delta.items()) if v}
    forwards = sum(delta.values())
    mean = sum(k * v for k, v in delta.items()) / forwards if forwards else 0.0
    return {"forwards": forwards, "mean_batch": round(mean, 2), "batch_sizes": delta}


def keepalive(server: Server) -> dict[str, Any]:
    """The real client, pings every 0.1 s with a 0.3 s timeout, through a 2 s inference."""
    import websockets.sync.client

    original = websockets.sync.client.connect
    websockets.sync.client.connect = functools.partial(original, ping_interval=0.1, ping_timeout=0.3)
    try:
        robot = connect(server.uri)
        t0 = time.perf_counter()
        try:
            reply = robot.infer(make_obs(0))
            outcome = {"survived": True, "actions_shape": list(reply["actions"].shape)}
        except Exception as exc:  # noqa: BLE001 - the reference's failure is the finding
            outcome = {"survived": False, "error": repr(exc)[:200]}
        outcome["elapsed_s"] = round(time.perf_counter() - t0, 3)
        robot._ws.close()
        return outcome
    finally:
        websockets.sync.client.connect = original


# ---------------------------------------------------------------- main
def versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for pkg in ("numpy", "msgpack", "websockets", "uvicorn", "starlette", "openpi-client"):
        out[pkg] = version(pkg)
    return out


def hardware() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "machine": platform.machine(), "system": platform.system()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from openpi_client import msgpack_numpy

    # Other jobs share this machine's cores: say how busy it was.
    load_start = [round(x, 2) for x in os.getloadavg()]
    log(f"load average at start: {load_start}")

    report: dict[str, Any] = {
        "benchmark": "openpi_loopback",
        "command": "python -m bench.openpi.bench_loopback " + " ".join(sys.argv[1:]),
        "hardware": hardware(),
        "versions": versions(),
        "observation": {"cameras": 3, "image": [224, 224, 3], "state": 32,
                        "request_bytes": len(msgpack_numpy.packb(make_obs(0)))},
        "policy": "dummy: actions zeros (50, 32) float32",
    }

    names = ("ours", "reference")
    log("latency: one robot, 0 ms policy, rounds alternate " + " / ".join(names))
    # A fresh server process per round, in a rotating order: on a small shared machine the
    # same code measures up to ~0.1 ms apart from one process to the next (thread placement).
    rounds: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % 2:] + names[:r % 2]:
            with Server(name, 0.0) as server:
                rounds[name].append(latency_round(server.uri, 20, args.calls, args.seconds))
            log(f"  round {r} {name}: p50 {np.percentile(rounds[name][-1]['rtt_ms'], 50):.3f} ms")
    latency: dict[str, Any] = {}
    for name, rs in rounds.items():
        latency[name] = {
            "rtt_ms": pct([x for r in rs for x in r["rtt_ms"]]),
            "server_infer_ms": pct([x for r in rs for x in r["server_infer_ms"]]),
            "rounds_p50_ms": [round(float(np.percentile(r["rtt_ms"], 50)), 3) for r in rs],
        }
    ref_lat = latency["reference"]["rtt_ms"]
    for q in ("p50", "p99"):
        latency[f"ratio_{q}_ours_over_reference"] = round(latency["ours"]["rtt_ms"][q] / ref_lat[q], 3)
    report["latency_1_robot_0ms"] = latency

    log(f"throughput: {args.robots} robots, {args.infer_ms} ms policy, {args.throughput_seconds} s each")
    tput: dict[str, Any] = {}
    for name in names:
        with Server(name, args.infer_ms) as server:
            tput[name] = throughput(server, args.robots, args.throughput_seconds, args.max_calls)
        log(f"  {name}: {tput[name]['calls_per_s']} calls/s, p50 {tput[name]['rtt_ms'].get('p50')} ms, "
            f"p99 {tput[name]['rtt_ms'].get('p99')} ms, healthz p50 {tput[name]['healthz_ms'].get('p50')} ms")
    tput["ratio_calls_per_s_ours_over_reference"] = round(
        tput["ours"]["calls_per_s"] / tput["reference"]["calls_per_s"], 2)
    report[f"throughput_{args.robots}_robots_{args.infer_ms:g}ms"] = tput

    log("keepalive: client pings squeezed to 0.1 s / 0.3 s timeout, 2 s inference")
    ka = {}
    for name in ("ours", "reference"):
        with Server(name, 2000.0) as server:
            ka[name] = keepalive(server)
        log(f"  {name}: {ka[name]}")
    report["keepalive_2s_inference_ping_timeout_0.3s"] = ka

    report["goals"] = {
        "latency_p50_no_worse": latency["ours"]["rtt_ms"]["p50"] <= ref_lat["p50"],
        "latency_p99_no_worse": latency["ours"]["rtt_ms"]["p99"] <= ref_lat["p99"],
        "throughput_at_least_200_calls_per_s": tput["ours"]["calls_per_s"] >= 200,
    }
    report["load_average"] = {"start": load_start, "end": [round(x, 2) for x in os.getloadavg()]}
    report["notes"] = (
        "ours = realtime/ as committed: the engine waits, at most config.policy.batch_wait_ms (20) after the "
        "policy's last batch ended, only for that batch's robots to queue again; a lone robot never waits. "
        "reference = openpi's WebsocketPolicyServer as restated in bench/openpi/reference_server.py, in its own "
        "process, same dummy policy, same client. "
        f"Load average (1, 5, 15 min) at start {load_start} on {os.cpu_count()} cores shared with other jobs."
    )
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=["bench", "ours", "ours-hop", "reference"], default="bench", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--infer-ms", type=float, default=50.0, help="policy time per forward for the throughput run")
    ap.add_argument("--batch-wait-ms", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=500, help="timed calls per latency round (at most)")
    ap.add_argument("--seconds", type=float, default=3.0, help="time per latency round (at most)")
    ap.add_argument("--robots", type=int, default=16)
    ap.add_argument("--throughput-seconds", type=float, default=5.0)
    ap.add_argument("--max-calls", type=int, default=5000, help="calls per robot in the throughput run (at most)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.role in ("ours", "ours-hop"):
        serve_ours(args.port, args.infer_ms, args.batch_wait_ms, inline=args.role == "ours")
        return
    if args.role == "reference":
        serve_reference(args.port, args.infer_ms)
        return
    report = run(args)
    # Imported here: the server children may run this file by path, without the repo on sys.path.
    from bench.report import emit

    emit(report, args.out, log=log)


if __name__ == "__main__":
    main()
