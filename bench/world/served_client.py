"""The load of ``bench_served``: world.v1 clients in separate processes, each holding credits.

Every client creates its session, holds one set of keys, and credits each chunk as it
arrives, so the server runs ``credits`` chunks ahead of it. ``run_clients`` spreads the
sessions over a few processes (one Python process tops out near 1,000 chunks/s) and
collects what each session saw in the measured window.

A client never waits forever: a server that stops answering, an ``error`` message, a
gap in ``chunk_index`` or a crashed client process ends the row with the reason
(``ClientFailure``) instead of a hang (a profiler wrapper that broke every tick once
hung the whole benchmark on its first row).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import queue as queue_mod
import time
from typing import Any

# How long a client waits for any one message before it gives up on the server.
RECV_TIMEOUT_S = 60.0
KEYS = (["w"], ["j"], ["l"], ["w", "d"])


class ClientFailure(RuntimeError):
    """A client saw an error, a timeout or a gap; the row cannot be measured."""


async def _recv(ws: Any) -> Any:
    try:
        return await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise ClientFailure(f"no message from the server in {RECV_TIMEOUT_S:.0f} s") from None


async def session_client(url: str, sid: str, keys: list[str], credits: int, warmup: float, seconds: float,
                         fmt: str = "rgb8") -> dict[str, Any]:
    """One session: frames counted, server tick ms and gaps between chunks (ms) in the window."""
    import websockets

    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.create", "session_id": sid, "credits": credits,
                                  "format": fmt, "seed": sum(map(ord, sid)) % 1000}))
        created = json.loads(await _recv(ws))
        if created.get("type") != "session.created":
            raise ClientFailure(f"session {sid}: create answered {created}")
        await ws.send(json.dumps({"type": "event", "event_id": 0, "controls": [
            {"track": "keys", "schema": "keys.v1", "data": {"mode": "state", "held": keys}}]}))
        start = time.perf_counter()
        frames, chunks, ticks, gaps, last, expected = 0, 0, [], [], None, 0
        while True:
            msg = await _recv(ws)
            if isinstance(msg, bytes):
                raise ClientFailure(f"session {sid}: a binary frame outside a chunk")
            data = json.loads(msg)
            if data["type"] == "error":
                raise ClientFailure(f"session {sid}: server error {data.get('code')}: {data.get('message')}")
            if data["type"] != "chunk":
                continue
            if data["chunk_index"] != expected:
                raise ClientFailure(f"session {sid}: chunk {data['chunk_index']} after {expected - 1}")
            expected += 1
            for _ in range(data["frames"]):
                if not isinstance(await _recv(ws), bytes):
                    raise ClientFailure(f"session {sid}: a text message among a chunk's frames")
            await ws.send('{"type":"credit","chunks":1}')
            now = time.perf_counter()
            if now - start >= warmup:
                frames += data["frames"]
                chunks += 1
                ticks.append(data["tick_ms"])
                if last is not None:
                    gaps.append((now - last) * 1000)
                last = now
            if now - start >= warmup + seconds:
                break
        await ws.send(json.dumps({"type": "session.close"}))
        return {"frames": frames, "chunks": chunks, "ticks": ticks, "gaps": gaps}


def _client_process(url: str, ids: list[int], credits: int, warmup: float, seconds: float,
                    out: mp.Queue, fmt: str) -> None:
    async def main() -> dict[str, Any]:
        results = await asyncio.gather(*(session_client(url, f"s{i}", KEYS[i % 4], credits, warmup, seconds, fmt)
                                         for i in ids), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                return {"error": f"{type(r).__name__}: {r}"}
        return {"sessions": {f"s{i}": r for i, r in zip(ids, results)}}

    try:
        out.put(asyncio.run(main()))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which ends the row
        out.put({"error": f"{type(exc).__name__}: {exc}"})


class ClientFleet:
    """``n`` sessions spread over ``procs`` processes (spawned: no fork of a CUDA parent)."""

    def __init__(self, url: str, n: int, procs: int, credits: int, warmup: float, seconds: float,
                 fmt: str = "rgb8") -> None:
        ctx = mp.get_context("spawn")
        self._queue: mp.Queue = ctx.Queue()
        k = max(1, min(procs, n))
        self.deadline_s = warmup + seconds + RECV_TIMEOUT_S + 60
        self._procs = [ctx.Process(target=_client_process, daemon=True,
                                   args=(url, list(range(j, n, k)), credits, warmup, seconds, self._queue, fmt))
                       for j in range(k)]

    def start(self) -> None:
        for proc in self._procs:
            proc.start()

    def results(self) -> dict[str, dict[str, Any]]:
        """Every session's figures; ``ClientFailure`` with the first reason any process gave."""
        sessions: dict[str, dict[str, Any]] = {}
        errors: list[str] = []
        end = time.monotonic() + self.deadline_s
        for _ in self._procs:
            try:
                got = self._queue.get(timeout=max(1.0, end - time.monotonic()))
            except queue_mod.Empty:
                errors.append(f"no result from a client process in {self.deadline_s:.0f} s")
                break
            if "error" in got:
                errors.append(got["error"])
            else:
                sessions.update(got["sessions"])
        for proc in self._procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        if errors:
            raise ClientFailure("; ".join(errors[:3]))
        return sessions
