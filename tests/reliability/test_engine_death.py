"""The engine thread dying (a CUDA error in a forward), in a real server process:
/healthz 503 within a second, every live session of every kind told, new
connections of every kind refused within a second, nothing hangs."""

from __future__ import annotations

import asyncio
import time

import httpx
import websockets
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from clients.world import WorldClient
from tests.reliability.conftest import robot_obs


def test_engine_death_fails_every_session_fast(fault_server):
    addr = fault_server.addr
    url = f"ws://{addr}/v1/realtime/world"
    robot = WebsocketClientPolicy(f"ws://{addr}/v1/realtime/robot/openpi")
    assert robot.infer(robot_obs())["actions"].shape == (4, 3)  # a live, idle robot

    async def main() -> None:
        async with WorldClient.connect(url) as idle, WorldClient.connect(url) as dying:
            await idle.create("idle", credits=1, seed=1, format="rgb8")
            assert (await idle.next_chunk(credit=False)).chunk_index == 0  # then idle: no credits
            await dying.create("die-at-2-x", credits=8, seed=2, format="rgb8")
            assert [(await dying.next_chunk(credit=False)).chunk_index for _ in range(2)] == [0, 1]
            died = time.monotonic()
            assert (await dying.expect("error", timeout=5))["code"] == "session_failed"
            assert (await idle.expect("error", timeout=1))["code"] == "session_failed"
            async with httpx.AsyncClient() as http:
                health = await http.get(f"http://{addr}/healthz")
            assert health.status_code == 503 and time.monotonic() - died < 1.0
            # New connections of every kind fail, each within a second.
            started = time.monotonic()
            async with WorldClient.connect(url) as late:
                await late.send({"type": "session.create", "session_id": "late"})
                assert (await late.expect("error", timeout=1))["code"] == "internal"
            assert time.monotonic() - started < 1.0
            started = time.monotonic()
            async with websockets.connect(f"ws://{addr}/v1/realtime/robot/openpi") as ws:
                text = await asyncio.wait_for(ws.recv(), 1)
                assert text.startswith("engine unavailable")
                await asyncio.wait_for(ws.wait_closed(), 1)
                assert ws.close_code == 1011
            assert time.monotonic() - started < 1.0
            await asyncio.wait_for(asyncio.gather(idle.ws.close(), dying.ws.close()), 2)

    asyncio.run(asyncio.wait_for(main(), 60))
    # The idle robot was told too: its socket is closed with the error text.
    started = time.monotonic()
    try:
        robot.infer(robot_obs())
        raise AssertionError("a robot on a dead engine got actions")
    except websockets.ConnectionClosedError as exc:  # the server closed it with the error text first
        assert exc.rcvd is not None and exc.rcvd.code == 1011, exc
    except RuntimeError as exc:  # the real client raises the error text it read
        assert "engine unavailable" in str(exc), exc
    assert time.monotonic() - started < 1.0
    assert fault_server.sample("realtime_engine_healthy") == 0
    assert fault_server.sample("realtime_tick_failures_total", model="maze", code="engine_dead") >= 1
