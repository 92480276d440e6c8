"""Our OpenPI app's own CPU per message, without sockets: stage by stage, against a minimal endpoint.

The real Starlette app (``realtime.app.build_app``: middleware, routing, the OpenPI
endpoint, its engine started by the lifespan, ``DummyPolicy``) is called as uvicorn
calls it, with an in-memory ASGI ``receive`` that hands it the reference probe's
observation (452 KB, packed by ``openpi_client.msgpack_numpy``) ``--messages`` times
and a ``send`` that drops the replies. No socket, no kernel, no robot processes: what
is left is the Python the server runs per message, which a loaded shared machine
cannot hide (process CPU time, min and median of ``--repeats``, variants interleaved):

* ``starlette``: a bare Starlette ``WebSocketRoute`` endpoint: ``receive``,
  ``msgpack_numpy.unpackb``, pack a fixed reply, ``send_bytes`` (the reference's work
  per message on Starlette);
* ``ours-min``: our endpoint with its request handling swapped for the same unpackb +
  fixed reply (what the endpoint's receive, idle clock, send lock and drain
  bookkeeping add);
* ``ours-decode``: handling = ``protocols.openpi.decode_request`` (decode + validate)
  and the fixed reply;
* ``ours-policy``: decode, then the policy's own ``run_batch`` called directly (its
  ``PolicyWork``, forward and action checks), the fixed reply;
* ``ours-submit``: decode, then the engine as the endpoint calls it (``Engine.run_now``, inline:
  the forward's bookkeeping and stats around the same ``run_batch``), the fixed reply;
* ``ours``: the endpoint as served (decode, engine submit run inline, policy, the reply
  with its timings, metrics and session bookkeeping).

Also: the engine's inline / total works (an instant policy should be answered inline)
and the garbage collector's runs over the measured messages.

Measured hot (one process, the same body every message), this under-counts what a
server pays between robot processes that evict its caches: bench/openpi/ablate_layers.py
measures the same stages over real sockets.

    python -m bench.openpi.profile_app --messages 2000 --repeats 7 --out bench/results/openpi_app_profile.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
from openpi_client import msgpack_numpy  # noqa: E402

from bench.openpi.bench_loopback import PATH, hardware, log, make_obs, ours_app, versions  # noqa: E402

VARIANTS = ("starlette", "ours-min", "ours-decode", "ours-policy", "ours-submit", "ours")
_REPLY = {"actions": np.zeros((50, 32), np.float32), "server_timing": {"infer_ms": 0.0}}


def _scope() -> dict[str, Any]:
    from realtime.transport import ABORT_EXTENSION

    return {"type": "websocket", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
            "scheme": "ws", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 40000), "root_path": "",
            "path": PATH, "raw_path": PATH.encode(), "query_string": b"", "headers": [(b"host", b"127.0.0.1")],
            "subprotocols": [], "state": {},
            # What realtime/transport.py puts there: a transport that always takes writes.
            "extensions": {"websocket.http.response": {}, ABORT_EXTENSION: {"abort": lambda: None,
                                                                            "writable": lambda: True}}}


async def _drive(app: Any, body: bytes, messages: int) -> None:
    """One connection: connect, ``messages`` requests, disconnect; every reply checked sent."""
    incoming = iter([{"type": "websocket.connect"}, *([{"type": "websocket.receive", "bytes": body}] * messages),
                     {"type": "websocket.disconnect", "code": 1000}])
    sent = 0

    async def receive() -> dict[str, Any]:
        return next(incoming)

    async def send(message: dict[str, Any]) -> None:
        nonlocal sent
        sent += message["type"] == "websocket.send"

    await app(_scope(), receive, send)
    if sent != messages + 1:  # the metadata frame, then one reply per request
        raise RuntimeError(f"{sent} frames sent for {messages} requests")


def starlette_app(reply: dict = _REPLY, *, with_healthz: bool = False) -> Any:
    """The bare Starlette endpoint: receive, ``unpackb``, pack ``reply``, send (the reference's
    work); ``with_healthz``: a ``/healthz`` route too, for a server process to be waited on."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route, WebSocketRoute

    async def endpoint(ws: Any) -> None:
        await ws.accept()
        packer = msgpack_numpy.Packer()
        await ws.send_bytes(packer.pack({}))
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            msgpack_numpy.unpackb(message["bytes"])
            await ws.send_bytes(packer.pack(reply))

    async def healthz_route(request: Any) -> PlainTextResponse:
        return PlainTextResponse("OK")

    routes: list[Any] = [WebSocketRoute(PATH, endpoint)]
    if with_healthz:
        routes.append(Route("/healthz", healthz_route))
    return Starlette(routes=routes)


async def _handle_min(self: Any, message: Any) -> bytes:
    msgpack_numpy.unpackb(message.data)
    return self.packer.pack(_REPLY)


async def _handle_decode(self: Any, message: Any) -> bytes:
    from protocols import openpi as wire

    wire.decode_request(message.data, self.metadata)
    return self.packer.pack(_REPLY)


def _work(self: Any, message: Any) -> Any:
    from models.policy.base import PolicyWork
    from protocols import openpi as wire

    req = wire.decode_request(message.data, self.metadata)
    sid = self._session(req.session_id, None)
    return sid, PolicyWork(session_id=sid, request_id=f"{sid}:0", observation=req.observation, sampling=req.sampling)


async def _handle_policy(self: Any, message: Any) -> bytes:
    _, work = _work(self, message)
    # On the loop, outside the engine's owner lock: nothing else runs (no work is queued).
    self.adapter.run_batch([work])
    return self.packer.pack(_REPLY)


async def _handle_submit(self: Any, message: Any) -> bytes:
    from realtime.engine import NOT_RUN

    sid, work = _work(self, message)
    if self.engine.run_now(self.model, work, session_id=sid) is NOT_RUN:  # as the endpoint calls it
        await self.engine.submit_future(self.model, work, session_id=sid)
    return self.packer.pack(_REPLY)


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from realtime import openpi_ws

    ours, star = ours_app(), starlette_app()
    handle = openpi_ws.OpenPIConnection.handle
    handlers = {"ours-min": _handle_min, "ours-decode": _handle_decode, "ours-policy": _handle_policy,
                "ours-submit": _handle_submit, "ours": handle}
    body = msgpack_numpy.packb(make_obs(0))
    us: dict[str, list[float]] = {v: [] for v in VARIANTS}
    collections = 0

    def count(phase: str, info: dict) -> None:
        nonlocal collections
        collections += phase == "stop"

    try:
        async with ours.router.lifespan_context(ours):
            engine = ours.state.engine
            for name in VARIANTS:  # warm-up: the engine measures its first forwards on its thread
                if name in handlers:
                    openpi_ws.OpenPIConnection.handle = handlers[name]  # type: ignore[method-assign]
                await _drive(star if name == "starlette" else ours, body, 200)
            inline0, works0 = engine.stats.inline_works, engine.stats.works
            gc.callbacks.append(count)
            for r in range(args.repeats):
                for name in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
                    if name in handlers:
                        openpi_ws.OpenPIConnection.handle = handlers[name]  # type: ignore[method-assign]
                    t0 = time.process_time()
                    await _drive(star if name == "starlette" else ours, body, args.messages)
                    us[name].append((time.process_time() - t0) / args.messages * 1e6)
                log(f"repeat {r}: " + "  ".join(f"{n} {us[n][-1]:.1f}" for n in VARIANTS) + " us/message")
            gc.callbacks.remove(count)
            inline, works = engine.stats.inline_works - inline0, engine.stats.works - works0
    finally:
        openpi_ws.OpenPIConnection.handle = handle  # type: ignore[method-assign]
    rows = {n: {"cpu_us_per_message_min": round(min(v), 2), "cpu_us_per_message_median": round(statistics.median(v), 2),
                "repeats": [round(x, 2) for x in v]} for n, v in us.items()}
    steps = {f"{b}_minus_{a}_us": round(rows[b]["cpu_us_per_message_min"] - rows[a]["cpu_us_per_message_min"], 2)
             for a, b in zip(VARIANTS, VARIANTS[1:])}
    return {"variants": rows, "steps_of_min": steps, "engine_inline_works": inline, "engine_works": works,
            "gc_collections": collections}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    load_start = [round(x, 2) for x in os.getloadavg()]
    result = asyncio.run(_run(args))
    report = {
        "benchmark": "openpi_app_profile",
        "command": "python -m bench.openpi.profile_app " + " ".join(sys.argv[1:]),
        "hardware": hardware(),
        "versions": versions(),
        "messages": args.messages,
        "repeats": args.repeats,
        **result,
        "load_average": {"start": load_start, "end": [round(x, 2) for x in os.getloadavg()]},
        "notes": "process CPU time per message of one in-memory connection (no sockets); see the module docstring",
    }
    from bench.report import emit

    emit(report, args.out, log=log)


if __name__ == "__main__":
    main()
