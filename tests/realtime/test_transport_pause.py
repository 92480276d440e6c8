"""realtime/server/transport.py item 5: no read pause for a message the app waits for; a pause still
bounds what a client queues while the app is busy. Real uvicorn on loopback, raw ASGI app."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from websockets.sync.client import connect

from realtime.server.server import serve_in_thread
from realtime.server.transport import ABORT_EXTENSION
from tests.support.asgi import lifespan


class Counting:
    """The connection's transport as its protocol sees it, counting read pauses."""

    def __init__(self, transport: Any) -> None:
        self._transport, self.pauses = transport, 0

    def pause_reading(self) -> None:
        self.pauses += 1
        self._transport.pause_reading()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    if scope["type"] != "websocket":
        return
    transport = scope["extensions"][ABORT_EXTENSION]["abort"].__self__  # the connection's transport
    counting = transport.get_protocol().transport = Counting(transport)
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    seen = []
    first = await receive()  # the app waits: this message is taken at once
    seen.append({"got": first.get("text"), "reading": transport.is_reading(), "pauses": counting.pauses})
    await send({"type": "websocket.send", "text": "busy"})
    await asyncio.sleep(0.3)  # busy: the client's next messages arrive meanwhile
    seen.append({"reading_while_busy": transport.is_reading(), "pauses": counting.pauses})
    seen.append({"got": [(await receive()).get("text") for _ in range(2)], "reading": transport.is_reading()})
    await send({"type": "websocket.send", "text": json.dumps(seen)})
    await receive()


def test_reading_pauses_only_while_the_app_is_busy():
    with serve_in_thread(app) as addr, connect(f"ws://{addr}/") as ws:
        ws.send("one")
        assert ws.recv(timeout=5) == "busy"
        ws.send("two")
        ws.send("three")
        seen = json.loads(ws.recv(timeout=5))
    # No pause for "one" (the app waited for it); one for "two" (the app was busy).
    assert seen == [{"got": "one", "reading": True, "pauses": 0}, {"reading_while_busy": False, "pauses": 1},
                    {"got": ["two", "three"], "reading": True}]
