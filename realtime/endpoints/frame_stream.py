"""One world tick's frames sent as the model makes them, before the tick commits (``stream_frames``)."""

from __future__ import annotations

import asyncio
from typing import Callable

import numpy as np

from models.world.base import WorldGeometry
from protocols import world_v1 as wire
from realtime.endpoints.connection import Connection
from realtime.endpoints.world_frames import SessionFrames
from sessions import TickRequest


class FrameStream:
    """One tick's frames sent as the model makes them, before the tick commits (``stream_frames``).

    ``sink`` is the tick's ``WorldTick.frame_sink``: the engine thread calls it and it
    only queues onto the event loop. A pump sends each batch of frames as a
    ``chunk.frames`` message and its binary frames once the previous chunk is fully out
    (``after``), so a chunk's frames never overtake the commit before them. The
    engine resolves the tick after its last sink call, and both go through
    ``call_soon_threadsafe`` in order, so ``finish`` (on the loop, after the tick)
    sees every frame queued.
    """

    def __init__(self, conn: Connection, request: TickRequest, fmt: str, geometry: WorldGeometry, encoder: SessionFrames,
                 after: asyncio.Task | None, taken: Callable[[], None] | None = None) -> None:
        self.conn, self.request, self.format, self.geometry = conn, request, fmt, geometry
        self.encoder = encoder
        self.taken = taken  # called when the client took a batch of frames (it is not idle)
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, np.ndarray] | None] = asyncio.Queue()
        self.count = 0
        self._pump = asyncio.create_task(self._run(after))

    def sink(self, first: int, frames: np.ndarray) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (first, frames))

    async def _run(self, after: asyncio.Task | None) -> None:
        await finish_send(after)
        r, g = self.request, self.geometry
        while (item := await self.queue.get()) is not None:
            first, frames = item
            payloads = await self.encoder.encode(frames, r.chunk_index)
            header = wire.chunk_frames(r.session_id, r.request_id, r.chunk_index, first=first,
                                       frames=len(payloads), format=self.format, height=g.height, width=g.width)
            if await self.conn.send(wire.encode(header), *payloads) and self.taken is not None:
                self.taken()
            self.count += len(payloads)

    async def finish(self) -> int:
        """Send what is queued and stop; returns how many frames went out."""
        self.queue.put_nowait(None)
        await asyncio.shield(self._pump)
        return self.count

    def cancel(self) -> None:
        """Stop the pump if the driver ends without finishing the tick (no-op after ``finish``)."""
        self._pump.cancel()


async def finish_send(task: asyncio.Task | None) -> None:
    """Wait for a chunk send (a vanished peer only ends the send; the reader cleans up)."""
    if task is not None:
        await asyncio.shield(task)
