"""What the block-world benches (``bench_lingbot``, ``bench_matrix_game``) share: the per-tick
clock, the arguments every one takes, the model served on loopback, and a world.v1 session whose
reader timestamps what arrives. (A run's sections under a time budget: ``bench.sections``.)
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import io
import json
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from bench.timing import sync


def first_image(height: int, width: int) -> bytes:
    """A PNG of random colours (seed 0): the first image every bench session sends."""
    from PIL import Image

    rgb = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG")
    return buf.getvalue()


class TickClock:
    """Records every ``pipeline.run`` (one tick of a batch) on the engine thread.

    Wraps the pipeline's ``run`` and its decoder's ``frames_batch`` / ``decode_batch`` (instance
    attributes: the pipeline decodes every row of a tick through one of them, frame by frame or a
    whole block). Per tick: the ``sessions`` and ``rows``, its start and end (``t_start``,
    ``t_end``, perf-counter seconds) and wall time, the decode (``decode_ms``; a ``decode_batch``
    that goes through ``frames_batch`` is timed once, by the outer call), the time to its first
    decoded frame (frame by frame only), the ``output_frames``, the seconds kv residency spent
    swapping, and on CUDA the device's allocated high-water mark. ``finish`` adds what a bench
    derives from them.
    """

    def __init__(self, pipeline: Any, device: torch.device) -> None:
        self.ticks: list[dict[str, Any]] = []
        self.pipeline, self.device = pipeline, device
        self._cur: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._decoding = False
        self._run, self._frames, self._decode = pipeline.run, pipeline.decoder.frames_batch, pipeline.decoder.decode_batch
        pipeline.run = self._timed_run
        pipeline.decoder.frames_batch = self._timed_frames
        pipeline.decoder.decode_batch = self._timed_decode

    def finish(self, tick: dict[str, Any], m0: dict[str, Any], m1: dict[str, Any], decode_start: float) -> None:
        """Add a bench's own figures to ``tick``: ``m0`` / ``m1`` are the residency metrics before
        and after it, ``decode_start`` when its decode began (its end when it decoded nothing)."""

    def since(self, n: int) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.ticks[n:])

    def count(self) -> int:
        with self._lock:
            return len(self.ticks)

    def _timed_run(self, requests: Any) -> Any:
        device, residency = self.device, self.pipeline.residency
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        m0 = residency.metrics()
        cur: dict[str, Any] = {"rows": len(requests), "sessions": [r.session_id for r in requests],
                               "decode_ms": 0.0, "decode_start": None, "first_frame_ms": None}
        self._cur = cur
        start = time.perf_counter()
        try:
            return self._run(requests)
        finally:
            sync(device)
            t1 = time.perf_counter()
            m1 = residency.metrics()
            swap_s = sum(m1[k] - m0[k] for k in ("swap_in_seconds", "swap_out_seconds"))
            ds = cur.pop("decode_start") or t1
            cur.update(t_start=start, t_end=t1, total_ms=1e3 * (t1 - start), swap_ms=1e3 * swap_s)
            if device.type == "cuda":
                cur["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
            self.finish(cur, m0, m1, ds)
            self._cur = None
            with self._lock:
                self.ticks.append(cur)

    def _timed_decode(self, states: Any, z: Any) -> Any:      # a whole block of every row
        cur, device = self._cur, self.device
        sync(device)
        t = time.perf_counter()
        self._decoding = True          # a decode_batch that goes through frames_batch: timed here
        try:
            out = self._decode(states, z)
        finally:
            self._decoding = False
        sync(device)
        if cur is not None:
            if cur["decode_start"] is None:
                cur["decode_start"] = t
            cur["decode_ms"] += 1e3 * (time.perf_counter() - t)
            cur["output_frames"] = cur.get("output_frames", 0) + sum(v.shape[1] for v in out)
        return out

    def _timed_frames(self, states: Any, z: Any) -> Iterator[Any]:      # latent frame by latent frame
        if self._decoding:
            yield from self._frames(states, z)
            return
        cur, device = self._cur, self.device
        sync(device)
        t = time.perf_counter()
        if cur is not None and cur["decode_start"] is None:
            cur["decode_start"] = t
        n = 0
        for rows, video in self._frames(states, z):
            if cur is not None and cur["first_frame_ms"] is None:
                sync(device)
                cur["first_frame_ms"] = 1e3 * (time.perf_counter() - t)
            n += video.shape[0] * video.shape[2]
            yield rows, video
        sync(device)
        if cur is not None:
            cur["decode_ms"] += 1e3 * (time.perf_counter() - t)
            cur["output_frames"] = cur.get("output_frames", 0) + n


class BenchArguments(argparse.ArgumentParser):
    """The arguments every block-world bench takes (``--out``, ``--device``, ``--tiny``,
    ``--height``, ``--width``, ``--only``); ``parse_args`` fills in the frame size left out:
    ``size``, or ``tiny`` with ``--tiny``."""

    def __init__(self, doc: str, sections: Sequence[str], size: tuple[int, int], tiny: tuple[int, int]) -> None:
        super().__init__(description=doc.splitlines()[0])
        self.size, self.tiny = size, tiny
        self.add_argument("--out", required=True)
        self.add_argument("--device", default="cuda")
        self.add_argument("--tiny", action="store_true", help="the tiny checkpoint's sizes (CPU smoke test)")
        self.add_argument("--height", type=int, default=None, help=f"default {size[0]} ({tiny[0]} with --tiny)")
        self.add_argument("--width", type=int, default=None, help=f"default {size[1]} ({tiny[1]} with --tiny)")
        self.add_argument("--only", nargs="+", choices=sections, default=list(sections))

    def parse_args(self, *args: Any, **kwargs: Any) -> argparse.Namespace:  # type: ignore[override]
        out = super().parse_args(*args, **kwargs)
        height, width = self.tiny if out.tiny else self.size
        out.height, out.width = out.height or height, out.width or width
        return out


@contextmanager
def serving(adapter: Any, device: torch.device, batch_wait_ms: float | None, max_batch: int,
            max_sessions_per_client: int | None = None) -> Iterator[tuple[str, Any]]:
    """``adapter`` served by the real server (``realtime.server.server.serve_in_thread``) on a
    loopback port, with the engine on ``device``: the address and the app."""
    from realtime.server.app import build_app
    from realtime.server.config import EngineConfig, LimitsConfig, ServerConfig, WorldConfig
    from realtime.server.inventory import Inventory
    from realtime.server.server import serve_in_thread

    inventory = Inventory()
    inventory.add(adapter)
    engine = EngineConfig(device=str(device)) if batch_wait_ms is None else \
        EngineConfig(device=str(device), batch_wait_ms=batch_wait_ms)
    limits = LimitsConfig() if max_sessions_per_client is None else \
        LimitsConfig(max_sessions_per_client=max_sessions_per_client)
    config = ServerConfig(engine=engine, world=WorldConfig(models=(adapter.name,), max_batch=max_batch), limits=limits)
    app = build_app(config, inventory)
    with serve_in_thread(app) as addr:
        yield addr, app


class WorldStream(abc.ABC):
    """One world.v1 session on its own websocket. A reader task (the subclass's ``_read``)
    timestamps every chunk as it arrives and puts it on ``chunks``; other messages go to
    ``messages``."""

    expect_timeout_s = 120.0

    def __init__(self, ws: Any, sid: str) -> None:
        self.ws, self.sid = ws, sid
        self.chunks: asyncio.Queue[Any] = asyncio.Queue()
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.event_id = 0
        self.granted = 0
        self.created: dict[str, Any] = {}
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def create(cls, url: str, sid: str, image: bytes | None, **request: Any) -> Any:
        """Connect and create the session (``request``: ``protocols.world_v1.CreateRequest``'s
        fields); returns once ``session.created`` is in."""
        import websockets

        from protocols import world_v1 as wire

        ws = await websockets.connect(url, max_size=None)
        s = cls(ws, sid)
        spec = wire.ImageSpec("png", len(image)) if image is not None else None
        await ws.send(json.dumps(wire.CreateRequest(sid, image=spec, **request).to_wire()))
        if image is not None:
            await ws.send(image)
        s.created = await s.expect("session.created", timeout=600)
        s.granted = request.get("credits", 0)
        return s

    @abc.abstractmethod
    async def _read(self) -> None:
        """Every message of the session until the socket closes."""

    async def expect(self, kind: str, timeout: float | None = None) -> dict[str, Any]:
        msg = await asyncio.wait_for(self.messages.get(), timeout or self.expect_timeout_s)
        if msg.get("type") != kind:
            raise RuntimeError(f"session {self.sid}: expected {kind}, got {msg}")
        return msg

    async def credit(self, n: int = 1) -> None:
        self.granted += n
        await self.ws.send(json.dumps({"type": "credit", "chunks": n}))

    async def send_event(self, *controls: dict[str, Any]) -> tuple[int, float]:
        """An event of ``controls``; returns its id and when it went out (its ``event.accepted``
        is read by ``expect``)."""
        from protocols import world_v1 as wire

        self.event_id += 1
        msg = wire.Event(self.event_id, controls=controls)
        t = time.perf_counter()
        await self.ws.send(json.dumps(msg.to_wire()))
        return self.event_id, t

    async def next_chunk(self, timeout: float = 600.0) -> Any:
        return await asyncio.wait_for(self.chunks.get(), timeout)

    async def close(self) -> None:
        try:
            await self.ws.send(json.dumps({"type": "session.close"}))
            while (await asyncio.wait_for(self.messages.get(), 120)).get("type") != "session.closed":
                pass
        finally:
            await self.ws.close()
            self._reader.cancel()
