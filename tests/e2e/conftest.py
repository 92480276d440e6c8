"""A real uvicorn server on a free loopback port, in a background thread."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Iterator

import httpx
import pytest
import uvicorn

from models.world.tiny import TinyWorld
from realtime.app import build_app
from realtime.config import ServerConfig, WorldConfig
from realtime.registry import Inventory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(app, *, ws_max_size: int = 80 * 1024 * 1024) -> Iterator[str]:
    """Run ``app`` under uvicorn on 127.0.0.1 and yield ``host:port``."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws_max_size=ws_max_size,
                            ws_ping_interval=20.0, ws_ping_timeout=None, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


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
