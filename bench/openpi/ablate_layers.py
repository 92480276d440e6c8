"""Where our OpenPI server's per-call CPU goes, layer by layer, against the reference, one run.

Each server below runs in its own process for the whole run, serves the instant policy
(zeros 50x32 float32) to the real ``openpi-client`` robots of ``bench_fleet`` (one process
each), and is measured interleaved with the others (order flipped every round): calls/s
and the server process's CPU per call (/proc utime + stime), medians over rounds.

* ``reference``: openpi's ``WebsocketPolicyServer`` (``reference_server.py``: websockets'
  own asyncio server, compression off, ``msgpack_numpy`` on the loop).
* ``uvicorn``: a bare ASGI function on uvicorn with our settings (``realtime.server.
  uvicorn_config``: h11, ``realtime/transport.py``'s protocol, no deflate): receive,
  ``msgpack_numpy.unpackb``, pack a fixed reply, send. What the transport costs.
* ``starlette``: the same loop as a Starlette ``WebSocketRoute`` endpoint.
* ``ours-min``: our app (``realtime.app.build_app``, the OpenPI endpoint, its receive,
  idle clock and send) with the request handling swapped for ``unpackb`` + the fixed reply.
* ``ours-decode``: as ``ours-min`` but the request decoded and validated by
  ``protocols/openpi.decode_request`` (no engine, no policy, no metrics).
* ``ours-policy``: then the policy's own ``run_batch`` (PolicyWork, forward, action checks).
* ``ours-submit``: then the engine around it as the endpoint calls it (``Engine.run_now``, inline).
* ``ours``: the server as ``realtime serve`` runs it (``bench_loopback`` ``serve_ours``).

Consecutive rows differ by one layer, so their difference is that layer's cost per
call under the same load. The swaps are patched in from here (``--role``, in the
server's own process); nothing in ``realtime/`` changes.

    python -m bench.openpi.ablate_layers --clients 4 16 --rounds 4 --seconds 1.5 \
        --out bench/results/openpi_layers.json

Bounded: rounds x clients x servers measurements of --seconds (+ ~1 s set-up each).
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench.openpi.bench_fleet import WARMUP_SECONDS, measure_rounds  # noqa: E402
from bench.openpi.bench_loopback import (PATH, Server, _free_port, _no_uvloop_path, hardware, log,  # noqa: E402
                                         ours_app, stop_process, versions, wait_healthy)

LAYERS = ("reference", "uvicorn", "starlette", "ours-min", "ours-decode", "ours-policy", "ours-submit", "ours")
_PATCHED = ("uvicorn", "starlette", "ours-min", "ours-decode", "ours-policy", "ours-submit")


# ---------------------------------------------------------------- servers (child processes)
def _serve(role: str, port: int) -> None:
    from openpi_client import msgpack_numpy

    from bench.openpi import profile_app
    from realtime.server import bind_socket, run

    reply = profile_app._REPLY  # the fixed reply of every swapped-in handler
    if role == "uvicorn":
        run(_bare_asgi(msgpack_numpy, reply), sock=bind_socket("127.0.0.1", port), log_level="warning")
        return
    if role == "starlette":
        run(profile_app.starlette_app(reply, with_healthz=True), sock=bind_socket("127.0.0.1", port), log_level="warning")
        return
    from realtime import openpi_ws

    # profile_app's stage handlers (the same swaps, measured there without sockets).
    handlers = {"ours-min": profile_app._handle_min, "ours-decode": profile_app._handle_decode,
                "ours-policy": profile_app._handle_policy, "ours-submit": profile_app._handle_submit}
    openpi_ws.OpenPIConnection.handle = handlers[role]  # type: ignore[method-assign]
    run(ours_app(port), sock=bind_socket("127.0.0.1", port), log_level="warning")


def _bare_asgi(msgpack_numpy: Any, reply: dict) -> Any:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        if scope["type"] == "http":  # /healthz
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"OK"})
            return
        await receive()
        await send({"type": "websocket.accept"})
        packer = msgpack_numpy.Packer()
        await send({"type": "websocket.send", "bytes": packer.pack({})})
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            msgpack_numpy.unpackb(message["bytes"])
            await send({"type": "websocket.send", "bytes": packer.pack(reply)})

    return app


class _Patched:
    """A server of one of ``_PATCHED``'s roles (this module's ``--role``), on asyncio's loop."""

    def __init__(self, role: str) -> None:
        port = _free_port()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_no_uvloop_path(), REPO, env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen([sys.executable, "-W", "ignore", os.path.abspath(__file__), "--role", role,
                                      "--port", str(port)], cwd=REPO, env=env)
        self.uri = f"ws://127.0.0.1:{port}{PATH}" if role != "uvicorn" else f"ws://127.0.0.1:{port}"
        wait_healthy(self.proc, f"127.0.0.1:{port}", role)

    def stop(self) -> None:
        stop_process(self.proc)


# ---------------------------------------------------------------- main
def run(args: argparse.Namespace) -> dict[str, Any]:
    load_start = [round(x, 2) for x in os.getloadavg()]
    names = tuple(args.servers)
    servers = {name: (_Patched(name) if name in _PATCHED else Server(name, 0.0, no_uvloop=True)) for name in names}
    measured = measure_rounds(servers, names, args.clients, args.rounds, args.seconds, WARMUP_SECONDS)
    raw = {n: {c: [(m["calls_per_s"], 1000 * m["server_cpu_s"] / max(m["calls"], 1)) for m in ms]
               for c, ms in by_clients.items()} for n, by_clients in measured.items()}
    results: dict[str, Any] = {}
    for clients in args.clients:
        row = {name: {"calls_per_s_median": round(statistics.median(x[0] for x in raw[name][clients]), 1),
                      "server_cpu_ms_per_call_median": round(statistics.median(x[1] for x in raw[name][clients]), 4),
                      "rounds": [[round(a, 1), round(b, 4)] for a, b in raw[name][clients]]} for name in names}
        steps = {f"{b}_minus_{a}_ms": round(row[b]["server_cpu_ms_per_call_median"] - row[a]["server_cpu_ms_per_call_median"], 4)
                 for a, b in zip(names, names[1:])}
        results[str(clients)] = {"servers": row, "cpu_per_call_steps": steps}
        log(f"{clients:>2} clients: " + "  ".join(f"{n} {row[n]['server_cpu_ms_per_call_median']:.3f} ms" for n in names))
    return {
        "benchmark": "openpi_layers",
        "command": "python -m bench.openpi.ablate_layers " + " ".join(sys.argv[1:]),
        "hardware": hardware(),
        "versions": versions(),
        "servers": list(names),
        "rounds": args.rounds,
        "seconds_per_measurement": args.seconds,
        "results": results,
        "load_average": {"start": load_start, "end": [round(x, 2) for x in os.getloadavg()]},
        "notes": "server CPU per call: /proc utime+stime of the server process over the measurement / calls; "
                 "medians over rounds; every server on asyncio's loop (uvloop hidden); see the module docstring "
                 "for what each layer adds.",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--servers", nargs="+", choices=LAYERS, default=list(LAYERS))
    ap.add_argument("--out", default=None)
    ap.add_argument("--role", choices=_PATCHED, help=argparse.SUPPRESS)  # a server process of this module
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        _serve(args.role, args.port)
        return
    from bench.report import emit

    emit(run(args), args.out, log=log)


if __name__ == "__main__":
    main()
