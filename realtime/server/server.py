"""Running the app under uvicorn: one place for the process and WebSocket settings.

``realtime serve``, the end-to-end tests and the benchmarks all start the server
through here, so what they measure is what a user runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Iterator

import uvicorn

from realtime.server.allocator import tune_malloc
from realtime.server.config import LOOPBACK_PROXIES
from realtime.server.transport import uvicorn_options

log = logging.getLogger(__name__)

# The largest WebSocket message uvicorn accepts at all; each endpoint enforces its own,
# smaller limit with a protocol error (OpenPI must read a 64 MiB+ body to answer it).
WS_MAX_BYTES = 80 * 1024 * 1024
# Pings keep proxies' idle timers happy; no ping timeout, so a client busy in a long
# control loop is not dropped (the event loop itself always answers pings).
WS_PING_INTERVAL_S = 20.0


# After the drain (ServerConfig.drain_timeout_s), how long the handlers of sockets closed
# at the deadline may take to let go before they are cancelled (and as long again to end
# once cancelled). With the lifespan's engine stop (realtime/server/app.py ENGINE_STOP_TIMEOUT_S,
# 2 s) that is at most 4 s; SHUTDOWN_GRACE_S, the documented bound on the exit after the
# drain deadline, leaves a second for uvicorn's own shutdown and the interpreter's exit.
CLOSE_GRACE_S = 1.0
SHUTDOWN_GRACE_S = 5.0


# One line format for the app's loggers and uvicorn's (uvicorn.error, uvicorn.access):
# uvicorn gets no logging config of its own, so its records reach the root handler.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """The process's one log format (``realtime serve``)."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


def uvicorn_config(app: Any, *, host: str, port: int, log_level: str = "info",
                   access_log: bool = True) -> uvicorn.Config:
    # The proxies whose X-Forwarded-For names the client (the per-client session limit and
    # the admin check count that client): the app's config, else uvicorn's own default.
    config = getattr(getattr(app, "state", None), "config", None)
    proxies = list(getattr(config, "forwarded_allow_ips", LOOPBACK_PROXIES))
    # access_log=False (``--no-access-log``): no INFO line per HTTP request, so health probes
    # every few seconds do not bury the server's own lines.
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                          ws_max_size=WS_MAX_BYTES, proxy_headers=True, forwarded_allow_ips=proxies,
                          ws_ping_interval=WS_PING_INTERVAL_S, ws_ping_timeout=None,
                          # No permessage-deflate: the sockets carry mostly images (PNG/JPEG already
                          # compressed, rgb8 for loopback or a LAN) and msgpack'd arrays, and zlib on the
                          # one event-loop thread halved the serving ceiling (9.3k vs 17.3k chunks/s for
                          # 32 sessions, bench/results/world_served_cpu_instant*.json). OpenPI's
                          # reference server turns compression off too.
                          ws_per_message_deflate=False, lifespan="on", log_config=None,
                          # h11 and a bounded upgrade: every request head is limited and answered.
                          **uvicorn_options())


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one).

    ``realtime serve`` binds before it loads any model, so a busy port is reported
    in a moment rather than after every model has loaded. Raises ``OSError``
    (``errno.EADDRINUSE`` for a busy port). SO_REUSEADDR as uvicorn sets it: a
    restart may reuse a port in TIME_WAIT, never one another server listens on.
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        # Listening now claims the port: two servers started at once cannot both
        # bind, and clients that connect while models load wait instead of failing.
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, less its re-raise of the stopping signal.

    uvicorn drains on SIGINT / SIGTERM and then raises the signal again, which ends
    the process with a ``KeyboardInterrupt`` traceback (SIGINT) or killed by SIGTERM.
    A server that has drained has finished its job: ``realtime serve`` exits 0.

    Its shutdown drains first (docs/reliability.md, "Drain"):

    1. stop listening: a new connection is refused by the kernel, an upgrade already
       on its way gets 503, ``/healthz`` answers 503 (a proxy sends new sessions to
       another replica);
    2. every open socket of every kind finishes its in-flight work (a world tick
       committed and sent, the utterance being spoken, a policy call answered) and
       closes with 1001; past ``drain_timeout_s`` the ones left close with 1001 anyway;
    3. their handlers get CLOSE_GRACE_S to let go, then are cancelled;
    4. uvicorn's own shutdown (nothing of ours is left open) and the lifespan's
       (the engine stops).

    A second Ctrl-C while it drains is an operator who will not wait: the process exits at
    once with status 130, abandoning what was still in flight.
    """

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.should_exit and sig == signal.SIGINT:
            log.warning("second Ctrl-C: exiting now, without finishing the drain")
            _exit_now(130)
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        state = getattr(self.config.app, "state", None)
        live = getattr(state, "live_sessions", None)
        if live is not None:  # not this project's app (e.g. a bare ASGI app in a test)
            started = time.monotonic()
            await live.drain(state.config.drain_timeout_s)
            await self._let_go(CLOSE_GRACE_S)
            log.info("drain: done in %.2f s", time.monotonic() - started)
        await super().shutdown(sockets)

    async def _let_go(self, grace_s: float) -> None:
        """Wait up to ``grace_s`` for the connections' handlers to end, then cancel the
        rest (each ends quietly: realtime/endpoints/lifecycle.py ``SessionEndpoint.serve``)."""
        tasks = [t for t in self.server_state.tasks if not t.done()]
        if not tasks:
            return
        _, stuck = await asyncio.wait(tasks, timeout=grace_s)
        if stuck:
            log.warning("drain: %d handlers still waiting %.1f s after their sockets closed: cancelled",
                        len(stuck), grace_s)
            for task in stuck:
                task.cancel()
            await asyncio.wait(stuck, timeout=grace_s)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and sockets:  # uvicorn logs its "running on" line only for host/port
            host, port = sockets[0].getsockname()[:2]
            url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
            log.info("serving on %s (the demo page; Ctrl-C to stop)", url)


def _exit_now(status: int) -> None:
    """End the process at once, the logs flushed, waiting for no thread (sockets, handlers,
    the engine thread in a forward)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def run(app: Any, *, sock: socket.socket, log_level: str = "info", access_log: bool = True) -> None:
    """Serve on ``sock`` (from :func:`bind_socket`) in the foreground, as ``realtime
    serve`` does; returns once a signal has stopped and drained the server."""
    tune_malloc()
    host, port = sock.getsockname()[:2]
    _Server(uvicorn_config(app, host=host, port=port, log_level=log_level, access_log=access_log)).run(sockets=[sock])
    # The process ends when the last non-daemon thread does: name any that would hold it.
    left = [t.name for t in threading.enumerate() if t.is_alive() and not t.daemon and t is not threading.main_thread()]
    if left:
        log.warning("threads still running at exit: %s", left)
    engine = getattr(getattr(app, "state", None), "engine", None)
    if engine is not None and engine.running:
        # A forward still running past the drain deadline (the engine thread is a daemon,
        # but with torch loaded the interpreter's exit waits for it all the same): every
        # socket is closed and the engine stopped, so nothing is left to lose by not waiting.
        log.warning("exiting while the engine thread is still inside a forward")
        _exit_now(0)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_in_thread(app: Any, *, host: str = "127.0.0.1", port: int | None = None,
                    log_level: str = "warning") -> Iterator[str]:
    """Run ``app`` in a background thread on ``port`` (None: a free one); yields ``host:port``.
    Leaving the block stops it as SIGTERM does (drain, then exit); it raises if the server
    did not stop.
    """
    port = free_port(host) if port is None else port
    server = _Server(uvicorn_config(app, host=host, port=port, log_level=log_level))
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
        if thread.is_alive():
            raise RuntimeError("uvicorn did not stop")
