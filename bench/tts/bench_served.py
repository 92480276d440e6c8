"""Time to first audio through a real ``realtime serve`` over tts.v1, beside the bare adapter.

Measurements interleaved utterance by utterance (in a rotating order) so the
load from other processes hits them alike:

- ``served``: a plain ``python -m realtime serve`` process (the default models) on
  loopback; a tts.v1 client sends a ~5 s sentence as ``input.text``, then ``input.done``;
  time to first audio is from just before ``input.done`` is sent to the first binary PCM
  frame received.
- ``served_profiled``: the same through ``bench.tts.serve_profile`` (the same server
  with stamps at each stage of the path), for the breakdown of where the time goes.
- ``served_spin_N`` (``--spin N ...``, default 300000): the profiled server with
  ``GOMP_SPINCOUNT=N`` instead of ``realtime.server.cli``'s default (the A/B of that setting);
  ``served_float32`` (``--float32``): a plain server with ``--cpu-format float32``
  (the voice's products in float32 whatever its pick);
  ``served_load_on_main`` (``--load-on-main``): models loaded on the main thread, as
  before ``realtime.server.inventory.on_spent_thread``; ``served_baseline`` (``--baseline DIR``):
  a plain server running another checkout's code (the code before a change).
- ``adapter``: ``PiperTTS.run_batch([SynthesizeSentence])`` in this process, from the
  call to its first window's audio (the figure ``bench_tts.py`` reports), on one thread that
  loads and runs the voice and nothing else, as the engine thread does.

Each run also counts the voluntary context switches of the server's engine-side OpenMP
worker threads per utterance (``/proc/PID/task``): a worker that sleeps between
parallel ops is woken by a futex each time. The box may be shared: the load average is
recorded before, during and after.

    python -m bench.tts.bench_served --utterances 24 --out bench/results/tts_served_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

import realtime.server.cli

# Before torch loads: the adapter here waits as the server's engine does (realtime.server.cli's defaults).
realtime.server.cli.openmp_defaults(os.environ)
from bench.report import load_summary
from bench.tts.bench_tts import SENTENCES, summary_ms, write_report
from bench.tts.serve_profile import STAGES, stages

REPO = Path(__file__).resolve().parents[2]
PATH = "/v1/realtime/tts"
GOAL_MS = 50.0


def log(msg: str) -> None:
    print("[bench_served %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on a free loopback port; SIGTERM on exit."""

    def __init__(self, serve_args: Sequence[str], trace: str | None = None, load_on_main: bool = False,
                 spincount: str | None = None, tree: Path = REPO) -> None:
        self.port = free_port()
        self.trace = trace
        base = ["serve", "--port", str(self.port), "--log-level", "warning", *serve_args]
        if trace is None:
            cmd = [sys.executable, "-m", "realtime", *base]
        else:
            flag = ["--load-on-main"] if load_on_main else []
            cmd = [sys.executable, "-m", "bench.tts.serve_profile", *flag, "--trace", trace, "--", *base]
        env = dict(os.environ)
        env.pop("GOMP_SPINCOUNT", None)  # realtime.server.cli's default unless asked for
        if spincount is not None:  # GOMP_SPINCOUNT alone: realtime.server.cli then leaves the wait alone
            env.pop("OMP_WAIT_POLICY", None)
            env["GOMP_SPINCOUNT"] = spincount
        if tree != REPO:  # another checkout's code (the A of an A/B), run from its own root
            env["PYTHONPATH"] = str(tree)
        self.command = ("GOMP_SPINCOUNT=%s " % spincount if spincount else "") + " ".join(cmd[1:])
        if tree != REPO:
            self.command = "(in %s) %s" % (tree, self.command)
        self.proc = subprocess.Popen(cmd, cwd=tree, env=env)

    def wait_ready(self, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit("server exited with %s: %s" % (self.proc.returncode, self.command))
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/healthz" % self.port, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit("server did not come up in %.0f s: %s" % (timeout, self.command))

    def switches(self) -> dict[str, int]:
        """Voluntary context switches per thread name (summed), from /proc."""
        out: dict[str, int] = {}
        base = "/proc/%d/task" % self.proc.pid
        for tid in os.listdir(base):
            try:
                status = Path(base, tid, "status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            name = fields["Name"].strip()
            out[name] = out.get(name, 0) + int(fields["voluntary_ctxt_switches"])
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Voice:
    """One tts.v1 socket; ``speak`` returns (t_done, t_first_pcm) on perf_counter."""

    def __init__(self, port: int) -> None:
        self.url = "ws://127.0.0.1:%d%s" % (port, PATH)
        self.ws: Any = None

    async def open(self) -> None:
        import websockets

        self.ws = await websockets.connect(self.url, max_size=None)
        first = json.loads(await self.ws.recv())
        if first.get("type") != "session.updated":
            raise SystemExit("unexpected first message %r" % first)

    async def speak(self, text: str, arrivals: list[tuple[float, int]] | None = None) -> tuple[float, float]:
        """``arrivals``: if given, gets (perf_counter time, bytes) of every PCM frame."""
        await self.ws.send(json.dumps({"type": "input.text", "text": text}))
        t_done = time.perf_counter()
        await self.ws.send(json.dumps({"type": "input.done"}))
        first: float | None = None
        while True:
            msg = await asyncio.wait_for(self.ws.recv(), 60)
            if isinstance(msg, bytes):
                now = time.perf_counter()
                if first is None:
                    first = now
                if arrivals is not None:
                    arrivals.append((now, len(msg)))
                continue
            kind = json.loads(msg).get("type")
            if kind == "error":
                raise SystemExit("server error: %s" % msg)
            if kind == "response.done":
                if first is None:
                    raise SystemExit("no audio for %r" % text)
                return t_done, first

    async def close(self) -> None:
        await self.ws.close()


def adapter_once(tts: Any, text: str, seed: int) -> float:
    """The bare adapter's first audio for a sentence that is complete at t0 (seconds)."""
    from models.tts.base import DecodeWindow, SynthesizeSentence

    t0 = time.perf_counter()
    audio = tts.run_batch([SynthesizeSentence("bench", 0, 0, text, 1.0, 22050, seed)])[0]
    ttfa = time.perf_counter() - t0
    while not audio.done:
        audio = tts.run_batch([DecodeWindow("bench", 0, 0)])[0]
    tts.drop_session("bench")
    return ttfa


def load_adapter() -> Any:
    import torch

    from models.tts.piper.adapter import PiperTTS

    tts = PiperTTS.load(device="cpu")
    log("adapter loaded on its own thread (torch threads %d, products %s)" % (torch.get_num_threads(), tts.describe()["products"]))
    return tts


def median_stages(rows: list[dict[str, float]]) -> dict[str, float]:
    return {name: round(statistics.median(r[name] for r in rows), 3) for name, _, _ in STAGES}


async def measure(args: argparse.Namespace, servers: dict[str, Server], torch_thread: Any, tts: Any
                  ) -> dict[str, Any]:
    voices = {name: Voice(server.port) for name, server in servers.items()}
    for v in voices.values():
        await v.open()
    for text in SENTENCES:  # warm-up: espeak, allocators, every window shape
        for v in voices.values():
            await v.speak(text)
        torch_thread.submit(adapter_once, tts, text, 0).result()
    ttfa: dict[str, list[float]] = {name: [] for name in (*servers, "adapter")}
    pairs: dict[str, list[tuple[float, float]]] = {name: [] for name in servers if servers[name].trace}
    before = {name: server.switches() for name, server in servers.items()}
    loads = [os.getloadavg()[0]]
    order = list(ttfa)
    for i in range(args.utterances):
        text = SENTENCES[i % len(SENTENCES)]
        k = i % len(order)
        for kind in order[k:] + order[:k]:
            if kind == "adapter":
                ttfa[kind].append(torch_thread.submit(adapter_once, tts, text, 0).result())
                continue
            t_done, t_first = await voices[kind].speak(text)
            ttfa[kind].append(t_first - t_done)
            if kind in pairs:
                pairs[kind].append((t_done, t_first))
        loads.append(os.getloadavg()[0])
        if (i + 1) % 4 == 0:
            log("%d/%d utterances, served p50 so far %.1f ms, load %.2f"
                % (i + 1, args.utterances, statistics.median(ttfa["served"]) * 1e3, loads[-1]))
    after = {name: server.switches() for name, server in servers.items()}
    for v in voices.values():
        await v.close()
    # OpenMP workers are unnamed threads that inherit the process name ("python").
    switches = {name: {t: round((after[name].get(t, 0) - n) / args.utterances, 1)
                       for t, n in before[name].items() if after[name].get(t, 0) > n}
                for name in servers}
    return {"ttfa": ttfa, "pairs": pairs, "loads": loads, "switches_per_utterance": switches}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--utterances", type=int, default=24, help="timed utterances per measurement (>= 20)")
    p.add_argument("--serve-args", default="", help="extra arguments for realtime serve (quoted)")
    p.add_argument("--spin", nargs="*", default=["300000"],
                   help="also a profiled server per GOMP_SPINCOUNT value (the A/B of realtime.server.cli's default)")
    p.add_argument("--float32", action="store_true",
                   help="also a plain server with --cpu-format float32 (the A/B of the voice's number format pick)")
    p.add_argument("--load-on-main", action="store_true",
                   help="also a profiled server that loads its models on the main thread (the old behaviour)")
    p.add_argument("--baseline", default=None, metavar="DIR",
                   help="also a plain server from another checkout (e.g. `git archive` of the code before a change)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    serve_args = args.serve_args.split()

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        servers = {
            "served": Server(serve_args),
            "served_profiled": Server(serve_args, trace=os.path.join(tmp, "new.json")),
        }
        for value in args.spin:
            servers["served_spin_%s" % value] = Server(serve_args, trace=os.path.join(tmp, "spin%s.json" % value),
                                                       spincount=value)
        if args.float32:
            servers["served_float32"] = Server(serve_args + ["--cpu-format", "float32"])
        if args.baseline:
            servers["served_baseline"] = Server(serve_args, tree=Path(args.baseline).resolve())
        if args.load_on_main:
            servers["served_load_on_main"] = Server(serve_args, trace=os.path.join(tmp, "old.json"), load_on_main=True)
        # One thread loads and runs the bare adapter, as the engine thread runs the served one.
        torch_thread = ThreadPoolExecutor(1, thread_name_prefix="adapter")
        try:
            tts = torch_thread.submit(load_adapter).result()
            for server in servers.values():
                server.wait_ready()
            log("servers up: %s" % {n: s.port for n, s in servers.items()})
            got = asyncio.run(measure(args, servers, torch_thread, tts))
        finally:
            for server in servers.values():
                server.stop()
            torch_thread.shutdown()
        stamps = {n: json.loads(Path(s.trace).read_text())["stamps"] for n, s in servers.items() if s.trace}
    load_after = os.getloadavg()

    compute = ("phonemize", "prior", "flow_prefix", "first_window_decode", "pcm_and_checks")
    profiles = {}
    for name, pairs in got["pairs"].items():
        rows = [r for r in (stages(stamps[name], a, b) for a, b in pairs) if r is not None]
        overhead = [sum(v for k, v in r.items() if k not in compute) for r in rows]
        model = [sum(r[k] for k in compute) for r in rows]
        profiles[name] = {
            "utterances": len(rows),
            "stage_ms_p50": median_stages(rows) if rows else {},
            "model_ms": summary_ms([x / 1e3 for x in model]) if model else {},
            "outside_the_model_ms": summary_ms([x / 1e3 for x in overhead]) if overhead else {},
        }
    ttfa = {k: summary_ms(v) for k, v in got["ttfa"].items()}
    served, bare = ttfa["served"]["p50"], ttfa["adapter"]["p50"]
    report: dict[str, Any] = {
        "benchmark": "tts_served_first_audio",
        "description": __doc__.split("\n\n")[1].strip(),
        "sentences": list(SENTENCES),
        "utterances": args.utterances,
        "ttfa_ms": ttfa,
        "ratio_served_p50_over_adapter_p50": round(served / bare, 3),
        "served_minus_adapter_p50_ms": round(served - bare, 2),
        "ratio_p50_over_served_p50": {k: round(v["p50"] / served, 3) for k, v in ttfa.items() if k != "served"},
        "profile": profiles,
        "stages": [{"name": n, "from": a, "to": b} for n, a, b in STAGES],
        "voluntary_context_switches_per_utterance": got["switches_per_utterance"],
        "goal": {"served_ttfa_p50_ms_le": GOAL_MS, "met": served <= GOAL_MS},
        "load": {
            **load_summary(load_before, load_after, got["loads"]),
            "note": "a shared 2-core box: other processes ran beside this one; rerun on a quiet, pinned "
                    "machine for clean figures (the measurements are interleaved, so their ratios hold)",
        },
        "servers": {n: s.command for n, s in servers.items()},
        "openmp_defaults": realtime.server.cli.OPENMP_DEFAULTS,
    }
    write_report(report, "bench.tts.bench_served", argv, args.out, log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
