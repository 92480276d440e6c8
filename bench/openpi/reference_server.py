"""The reference ``openpi-server``'s behaviour, restated as the benchmarks' baseline.

openpi's ``src/openpi/serving/websocket_policy_server.py`` (``WebsocketPolicyServer``,
read at Physical-Intelligence/openpi 15a9616; the ``openpi-server`` 0.1.0 wheel ships
the same file) cannot be installed here with its package, so this module does what it
does, call for call, and nothing more. It is our own text, kept for measurement only:

* ``websockets.asyncio.server.serve(handler, host, port, compression=None,
  max_size=None, process_request=<health check>)`` and ``serve_forever()`` inside
  ``asyncio.run``; ``GET /healthz`` answers ``200 "OK\\n"`` from ``process_request``.
* Per connection: one ``openpi_client.msgpack_numpy.Packer()``; the metadata dict is
  packed and sent first.
* Per message, on the event loop (the policy runs inline, blocking it):
  ``start = monotonic()``; ``obs = msgpack_numpy.unpackb(await ws.recv())``;
  ``action = policy.infer(obs)`` timed with ``monotonic()``;
  ``action["server_timing"] = {"infer_ms": ...}`` plus ``"prev_total_ms"`` from the
  second reply on (the previous message's receive-to-sent time); ``await
  ws.send(packer.pack(action))``.
* ``ConnectionClosed`` ends the handler quietly; any other exception sends
  ``traceback.format_exc()`` as a text frame, closes with 1011 (INTERNAL_ERROR,
  "Internal server error. Traceback included in previous frame.") and re-raises.

No bounds, no validation, no batching: that is the reference's behaviour, not ours.
``InstantPolicy`` is the probe's ``DummyPolicy``: ``{"actions": zeros(50, 32) float32}``,
optionally after sleeping ``infer_ms``.

    python -m bench.openpi.reference_server --port 8000 [--infer-ms 0]
"""

from __future__ import annotations

import argparse
import asyncio
import http
import logging
import time
import traceback
from typing import Any

import numpy as np
import websockets
import websockets.asyncio.server as ws_server
import websockets.frames
from openpi_client import base_policy, msgpack_numpy

log = logging.getLogger(__name__)

CLOSE_REASON = "Internal server error. Traceback included in previous frame."


class InstantPolicy(base_policy.BasePolicy):
    """The reference probe's dummy policy: zeros (50, 32) float32, a fresh dict per call."""

    def __init__(self, infer_ms: float = 0.0) -> None:
        self._actions = np.zeros((50, 32), np.float32)
        self._sleep = infer_ms / 1000.0

    def infer(self, obs: dict) -> dict:
        if self._sleep:
            time.sleep(self._sleep)
        return {"actions": self._actions}


class ReferencePolicyServer:
    """openpi's ``WebsocketPolicyServer``, same library calls and per-message work."""

    def __init__(self, policy: base_policy.BasePolicy, host: str = "0.0.0.0", port: int | None = None,
                 metadata: dict | None = None) -> None:
        self._policy = policy
        self._host = host
        self._port = port
        self._metadata = metadata or {}
        logging.getLogger("websockets.server").setLevel(logging.INFO)

    def serve_forever(self) -> None:
        asyncio.run(self.run())

    async def run(self) -> None:
        async with ws_server.serve(self._handler, self._host, self._port, compression=None, max_size=None,
                                   process_request=_health_check) as server:
            await server.serve_forever()

    async def _handler(self, websocket: ws_server.ServerConnection) -> None:
        log.info("Connection from %s opened", websocket.remote_address)
        packer = msgpack_numpy.Packer()
        await websocket.send(packer.pack(self._metadata))
        prev_total: float | None = None
        while True:
            try:
                start = time.monotonic()
                obs = msgpack_numpy.unpackb(await websocket.recv())
                t0 = time.monotonic()
                action: dict[str, Any] = self._policy.infer(obs)
                infer_s = time.monotonic() - t0
                action["server_timing"] = {"infer_ms": infer_s * 1000}
                if prev_total is not None:
                    action["server_timing"]["prev_total_ms"] = prev_total * 1000
                await websocket.send(packer.pack(action))
                prev_total = time.monotonic() - start
            except websockets.ConnectionClosed:
                log.info("Connection from %s closed", websocket.remote_address)
                break
            except Exception:
                await websocket.send(traceback.format_exc())
                await websocket.close(code=websockets.frames.CloseCode.INTERNAL_ERROR, reason=CLOSE_REASON)
                raise


def _health_check(connection: ws_server.ServerConnection, request: ws_server.Request) -> ws_server.Response | None:
    if request.path == "/healthz":
        return connection.respond(http.HTTPStatus.OK, "OK\n")
    return None  # every other path: the WebSocket handshake


# The metadata the benchmarks' reference serves (the probe's).
METADATA = {"action_horizon": 50, "action_dim": 32}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--infer-ms", type=float, default=0.0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    ReferencePolicyServer(InstantPolicy(args.infer_ms), host=args.host, port=args.port, metadata=METADATA).serve_forever()


if __name__ == "__main__":
    main()
