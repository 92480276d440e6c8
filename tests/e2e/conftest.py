"""A real uvicorn server on a free loopback port, in a background thread (realtime/server/server.py)."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest

from models.world.tiny import TinyWorld
from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.inventory import Inventory
from realtime.server.server import serve_in_thread


# The same uvicorn settings as ``realtime serve``, on a free loopback port.
serve = serve_in_thread


def tiny_app(**world: object):
    config = ServerConfig(world=WorldConfig(models=("tiny",), **world))
    inventory = Inventory()
    model = TinyWorld(max_batch=config.world.max_batch)
    inventory.adapters[model.name] = model
    return build_app(config, inventory)


@pytest.fixture
def tiny_server() -> Iterator[str]:
    with serve(tiny_app()) as addr:
        assert httpx.get(f"http://{addr}/healthz").text == "OK"
        yield addr
