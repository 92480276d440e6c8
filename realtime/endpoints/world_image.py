"""The first image a world ``session.create`` announces: read from the socket, decoded for the model."""

from __future__ import annotations

import asyncio

import numpy as np

from models.world.base import WorldAdapter
from protocols import world_v1 as wire
from realtime.endpoints.connection import Connection, TooLarge
from realtime.endpoints.idle import IDLE, IdleClock, receive_or_idle
from sessions import ErrorCode, SessionError


async def read_image(conn: Connection, idle: IdleClock, spec: wire.ImageSpec) -> bytes | None:
    """The binary message of ``spec.bytes`` bytes that follows ``session.create``; None if
    the client went idle before sending it; ``SessionError(BAD_REQUEST)`` naming what
    arrived instead."""
    try:
        frame = await receive_or_idle(
            idle, lambda: conn.receive(wire.MAX_TEXT_BYTES, max_binary=spec.bytes), lambda: False)
    except TooLarge as exc:
        got = "a binary message" if exc.binary else "a text frame (over the text limit)"
        raise SessionError(ErrorCode.BAD_REQUEST, f"image: {got} of {exc.size} bytes where the announced "
                                                  f"binary message of {spec.bytes} bytes was due") from None
    if frame is IDLE:
        return None
    if frame is None:
        raise SessionError(ErrorCode.BAD_REQUEST, "image: the connection closed before the image arrived")
    if frame.data is None:
        raise SessionError(ErrorCode.BAD_REQUEST, f"image: expected a binary message of {spec.bytes} bytes "
                                                  "right after session.create, got a text frame")
    if len(frame.data) != spec.bytes:
        raise SessionError(ErrorCode.BAD_REQUEST, f"image: a binary message of {len(frame.data)} bytes, "
                                                  f"announced {spec.bytes}")
    return frame.data

async def decode_image(req: wire.CreateRequest, adapter: WorldAdapter, data: bytes) -> np.ndarray:
    """The model's first frame from the image bytes, or ``SessionError(BAD_REQUEST)``
    naming the reason (then nothing is created)."""
    assert req.image is not None
    if not adapter.takes_image:
        raise SessionError(ErrorCode.BAD_REQUEST, f"world model {req.model!r} takes no first image")
    try:
        # Decoding up to 64 megapixels takes a while: off the event loop.
        return await asyncio.to_thread(adapter.first_image, data, req.image.format)
    except ValueError as exc:
        raise SessionError(ErrorCode.BAD_REQUEST, f"image: {exc}") from None
