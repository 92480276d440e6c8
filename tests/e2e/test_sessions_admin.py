"""``GET /v1/sessions`` and ``DELETE /v1/sessions/{kind}/{id}`` through a real server:
the tiny world, a dummy policy behind the real openpi-client, and the voice when the
tts extra is installed."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Iterator

import httpx
import numpy as np
import pytest
import websockets
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from models.policy import DummyPolicy
from models.world.tiny import TinyWorld
from protocols.openpi import PolicyMetadata
from realtime.server.admin import admin_allowed
from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from protocols.close_codes import CLOSE_ADMIN
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve

META = PolicyMetadata(action_horizon=5, action_dim=3, image_keys=("cam",), image_resolution=(32, 32), state_dim=2)
OBS = {"cam": np.zeros((32, 32, 3), np.uint8), "state": np.zeros(2, np.float32), "prompt": "go"}


def _voice():
    try:
        from models.tts.piper.adapter import PiperTTS

        return PiperTTS.load(device="cpu", max_batch=1)
    except Exception:  # noqa: BLE001 - no tts extra or voice: the other kinds are still tested
        return None


def app(**config: object):
    inventory = Inventory()
    for adapter in (TinyWorld(max_batch=8), DummyPolicy(metadata=META, max_batch=4), _voice()):
        if adapter is not None:
            inventory.adapters[adapter.name] = adapter
    return build_app(ServerConfig(world=WorldConfig(models=("tiny",)), **config), inventory)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serve(app()) as addr:
        yield addr


def sessions(addr: str) -> list[dict]:
    reply = httpx.get(f"http://{addr}/v1/sessions", timeout=5)
    assert reply.status_code == 200
    return reply.json()["data"]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def world(addr: str, sid: str):
    ws = await websockets.connect(f"ws://{addr}/v1/realtime/world?session_id={sid}", max_size=None)
    await ws.send(json.dumps({"type": "session.create", "session_id": sid, "format": "rgb8"}))
    while True:
        msg = await ws.recv()
        if isinstance(msg, str) and json.loads(msg)["type"] == "session.created":
            return ws


async def until_error(ws) -> dict:
    while True:
        msg = await ws.recv()
        if isinstance(msg, str) and json.loads(msg)["type"] == "error":
            return json.loads(msg)


def test_lists_every_kind_and_closes_one(server):
    async def main():
        w = await world(server, "admin-w1")
        other = await world(server, "admin-w2")
        robot = await asyncio.to_thread(WebsocketClientPolicy, host=f"ws://{server}/v1/realtime/robot/openpi")
        await asyncio.to_thread(robot.infer, {**OBS, "session_id": "admin-r1"})
        tts = None
        kinds = {m["kind"] for m in httpx.get(f"http://{server}/v1/models").json()["data"] if m["available"]}
        if "tts" in kinds:
            tts = await websockets.connect(f"ws://{server}/v1/realtime/tts", max_size=None)
            await tts.recv()
        await asyncio.sleep(0.3)  # a few world ticks
        listed = {(s["kind"], s["session_id"]): s for s in sessions(server)}
        assert ("world", "admin-w1") in listed and ("world", "admin-w2") in listed
        assert listed[("policy", "admin-r1")]["chunk_index"] == 1
        assert listed[("world", "admin-w1")]["model"] == "tiny"
        assert listed[("world", "admin-w1")]["chunk_index"] >= 1
        assert abs(listed[("world", "admin-w1")]["last_tick"] - time.time()) < 30
        assert set(listed[("world", "admin-w1")]) == {"kind", "session_id", "model", "state", "chunk_index",
                                                     "last_tick"}
        assert (tts is not None) == any(k == "tts" for k, _ in listed)

        # World: closed_by_admin, then close 1008; the other world session keeps ticking.
        reply = httpx.delete(f"http://{server}/v1/sessions/world/admin-w1", timeout=10)
        assert reply.status_code == 200 and reply.json()["session_id"] == "admin-w1"
        assert (await until_error(w))["code"] == "closed_by_admin"
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                await w.recv()
        assert w.close_code == CLOSE_ADMIN

        # Policy: a robot between calls finds the socket closed 1008 "closed by admin"
        # (one waiting for a reply raises the text frame). The text frame comes first, so
        # a client whose reader thread has not yet seen the close (a loaded machine) sends
        # its next call and raises that text instead.
        assert httpx.delete(f"http://{server}/v1/sessions/policy/admin-r1", timeout=10).status_code == 200
        with pytest.raises((websockets.ConnectionClosed, RuntimeError),
                           match="1008.*closed by admin|closed_by_admin: session admin-r1"):
            await asyncio.to_thread(robot.infer, {**OBS, "session_id": "admin-r1"})
        with pytest.raises(websockets.ConnectionClosed, match="1008.*closed by admin"):
            while True:  # either way the socket is closed 1008 (after any frame still queued)
                await asyncio.to_thread(robot._ws.recv, 10)

        if tts is not None:
            sid = next(s for k, s in listed if k == "tts")
            assert httpx.delete(f"http://{server}/v1/sessions/tts/{sid}", timeout=10).status_code == 200
            assert (await until_error(tts))["code"] == "closed_by_admin"
            with pytest.raises(websockets.ConnectionClosed):
                await tts.recv()
            assert tts.close_code == CLOSE_ADMIN

        assert httpx.delete(f"http://{server}/v1/sessions/world/admin-w1", timeout=10).status_code == 404
        deadline = time.monotonic() + 5
        while {(s["kind"], s["session_id"]) for s in sessions(server)} != {("world", "admin-w2")}:
            assert time.monotonic() < deadline, sessions(server)
            await asyncio.sleep(0.05)
        before = next(s for s in sessions(server) if s["session_id"] == "admin-w2")["chunk_index"]
        await other.send(json.dumps({"type": "credit", "chunks": 4}))
        await asyncio.sleep(0.3)
        after = next(s for s in sessions(server) if s["session_id"] == "admin-w2")["chunk_index"]
        assert after > before
        await other.close()

    run(main())


def test_only_allowed_addresses():
    with serve(app(admin_from=("10.1.2.3",))) as addr:
        assert httpx.get(f"http://{addr}/v1/sessions").status_code == 403
        assert httpx.delete(f"http://{addr}/v1/sessions/world/x").status_code == 403
        assert httpx.get(f"http://{addr}/healthz").status_code == 200
    assert admin_allowed("127.0.0.1", ("loopback",)) and admin_allowed("::1", ("loopback",))
    assert not admin_allowed("192.168.1.5", ("loopback",))
    assert admin_allowed("192.168.1.5", ("*",)) and admin_allowed("10.1.2.3", ("10.1.2.3",))
    assert not admin_allowed(None, ("loopback",))
