"""realtime/server/transport.py item 7: what the server writes in reply to a client's bytes, without
the app, stays bounded for a client that never reads (pongs; responses to pipelined
requests). Real uvicorn on loopback, raw socket client, raw ASGI app."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import struct
import time
from typing import Any

import pytest

from realtime.server.server import serve_in_thread
from realtime.server.transport import ABORT_EXTENSION
from tests.support.asgi import lifespan

# What the app saw of its connection's transport: the largest write buffer, and at the end
# whether the transport was still reading.
seen: dict[str, Any] = {}
# The HTTP requests the app answered, each with RESPONSE.
answered: list[str] = []
RESPONSE = b"r" * 65536


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    if scope["type"] == "http":
        answered.append(scope["path"])
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"%d" % len(RESPONSE))]})
        await send({"type": "http.response.body", "body": RESPONSE})
        return
    transport = scope["extensions"][ABORT_EXTENSION]["abort"].__self__  # the connection's transport
    seen.update(max_buffer=0, messages=0, reading=True)
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})

    async def sample() -> None:
        while True:
            seen["max_buffer"] = max(seen["max_buffer"], transport.get_write_buffer_size())
            seen["reading"] = transport.is_reading() and not transport.is_closing()
            await asyncio.sleep(0.002)

    sampler = asyncio.ensure_future(sample())
    try:
        while (await receive())["type"] == "websocket.receive":
            seen["messages"] += 1
            # Busy for a moment: uvicorn stops reading meanwhile and starts again in receive().
            await asyncio.sleep(0.001)
    finally:
        sampler.cancel()


def frame(opcode: int, payload: bytes) -> bytes:
    """One masked client frame (mask key 0: the payload goes as is)."""
    assert len(payload) <= 125
    return struct.pack("!BB", 0x80 | opcode, 0x80 | len(payload)) + b"\0\0\0\0" + payload


def open_socket(addr: str) -> socket.socket:
    host, port = addr.split(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little for us
    s.connect((host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET / HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 101 "), head
    return s


def flood(s: socket.socket, block: bytes, limit: int, seconds: float) -> int:
    """Send ``block`` over and over, never reading, until ``limit`` bytes went, ``seconds``
    passed or the server stopped taking them; returns the bytes sent."""
    s.settimeout(0.5)
    sent = 0
    deadline = time.monotonic() + seconds
    try:
        while sent < limit and time.monotonic() < deadline:
            sent += s.send(block)
    except (TimeoutError, BrokenPipeError, ConnectionResetError):
        pass  # the server stopped reading (or closed)
    return sent


PING = frame(0x9, b"p" * 125)  # the largest control frame: 131 bytes in, a 127-byte pong out


@pytest.mark.parametrize("with_messages", [False, True], ids=["pings", "pings-and-messages"])
def test_pongs_to_a_client_that_never_reads_stay_bounded(with_messages):
    # With messages: a text frame after every 100 pings, each taken by the app (uvicorn
    # resumes reading for each; the pongs must still stop).
    block = (PING * 100 + (frame(0x1, b"hi") if with_messages else b"")) * 50
    with serve_in_thread(app) as addr:
        s = open_socket(addr)
        try:
            sent = flood(s, block, limit=48 * 1024 * 1024, seconds=6)
            time.sleep(0.2)  # the server works through what it read
            result = dict(seen)
        finally:
            s.close()
    # 48 MiB of pings took ~46 MiB of server memory for pongs; now reading stops once the
    # write buffer holds its high-water mark plus what one read of pings is answered with.
    assert result["max_buffer"] < 1024 * 1024, (result, sent)
    assert result["reading"] is False, (result, sent)
    assert sent < 16 * 1024 * 1024, (result, sent)  # the kernel's buffers, and then nothing
    assert (result["messages"] > 0) == with_messages


def test_responses_to_pipelined_requests_stay_bounded_for_a_client_that_never_reads():
    # uvicorn answers one request at a time and waits for a writable transport before each
    # response: the app is not called again until the client reads.
    answered.clear()
    with serve_in_thread(app) as addr:
        host, port = addr.split(":")
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((host, int(port)))
        try:
            sent = flood(s, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n" * 1000, limit=32 * 1024 * 1024, seconds=4)
            time.sleep(1.0)  # the server works through what it read
            count = len(answered)
        finally:
            s.close()
    # The kernel's socket buffers (a few MiB) hold a few dozen 64 KiB responses, the write
    # buffer one more; without the wait, the app answered thousands a second, each held.
    assert count < 256, (count, sent)
