"""Speech beside a world session on one CPU server: time to first audio and stalls.

    python -m bench.tts.mixed_stalls --utterances 16 --out /tmp/mixed.json
    python -m bench.tts.mixed_stalls --utterances 16 --tree ../before --out /tmp/mixed_before.json

(``bench/results/tts_mixed_cpu.json`` holds four such runs: before and after the engine's
deadlines, at one and two OpenMP threads.) Starts ``python -m realtime serve`` (the
default models) on loopback. Unless ``--no-world``, a world.v1 session on the default
world holds credits the whole time and takes every frame as it comes (the engine alternates its ticks with
the voice's windows); a tts.v1 socket then speaks ``--utterances`` ~5 s sentences,
one after another, each after a pause drawn uniformly from [0, ``--gap-s``) (seeded),
so that a sentence arrives at any point of a world tick and not just after the
last sentence's window. Per utterance:

* time to first audio: from just before ``input.done`` to the first PCM frame;
* worst stall: how much later than the audio before it any PCM frame arrived, for a
  listener who starts playing at the first frame (``max(t_k - (t_0 + samples_before_k / rate))``);
  a stall is a gap in what they hear.

The server's window plan (``GET /v1/models``: the voice's ``windows``) is recorded,
so runs of different plans can be set side by side. Bounded: every receive times out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Sequence

import realtime.server.cli

realtime.server.cli.openmp_defaults(os.environ)
from bench.report import emit  # noqa: E402
from bench.tts.bench_served import Server, Voice, log  # noqa: E402
from bench.tts.bench_tts import SENTENCES, environment, summary_ms  # noqa: E402
from protocols.tts_v1 import DEFAULT_SAMPLE_RATE  # noqa: E402


async def world_load(port: int, stop: asyncio.Event, counts: dict[str, float]) -> None:
    """One world session taking every frame the server makes until ``stop``."""
    import websockets

    async with websockets.connect("ws://127.0.0.1:%d/v1/realtime/world" % port, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.create", "session_id": "mixed-world", "credits": 4,
                                  "format": "rgb8", "seed": 1}))
        started = None
        while not stop.is_set():
            msg = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(msg, bytes):
                continue
            data = json.loads(msg)
            if data.get("type") == "chunk":
                started = started or time.perf_counter()
                counts["chunks"] += 1
                await ws.send(json.dumps({"type": "credit", "chunks": 1}))
            elif data.get("type") == "error":
                raise SystemExit("world error: %s" % msg)
        counts["seconds"] = time.perf_counter() - (started or time.perf_counter())
        await ws.send(json.dumps({"type": "session.close"}))


async def speak(voice: Voice, text: str) -> dict[str, float]:
    """One utterance: first audio, and the worst stall for a listener who starts playing at
    the first frame (PCM16 at the server's default rate, which this bench never changes)."""
    arrivals: list[tuple[float, int]] = []
    t_done, first = await voice.speak(text, arrivals)
    stall, samples = 0.0, 0
    for t, size in arrivals:
        stall = max(stall, t - (first + samples / DEFAULT_SAMPLE_RATE))
        samples += size // 2
    return {"ttfa_ms": (first - t_done) * 1e3, "stall_ms": stall * 1e3, "audio_s": samples / DEFAULT_SAMPLE_RATE}


async def run(port: int, utterances: int, with_world: bool, gap_s: float) -> dict[str, Any]:
    import random

    pauses = random.Random(0)
    stop, counts = asyncio.Event(), {"chunks": 0.0, "seconds": 0.0}
    world = asyncio.create_task(world_load(port, stop, counts)) if with_world else None
    if world is not None:
        await asyncio.sleep(2.0)  # the world session is streaming before the first sentence
    rows = []
    voice = Voice(port)
    await voice.open()
    try:
        for i in range(utterances):
            await asyncio.sleep(pauses.uniform(0.0, gap_s))
            rows.append(await speak(voice, SENTENCES[i % len(SENTENCES)]))
            log("utterance %d: first audio %.1f ms, worst stall %.1f ms" % (i, rows[-1]["ttfa_ms"], rows[-1]["stall_ms"]))
    finally:
        await voice.close()
    stop.set()
    if world is not None:
        await asyncio.wait_for(world, 60)
    stalls = [r["stall_ms"] for r in rows]
    return {
        "ttfa_ms": summary_ms([r["ttfa_ms"] / 1e3 for r in rows]),
        "worst_stall_ms": round(max(stalls), 1),
        "stall_ms_p50": round(statistics.median(stalls), 1),
        "utterances_with_stall_over_10ms": sum(s > 10 for s in stalls),
        "world_frames_per_s": round(counts["chunks"] / counts["seconds"], 2) if counts["seconds"] else None,
        "rows": [{k: round(v, 2) for k, v in r.items()} for r in rows],
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--utterances", type=int, default=12)
    p.add_argument("--no-world", dest="world", action="store_false", help="speech alone")
    p.add_argument("--gap-s", type=float, default=0.5, help="most seconds of pause before each utterance")
    p.add_argument("--serve-args", default="", help="extra arguments for realtime serve (quoted)")
    p.add_argument("--tree", default=None, metavar="DIR", help="serve another checkout's code (the before of an A/B)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    server = Server(args.serve_args.split(), **({"tree": Path(args.tree).resolve()} if args.tree else {}))
    port = server.port
    try:
        server.wait_ready()
        models = json.loads(urllib.request.urlopen("http://127.0.0.1:%d/v1/models" % port, timeout=30).read())
        voice = next(m for m in models["data"] if m["kind"] == "tts")
        result = asyncio.run(run(port, args.utterances, args.world, args.gap_s))
    finally:
        server.stop()
    report = {
        "benchmark": "tts_beside_a_world_session",
        "command": "python -m bench.tts.mixed_stalls " + " ".join(sys.argv[1:] if argv is None else argv),
        "description": __doc__.split("\n\n")[1],
        "with_world_session": args.world,
        "pause_before_each_utterance_s": [0.0, args.gap_s],
        "server": server.command,
        "window_plan": voice.get("windows"),
        "openmp": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")},
        **result,
        **environment("cpu"),
    }
    emit(report, args.out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
