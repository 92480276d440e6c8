"""A world model built from its checkpoint, served by a real uvicorn server: what the served
world-model tests (LingBot-World, Matrix-Game) share."""

from __future__ import annotations

import asyncio
import io
from contextlib import contextmanager
from typing import Any, Coroutine, Iterator

import numpy as np
from PIL import Image

from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.inventory import Inventory
from realtime.server.server import serve_in_thread


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """A test's client coroutine, failed after 240 s rather than hanging the suite."""
    return asyncio.run(asyncio.wait_for(coro, 240))


def png(w: int, h: int) -> bytes:
    """A ``w`` x ``h`` PNG of random colours (the same every call): a first image to send."""
    rgb = np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG")
    return buf.getvalue()


def url(addr: str) -> str:
    return f"ws://{addr}/v1/realtime/world"


@contextmanager
def serving(*worlds: Any) -> Iterator[str]:
    """``worlds`` (built adapters) served under their names on a free loopback port: its address."""
    inventory = Inventory()
    for world in worlds:
        inventory.add(world)
    app = build_app(ServerConfig(world=WorldConfig(models=tuple(w.name for w in worlds))), inventory)
    with serve_in_thread(app) as addr:
        yield addr
