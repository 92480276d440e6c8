"""Raw bytes to a server and everything it answers: for tests of what arrives before any protocol."""

from __future__ import annotations

import socket
import time


def exchange(addr: str, chunks: list[bytes], pause_s: float = 0.0, timeout_s: float = 5.0) -> tuple[bytes, float]:
    """Send ``chunks`` to ``host:port`` (``pause_s`` between them) and read until the server
    closes; returns (everything read, seconds)."""
    host, port = addr.rsplit(":", 1)
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        try:
            for chunk in chunks:
                s.sendall(chunk)
                if pause_s:
                    time.sleep(pause_s)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed while we were still sending
        data = b""
        while True:
            try:
                part = s.recv(65536)
            except ConnectionResetError:
                break
            if not part:
                break
            data += part
    return data, time.monotonic() - started
