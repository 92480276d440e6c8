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
import os
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
                         fmt: str = "rgb8", go: asyncio.Future | None = None,
                         created_cb: Any = None) -> dict[str, Any]:
    """One session: frames counted, server tick ms and gaps between chunks (ms) in the window.

    With ``go`` it reads nothing after ``session.created`` until ``go`` is done (the
    server stops after the first ``credits`` chunks): every session of a row starts
    its window together, however long the processes took to start.
    """
    import websockets

    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.create", "session_id": sid, "credits": credits,
                                  "format": fmt, "seed": sum(map(ord, sid)) % 1000}))
        created = json.loads(await _recv(ws))
        if created.get("type") != "session.created":
            raise ClientFailure(f"session {sid}: create answered {created}")
        if created_cb is not None:
            created_cb()
        if go is not None:
            await go
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
                    out: mp.Queue, fmt: str, go_event: Any, cpus: list[int] | None = None) -> None:
    if cpus:  # before the loop starts any thread: every thread of this process stays on them
        os.sched_setaffinity(0, cpus)

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        go: asyncio.Future = loop.create_future()
        created = 0

        def one_created() -> None:
            nonlocal created
            created += 1
            if created == len(ids):
                out.put({"ready": len(ids)})
                # The parent sets the event once every process is ready; wait for it off the loop.
                waiter = loop.run_in_executor(None, go_event.wait, RECV_TIMEOUT_S)
                waiter.add_done_callback(lambda f: go.done() or go.set_result(f.result()))

        tasks = [asyncio.ensure_future(session_client(url, f"s{i}", KEYS[i % 4], credits, warmup, seconds, fmt,
                                                      go, one_created)) for i in ids]
        try:  # the first failure ends the process (asyncio.run cancels the other sessions)
            results = await asyncio.gather(*tasks)
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            return {"error": f"{type(exc).__name__}: {exc}"}
        if go.done() and go.result() is False:
            return {"error": f"no start signal in {RECV_TIMEOUT_S:.0f} s"}
        return {"sessions": {f"s{i}": r for i, r in zip(ids, results)}}

    try:
        out.put(asyncio.run(main()))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which ends the row
        out.put({"error": f"{type(exc).__name__}: {exc}"})


class ClientFleet:
    """``n`` sessions spread over ``procs`` processes (spawned: no fork of a CUDA parent).

    ``start`` returns once every session is created (or raises ``ClientFailure``); the
    sessions' measured windows (``warmup`` then ``seconds``) begin together right then.
    """

    def __init__(self, url: str, n: int, procs: int, credits: int, warmup: float, seconds: float,
                 fmt: str = "rgb8", cpus: list[int] | None = None) -> None:
        ctx = mp.get_context("spawn")
        self._queue: mp.Queue = ctx.Queue()
        self._go = ctx.Event()
        k = max(1, min(procs, n))
        self.deadline_s = warmup + seconds + RECV_TIMEOUT_S + 60
        self._procs = [ctx.Process(target=_client_process, daemon=True,
                                   args=(url, list(range(j, n, k)), credits, warmup, seconds, self._queue, fmt,
                                         self._go, cpus))
                       for j in range(k)]

    def start(self, timeout_s: float = 120.0) -> None:
        for proc in self._procs:
            proc.start()
        ready, end = 0, time.monotonic() + timeout_s
        while ready < len(self._procs):
            try:
                got = self._queue.get(timeout=max(0.1, end - time.monotonic()))
            except queue_mod.Empty:
                self._stop()
                raise ClientFailure(f"sessions not created in {timeout_s:.0f} s ({ready} of "
                                    f"{len(self._procs)} client processes ready)") from None
            if "ready" in got:
                ready += 1
            else:  # a process failed before it was ready
                self._stop()
                raise ClientFailure(got.get("error", str(got)))
        self._go.set()

    def _stop(self) -> None:
        self._go.set()
        for proc in self._procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()

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
        self._stop()
        if errors:
            raise ClientFailure("; ".join(errors[:3]))
        return sessions
