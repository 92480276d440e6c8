"""Running the app under uvicorn: one place for the process and WebSocket settings.

``realtime serve``, the end-to-end tests and the benchmarks all start the server
through here, so what they measure is what a user runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from typing import Any, Iterator

import uvicorn

from protocols.world_v1 import CLOSE_GOING_AWAY
from realtime.allocator import tune_malloc

log = logging.getLogger(__name__)

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


# How long SIGTERM waits for running world ticks before uvicorn closes what is left (1012).
DRAIN_TIMEOUT_S = 20.0


class _Server(uvicorn.Server):
    """uvicorn that drains world sessions on SIGTERM (docs/deploy.md): stop listening
    (a proxy sends new sessions to another replica), close each world session once its
    running tick is committed and sent, close its socket with 1001; then uvicorn's own
    shutdown (other sockets get 1012) and the lifespan's."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        try:
            await asyncio.wait_for(_drain_world(self.config.app), DRAIN_TIMEOUT_S)
        except asyncio.TimeoutError:
            log.warning("drain: world sessions still open after %.0f s", DRAIN_TIMEOUT_S)
        await super().shutdown(sockets)


async def _drain_world(app: Any) -> None:
    connections = getattr(getattr(app, "state", None), "world_connections", None)
    if connections is None:  # not this project's app (e.g. a bare ASGI app in a test)
        return

    async def drain(conn: Any) -> None:
        session = conn.session
        if session is None:
            return
        await conn.close_session(notify=False)
        log.info("session %s: drained after %d committed chunks", session.session_id, session.chunk_index)
        with contextlib.suppress(RuntimeError, OSError):  # the client may be gone already
            await conn.ws.close(CLOSE_GOING_AWAY)

    results = await asyncio.gather(*(drain(c) for c in list(connections.values())), return_exceptions=True)
    for error in (r for r in results if isinstance(r, BaseException)):
        log.error("drain: closing a session failed: %r", error)


def uvicorn_config(app: Any, *, host: str, port: int, log_level: str = "info",
                   per_message_deflate: bool = WS_PER_MESSAGE_DEFLATE) -> uvicorn.Config:
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, ws_max_size=WS_MAX_BYTES,
                          ws_ping_interval=WS_PING_INTERVAL_S, ws_ping_timeout=None,
                          ws_per_message_deflate=per_message_deflate, lifespan="on")


def run(app: Any, *, host: str, port: int, log_level: str = "info") -> None:
    """Serve in the foreground, as ``realtime serve`` does."""
    tune_malloc()
    _Server(uvicorn_config(app, host=host, port=port, log_level=log_level)).run()


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
    server = _Server(uvicorn_config(app, host=host, port=port, log_level=log_level,
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
