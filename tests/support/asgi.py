"""Pieces of bare ASGI apps for the transport tests."""

from __future__ import annotations

from typing import Any


async def lifespan(receive: Any, send: Any) -> None:
    """Answer a lifespan scope: start up, then shut down when told."""
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})
