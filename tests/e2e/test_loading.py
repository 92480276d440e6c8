"""The server answers while its models load (realtime/server/loading.py), through a real uvicorn
server: readiness and progress on ``/healthz`` and ``/v1/models``, ``/livez`` throughout, every
kind of session refused with ``loading`` and close 1013, then served once the models are in.

The slow model is a tiny world whose build waits on an event the test sets (a checkpoint read
that takes as long as the test wants), reporting bytes read as a large checkpoint's does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Iterator

import httpx
import pytest
import websockets

from models.factory import FactoryError, ModelUnavailable
from models.policy import DummyPolicy
from models.world.tiny import TinyWorld
from protocols.close_codes import CLOSE_TRY_AGAIN_LATER
from realtime.server import loading as loading_module
from realtime.server.app import build_app
from realtime.server.config import PolicyConfig, ServerConfig, TTSConfig, WorldConfig
from realtime.server.inventory import Planned
from realtime.server.loading import Loading
from tests.e2e.conftest import serve

CHECKPOINT_BYTES = 3_000_000_000
CONFIG = ServerConfig(world=WorldConfig(models=("tiny",)))


class SlowWorld:
    """A world build that reads "half its checkpoint", then waits for ``release``."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.reading = threading.Event()

    def build(self, progress) -> TinyWorld:
        progress("reading checkpoint", CHECKPOINT_BYTES // 2, CHECKPOINT_BYTES)
        self.reading.set()
        if not self.release.wait(30):
            raise RuntimeError("the test never released the build")
        progress("warming up")
        return TinyWorld()


def get(addr: str, path: str) -> httpx.Response:
    return httpx.get(f"http://{addr}{path}", timeout=5)


def wait_ready(addr: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while get(addr, "/healthz").status_code != 200:
        assert time.monotonic() < deadline, "the server did not become ready"
        time.sleep(0.02)


async def refused(url: str) -> tuple[str, int | None, str]:
    """The first frame a connection gets, and how the socket then closed."""
    ws = await websockets.connect(url, max_size=None)
    first = await asyncio.wait_for(ws.recv(), 5)
    with pytest.raises(websockets.ConnectionClosed):
        await asyncio.wait_for(ws.recv(), 5)
    return first, ws.close_code, ws.close_reason  # type: ignore[return-value]


@pytest.fixture
def slow() -> Iterator[tuple[str, SlowWorld]]:
    world = SlowWorld()
    plan = [Planned("slow-world", "world", world.build),
            Planned("dummy", "policy", lambda progress: DummyPolicy())]
    app = build_app(CONFIG, loading=Loading(plan))
    with serve(app) as addr:
        try:
            assert world.reading.wait(10)
            yield addr, world
        finally:
            world.release.set()


def test_readiness_and_progress_while_a_model_loads_then_ready(slow):
    addr, world = slow
    assert (get(addr, "/livez").status_code, get(addr, "/livez").text) == (200, "OK")
    health = get(addr, "/healthz")
    assert health.status_code == 503
    assert health.text.startswith("loading: slow-world (world): reading checkpoint, 1.5 GB of 3.0 GB, ")
    models = get(addr, "/v1/models").json()["data"]
    assert [(m["id"], m["kind"], m["state"], m["available"], m["stage"]) for m in models] == [
        ("slow-world", "world", "loading", False, "reading checkpoint"),
        ("dummy", "policy", "loading", False, "queued")]
    assert (models[0]["done_bytes"], models[0]["total_bytes"]) == (CHECKPOINT_BYTES // 2, CHECKPOINT_BYTES)
    assert models[1]["done_bytes"] is None and models[1]["seconds"] == 0.0

    world.release.set()
    wait_ready(addr)
    assert (get(addr, "/healthz").text, get(addr, "/livez").status_code) == ("OK", 200)
    models = get(addr, "/v1/models").json()["data"]
    assert [(m["id"], m["kind"], m["state"], m["available"]) for m in models] == [
        ("tiny", "world", "ready", True), ("dummy-policy", "policy", "ready", True)]


def test_every_kind_is_refused_with_loading_and_1013_until_the_models_are_in(slow):
    addr, world = slow

    async def main() -> None:
        first, code, reason = await refused(f"ws://{addr}/v1/realtime/world")
        msg = json.loads(first)
        assert (msg["type"], msg["code"], code, reason) == ("error", "loading", CLOSE_TRY_AGAIN_LATER, "models loading")
        assert msg["message"].startswith("the server is still loading its models (slow-world (world): "
                                         "reading checkpoint, 1.5 GB of 3.0 GB, ")
        assert msg["message"].endswith("; connect again in a few seconds (GET /healthz answers 200 once it is ready)")

        first, code, reason = await refused(f"ws://{addr}/v1/realtime/tts")
        msg = json.loads(first)
        assert (msg["type"], msg["code"], code, reason) == ("error", "loading", CLOSE_TRY_AGAIN_LATER, "models loading")

        # OpenPI: the text frame instead of the metadata (the real client raises it), then 1013.
        for path in ("/v1/realtime/robot/openpi", "/"):
            first, code, reason = await refused(f"ws://{addr}{path}")
            assert first.startswith("loading: the server is still loading its models (slow-world (world): ")
            assert (code, reason) == (CLOSE_TRY_AGAIN_LATER, "models loading")

        assert get(addr, "/livez").status_code == 200
        world.release.set()
        await asyncio.to_thread(wait_ready, addr)

        ws = await websockets.connect(f"ws://{addr}/v1/realtime/world", max_size=None)
        await ws.send(json.dumps({"type": "session.create", "session_id": "after-load", "model": "tiny"}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "session.created"
        await ws.close()
        robot = await websockets.connect(f"ws://{addr}/v1/realtime/robot/openpi", max_size=None)
        assert isinstance(await asyncio.wait_for(robot.recv(), 5), bytes)  # the msgpack metadata
        await robot.close()

    asyncio.run(main())


def test_a_model_that_cannot_load_is_unavailable_and_the_fallback_world_serves():
    def missing(progress):
        raise ModelUnavailable("FileNotFoundError: /nope/weights.safetensors")

    app = build_app(CONFIG, loading=Loading([Planned("maze", "world", missing)],
                                            fallback=Planned("tiny", "world", lambda progress: TinyWorld())))
    with serve(app) as addr:
        wait_ready(addr)
        models = get(addr, "/v1/models").json()["data"]
    assert [(m["id"], m["state"], m["available"]) for m in models] == [
        ("tiny", "ready", True), ("maze", "unavailable", False)]
    assert models[1]["reason"] == "FileNotFoundError: /nope/weights.safetensors"


def test_a_model_that_cannot_be_built_as_asked_fails_readiness_with_its_line(caplog):
    def refused_option(progress):
        raise FactoryError("lingbot=/ckpt?steps=2: option decoder: bad layout")

    loading = Loading([Planned("lingbot", "world", refused_option)])
    with caplog.at_level(logging.ERROR, logger="realtime.server.app"):
        with serve(build_app(CONFIG, loading=loading)) as addr:
            deadline = time.monotonic() + 10
            while not get(addr, "/healthz").text.startswith("failed"):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            health = get(addr, "/healthz")
            assert (health.status_code, health.text) == (
                503, "failed: lingbot=/ckpt?steps=2: option decoder: bad layout")
            assert get(addr, "/livez").status_code == 200
    # The CLI prints this line and exits with status 2 (``realtime serve`` runs on the main
    # thread, where the failure also stops the server as SIGTERM does).
    assert loading.failure == "lingbot=/ckpt?steps=2: option decoder: bad layout"
    assert [r.getMessage() for r in caplog.records] == [
        "cannot serve: lingbot=/ckpt?steps=2: option decoder: bad layout"]


def test_an_entry_the_table_refuses_stops_build_app_before_anything_loads():
    bad = ServerConfig(world=WorldConfig(models=("tiny=x?steps=2",)), policy=PolicyConfig(policy=""),
                       tts=TTSConfig(enabled=False))
    with pytest.raises(FactoryError, match=r"^tiny=x\?steps=2: model 'tiny' takes no options$"):
        build_app(bad)
    with pytest.raises(FactoryError, match="unknown model 'nope'"):
        build_app(ServerConfig(policy=PolicyConfig(policy="nope"), tts=TTSConfig(enabled=False)))


def test_a_slow_model_logs_its_progress(monkeypatch, caplog):
    monkeypatch.setattr(loading_module, "SLOW_S", 0.0)
    monkeypatch.setattr(loading_module, "LOG_EVERY_S", 0.1)
    world = SlowWorld()
    with caplog.at_level(logging.INFO, logger="realtime.server.loading"):
        with serve(build_app(CONFIG, loading=Loading([Planned("slow-world", "world", world.build)]))) as addr:
            deadline = time.monotonic() + 10
            while not any("loading slow-world" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            world.release.set()
            wait_ready(addr)
    line = next(r.getMessage() for r in caplog.records if "loading slow-world" in r.getMessage())
    assert line.startswith("loading slow-world (world): reading checkpoint, 1.5 GB of 3.0 GB, ")


def test_a_shutdown_while_loading_stops_the_build_at_its_next_report_and_closes_what_was_built():
    closed: list[str] = []
    reading = threading.Event()

    class Closing(TinyWorld):
        def close(self) -> None:
            closed.append(self.name)

    def endless(progress):
        for n in range(10_000):  # a checkpoint of many shards, reported one by one
            progress("reading checkpoint", n, 10_000)
            reading.set()
            time.sleep(0.01)
        raise AssertionError("the load was not stopped")

    loading = Loading([Planned("tiny", "world", lambda progress: Closing()),
                       Planned("huge", "world", endless)])
    with serve(build_app(CONFIG, loading=loading)) as addr:
        assert reading.wait(10)
        assert get(addr, "/healthz").text.startswith("loading: huge (world): reading checkpoint")
    assert not loading.thread.is_alive()  # the process may exit: no build is left inside torch
    assert closed == ["tiny"]
