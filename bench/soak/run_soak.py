"""Mixed load for a fixed time against a real ``realtime serve`` process (CPU, or ``--device cuda``).

    PYTHONPATH=$PWD python -m bench.soak.run_soak --seconds 300 --out bench/results/soak_cpu.json
    python3 -m bench.soak.run_soak --device cuda --seconds 600 --worlds 32 --robots 8 --voices 0 \
        --out bench/results/soak_h200.json   # the GPU soak (H200)

8 world sessions (the maze world on kv/'s paged cache, a held-key event every 4
chunks), 8 robots (the real ``openpi-client``, dummy policy) and 4 speech sessions
(the joe voice, one sentence per utterance) run together for ``--seconds``. Checked:
zero failed requests (every error frame, refused call or lost connection counts),
chunk indexes contiguous from 0 per world session, every accepted event applied
in a chunk or reported dropped at close, every KV block back in the pool at the
end (``/metrics``), nothing in the server log that no client may cause. The
server's RSS is sampled every second; the slope after warm-up (the first quarter)
is reported in MB per minute. Prints progress every 10 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import websockets

from clients.world import WorldClient
from deploy.server_process import ServerProcess

SENTENCE = "The robot walked to the end of the hall and turned left."


class Tally:
    def __init__(self) -> None:
        self.failures: list[str] = []
        self.counts = {"world_chunks": 0, "world_events": 0, "robot_calls": 0, "tts_utterances": 0,
                       "tts_audio_bytes": 0}
        self.gaps: list[str] = []
        self.lost_events: list[str] = []


async def world(addr: str, i: int, until: float, t: Tally) -> None:
    sid = f"soak-w{i}"
    try:
        async with WorldClient.connect(f"ws://{addr}/v1/realtime/world") as c:
            await c.create(sid, credits=2, seed=i, format="jpeg")
            accepted: set[int] = set()
            applied: set[int] = set()
            expect = 0
            while time.monotonic() < until:
                chunk = await c.next_chunk(timeout=60)
                if chunk.chunk_index != expect:
                    t.gaps.append(f"{sid}: chunk {chunk.chunk_index} after {expect - 1}")
                expect = chunk.chunk_index + 1
                applied.update(chunk.applied_event_ids)
                t.counts["world_chunks"] += 1
                if chunk.chunk_index % 4 == 0:
                    ack = await c.hold_keys(["W"] if chunk.chunk_index % 8 else ["D"])
                    if ack["status"] == "accepted":
                        accepted.add(ack["event_id"])
                        t.counts["world_events"] += 1
            await c.send({"type": "session.close"})
            while True:  # chunks already credited may come before session.closed
                msg = await c.expect("session.closed", timeout=60)
                break
            while not c.chunks.empty():
                applied.update(c.chunks.get_nowait().applied_event_ids)
            lost = accepted - applied - set(msg.get("dropped_event_ids", []))
            if lost:
                t.lost_events.append(f"{sid}: {sorted(lost)}")
            if c.errors:
                t.failures.append(f"{sid}: errors {c.errors}")
    except Exception as exc:  # noqa: BLE001 - every failure is counted
        t.failures.append(f"{sid}: {type(exc).__name__}: {exc}")


def robot(addr: str, i: int, until: float, t: Tally) -> None:
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    try:
        policy = WebsocketClientPolicy(f"ws://{addr}/v1/realtime/robot/openpi")
        meta = policy.get_server_metadata()
        h, w = meta["image_resolution"]
        obs: dict[str, Any] = {k: np.zeros((h, w, 3), np.uint8) for k in meta["image_keys"]}
        obs[meta.get("state_key", "state")] = np.zeros(meta["state_dim"], np.float32)
        obs[meta.get("prompt_key", "prompt")] = f"robot {i}"
        while time.monotonic() < until:
            out = policy.infer(obs)
            if out["actions"].shape != (meta["action_horizon"], meta["action_dim"]):
                t.failures.append(f"robot {i}: actions {out['actions'].shape}")
            t.counts["robot_calls"] += 1
            time.sleep(0.05)
        policy._ws.close()
    except Exception as exc:  # noqa: BLE001
        t.failures.append(f"robot {i}: {type(exc).__name__}: {exc}")


async def speech(addr: str, i: int, until: float, t: Tally) -> None:
    try:
        async with websockets.connect(f"ws://{addr}/v1/realtime/tts", max_size=None) as ws:
            json.loads(await ws.recv())
            while time.monotonic() < until:
                await ws.send(json.dumps({"type": "input.text", "text": SENTENCE}))
                await ws.send(json.dumps({"type": "input.done"}))
                while True:
                    msg = await asyncio.wait_for(ws.recv(), 120)
                    if isinstance(msg, bytes):
                        t.counts["tts_audio_bytes"] += len(msg)
                        continue
                    data = json.loads(msg)
                    if data["type"] == "error":
                        t.failures.append(f"speech {i}: {data}")
                    if data["type"] == "response.done":
                        t.counts["tts_utterances"] += 1
                        break
            await ws.send(json.dumps({"type": "session.close"}))
    except Exception as exc:  # noqa: BLE001
        t.failures.append(f"speech {i}: {type(exc).__name__}: {exc}")


def rss_mb(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) / 1024.0


def sample(metrics: str, name: str, **labels: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


async def soak(server: ServerProcess, seconds: float, worlds: int, robots: int, voices: int) -> dict[str, Any]:
    t = Tally()
    start = time.monotonic()
    until = start + seconds
    rss: list[tuple[float, float]] = []

    async def sampler() -> None:
        next_print = start + 10
        while time.monotonic() < until:
            rss.append((time.monotonic() - start, rss_mb(server.proc.pid)))
            if time.monotonic() >= next_print:
                next_print += 10
                print(f"[soak {time.monotonic() - start:5.0f}/{seconds:.0f} s] {t.counts} "
                      f"failures={len(t.failures)} rss={rss[-1][1]:.0f} MB", flush=True)
            await asyncio.sleep(1.0)

    tasks = [world(server.addr, i, until, t) for i in range(worlds)]
    tasks += [asyncio.to_thread(robot, server.addr, i, until, t) for i in range(robots)]
    tasks += [speech(server.addr, i, until, t) for i in range(voices)]
    await asyncio.gather(sampler(), *tasks)
    elapsed = time.monotonic() - start
    await asyncio.sleep(1.0)  # closes reach the engine's control lane
    import httpx

    metrics = httpx.get(f"http://{server.addr}/metrics", timeout=10).text
    warm = [(x, y) for x, y in rss if x >= seconds / 4]
    slope = float(np.polyfit([x for x, _ in warm], [y for _, y in warm], 1)[0] * 60) if len(warm) > 2 else None
    return {
        "seconds": round(elapsed, 1), "sessions": {"world": worlds, "robot": robots, "tts": voices},
        "counts": t.counts, "failed_requests": len(t.failures), "failures": t.failures[:20],
        "chunk_gaps": t.gaps[:20], "lost_events": t.lost_events[:20],
        "kv_blocks_used_at_end": sample(metrics, "realtime_kv_blocks", state="used"),
        "kv_sessions_at_end": sample(metrics, "realtime_kv_sessions", residency="resident")
        + sample(metrics, "realtime_kv_sessions", residency="swapped"),
        "tick_failures_total": sum(float(l.rsplit(" ", 1)[1]) for l in metrics.splitlines()
                                   if l.startswith("realtime_tick_failures_total")),
        "rss_mb": {"start": rss[0][1] if rss else None, "end": rss[-1][1] if rss else None,
                   "max": max(y for _, y in rss) if rss else None,
                   "slope_after_warmup_mb_per_min": slope},
        "log_problems": server.problems()[:10],
    }


def machine(device: str) -> dict[str, Any]:
    import os

    import torch

    info: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                            "platform": platform.platform(), "torch": torch.__version__, "device": device}
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--worlds", type=int, default=8)
    parser.add_argument("--robots", type=int, default=8)
    parser.add_argument("--voices", type=int, default=4)
    parser.add_argument("--device", default="cpu", help="the server's --device (cuda for the GPU soak)")
    parser.add_argument("--ticks-in-flight", choices=("1", "2", "auto"), default="auto",
                        help="the server's --ticks-in-flight (world ticks a session may have queued)")
    parser.add_argument("--note", default="", help="what else ran on the machine (recorded in the JSON)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    # Every simulated client is on loopback, one address: no per-client limit.
    with ServerProcess(tts=args.voices > 0, policy="dummy", models="maze", device=args.device,
                       serve_args=("--max-sessions-per-client", "0", "--ticks-in-flight", str(args.ticks_in_flight))) as server:
        result = asyncio.run(soak(server, args.seconds, args.worlds, args.robots, args.voices))
    ok = (result["failed_requests"] == 0 and not result["chunk_gaps"] and not result["lost_events"]
          and result["kv_blocks_used_at_end"] == 0 and result["tick_failures_total"] == 0
          and not result["log_problems"])
    result = {"command": shlex.join(["python", "-m", "bench.soak.run_soak", *(argv if argv is not None else sys.argv[1:])]),
              "ok": ok, "machine": machine(args.device),
              "note": args.note, **result}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
