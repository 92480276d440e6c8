"""Regression tests for the endpoint defects of issue 12 (each failed before its fix).

1. A failed close can be retried: on the same connection, and by id from a new
   connection after a disconnect (world.v1 ``session.close`` with ``session_id``).
3. No traceback in the server log when a client closes right after its own
   ``session.close`` (the TTS endpoint's final close raced the client's).
*. OpenPI at ``/``: ``WebsocketClientPolicy(host="127.0.0.1", port=PORT)``, the form
   openpi's examples use, reaches the policy while HTTP GET ``/`` still serves the page.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Iterator

import httpx
import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from clients.world import ServerError, WorldClient
from models.policy import DummyPolicy
from models.world.tiny import TinyWorld
from protocols.openpi import PolicyMetadata
from realtime.server.app import build_app
from realtime.server.config import PolicyConfig, ServerConfig, TTSConfig, WorldConfig
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


class FlakyRelease(TinyWorld):
    """The tiny world whose ``release`` raises the first ``failures`` times."""

    def __init__(self, failures: int) -> None:
        super().__init__(max_batch=4)
        self.failures = failures
        self.calls = 0

    def drop_session(self, session_id: str) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError(f"simulated cleanup failure {self.calls}")
        super().drop_session(session_id)


def _world_app(model: TinyWorld):
    inventory = Inventory()
    inventory.add(model)
    config = ServerConfig(world=WorldConfig(models=("tiny",)), policy=PolicyConfig(policy=""),
                          tts=TTSConfig(enabled=False))
    return build_app(config, inventory)


def url(addr: str) -> str:
    return f"ws://{addr}/v1/realtime/world"


def test_failed_close_is_retried_on_the_same_connection():
    model = FlakyRelease(failures=1)

    async def main(addr: str) -> None:
        async with WorldClient.connect(url(addr)) as c:
            await c.create("retry-1", credits=1)
            await c.next_chunk(credit=False)
            with pytest.raises(ServerError) as info:
                await c.close()
            assert info.value.code == "internal"
            assert "retry session.close" in str(info.value)
            closed = await c.close()
            assert closed == {"type": "session.closed", "session_id": "retry-1", "dropped_event_ids": []}
            # The id is free again.
            assert (await c.create("retry-1", credits=0))["session_id"] == "retry-1"

    with serve(_world_app(model)) as addr:
        run(main(addr))


def test_failed_close_is_retried_by_id_after_a_disconnect():
    # Fails on close and again on the disconnect's cleanup; the third try succeeds.
    model = FlakyRelease(failures=2)

    async def main(addr: str) -> None:
        async with WorldClient.connect(url(addr)) as c:
            await c.create("retry-2", credits=0)
            with pytest.raises(ServerError):
                await c.close()
        async with WorldClient.connect(url(addr)) as c:
            await c.send({"type": "session.create", "session_id": "retry-2"})
            err = await c.expect("error")
            assert err["code"] == "session_exists"
            await c.send({"type": "session.close", "session_id": "retry-2"})
            closed = await c.expect("session.closed")
            assert closed == {"type": "session.closed", "session_id": "retry-2", "dropped_event_ids": []}
            assert (await c.create("retry-2", credits=0))["session_id"] == "retry-2"
            # A close by id names only tombstones: a live session of another connection is not closable.
        async with WorldClient.connect(url(addr)) as other:
            await other.send({"type": "session.close", "session_id": "retry-2"})
            err = await other.expect("error")
            assert err["code"] == "no_session"

    with serve(_world_app(model)) as addr:
        run(main(addr))


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        # Handler.handle holds the handler's own lock around emit.
        self.records.append(record)


@contextlib.contextmanager
def error_log() -> Iterator[_Errors]:
    handler = _Errors()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn"), logging.getLogger("uvicorn.error")]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        yield handler
    finally:
        for lg in loggers:
            lg.removeHandler(handler)


def test_tts_client_runs_leave_no_error_in_the_server_log():
    tts_adapter = pytest.importorskip("models.tts.piper.adapter")
    from clients.tts import synthesize
    from models.tts.piper.availability import TTSUnavailable

    try:
        voice = tts_adapter.PiperTTS.load(device="cpu", max_batch=4)
    except TTSUnavailable as exc:
        pytest.skip(f"TTS extra not installed: {exc}")
    inventory = Inventory()
    inventory.add(voice)
    app = build_app(ServerConfig(world=WorldConfig(models=()), policy=PolicyConfig(policy="")), inventory)
    with serve(app) as addr, error_log() as errors:
        for _ in range(20):
            result = asyncio.run(synthesize("Hi.", f"ws://{addr}/v1/realtime/tts", timeout=30))
            assert result.samples > 0
    assert [r.getMessage() for r in errors.records] == []


def test_world_and_openpi_clients_closing_first_leave_no_error():
    policy = DummyPolicy(metadata=PolicyMetadata(action_horizon=2, action_dim=2, image_keys=("cam",),
                                                 image_resolution=(8, 8), state_dim=1))
    inventory = Inventory()
    inventory.add(TinyWorld(max_batch=4))
    inventory.add(policy)
    app = build_app(ServerConfig(world=WorldConfig(models=("tiny",)), tts=TTSConfig(enabled=False)), inventory)

    async def world(addr: str, i: int) -> None:
        async with WorldClient.connect(url(addr)) as c:
            await c.create(f"quick-{i}", credits=2)
            await c.close()

    with serve(app) as addr, error_log() as errors:
        for i in range(10):
            run(world(addr, i))
            robot = WebsocketClientPolicy(host=f"ws://{addr}/v1/realtime/robot/openpi")
            robot.infer({"cam": np.zeros((8, 8, 3), np.uint8), "state": np.zeros(1, np.float32), "prompt": "x"})
            robot._ws.close()
    assert [r.getMessage() for r in errors.records] == []


def test_openpi_at_the_root_with_host_and_port():
    policy = DummyPolicy(metadata=PolicyMetadata(action_horizon=3, action_dim=2, image_keys=("cam",),
                                                 image_resolution=(16, 16), state_dim=2))
    inventory = Inventory()
    inventory.add(policy)
    config = ServerConfig(world=WorldConfig(models=()), tts=TTSConfig(enabled=False))
    with serve(build_app(config, inventory)) as addr:
        host, port = addr.rsplit(":", 1)
        robot = WebsocketClientPolicy(host=host, port=int(port))
        assert robot.get_server_metadata() == policy.metadata.to_wire()
        out = robot.infer({"cam": np.zeros((16, 16, 3), np.uint8), "state": np.zeros(2, np.float32), "prompt": "go"})
        assert out["actions"].shape == (3, 2)
        robot._ws.close()
        page = httpx.get(f"http://{addr}/")
        assert page.status_code == 200 and "<html" in page.text.lower()
