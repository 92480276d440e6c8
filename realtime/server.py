"""Running the app under uvicorn: one place for the process and WebSocket settings.

``realtime serve``, the end-to-end tests and the benchmarks all start the server
through here, so what they measure is what a user runs.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any, Iterator

import uvicorn

from realtime.allocator import tune_malloc
from realtime.transport import uvicorn_options

# The largest WebSocket message uvicorn accepts at all; each endpoint enforces its own,
# smaller limit with a protocol error (OpenPI must read a 64 MiB+ body to answer it).
WS_MAX_BYTES = 80 * 1024 * 1024
# Pings keep proxies' idle timers happy; no ping timeout, so a client busy in a long
# control loop is not dropped (the event loop itself always answers pings).
WS_PING_INTERVAL_S = 20.0


# No permessage-deflate: what the sockets carry is mostly images (PNG/JPEG already compressed,
# rgb8 for loopback or a LAN) and msgpack'd arrays, and zlib on the one event-loop thread
# halved the serving ceiling (bench_served --model instant: 9.3k vs 17.3k chunks/s for 32
# sessions on the dev machine). OpenPI's reference server turns compression off too.
WS_PER_MESSAGE_DEFLATE = False


def uvicorn_config(app: Any, *, host: str, port: int, log_level: str = "info",
                   per_message_deflate: bool = WS_PER_MESSAGE_DEFLATE) -> uvicorn.Config:
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, ws_max_size=WS_MAX_BYTES,
                          ws_ping_interval=WS_PING_INTERVAL_S, ws_ping_timeout=None,
                          ws_per_message_deflate=per_message_deflate, lifespan="on",
                          # h11 and a bounded upgrade: every request head is limited and answered.
                          **uvicorn_options())


def run(app: Any, *, host: str, port: int, log_level: str = "info") -> None:
    """Serve in the foreground, as ``realtime serve`` does."""
    tune_malloc()
    uvicorn.Server(uvicorn_config(app, host=host, port=port, log_level=log_level)).run()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_in_thread(app: Any, *, host: str = "127.0.0.1", log_level: str = "warning",
                    per_message_deflate: bool = WS_PER_MESSAGE_DEFLATE) -> Iterator[str]:
    """Run ``app`` on a free port in a background thread; yields ``host:port``.

    ``per_message_deflate`` is for benchmarks that measure what compression costs.
    """
    port = free_port(host)
    server = uvicorn.Server(uvicorn_config(app, host=host, port=port, log_level=log_level,
                                           per_message_deflate=per_message_deflate))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
