"""Client faults against a real server process: a client that vanishes mid-tick or stops
reading, and a long robot inference next to a robot sending garbage (SIGTERM and SIGKILL
under load: test_drain.py)."""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

import websockets
from openpi_client import msgpack_numpy

from clients.world import WorldClient
from tests.reliability.conftest import FaultServer, robot_obs

# The issue asks for a 60 s inference; CI uses a few seconds (RELIABILITY_LONG_INFERENCE_S
# raises it), with a client that pings every 0.5 s and gives up after 0.5 s without a pong.
LONG_S = float(os.environ.get("RELIABILITY_LONG_INFERENCE_S", "3"))


def rss_mb(pid: int) -> float:
    return int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1)) / 1024


async def until(check, within_s: float) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > within_s:
            raise AssertionError(f"not within {within_s} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - started


def test_vanished_and_stalled_clients_are_cleaned_up_and_ids_reusable(fault_server):
    url = f"ws://{fault_server.addr}/v1/realtime/world"
    active = lambda: fault_server.sample("realtime_sessions", kind="world", state="active")  # noqa: E731

    async def main() -> None:
        # A client that stops reading with every credit it may hold: memory stays bounded.
        stalled = await websockets.connect(url, max_size=None)
        await stalled.send('{"type": "session.create", "session_id": "stall", "credits": 64, "format": "rgb8"}')
        before = rss_mb(fault_server.proc.pid)
        await asyncio.sleep(3)
        assert rss_mb(fault_server.proc.pid) - before < 64
        stalled.transport.abort()  # gone without a close frame
        async with WorldClient.connect(url) as c:
            await c.create("vanish", credits=8, seed=1, format="rgb8")
            await c.next_chunk(credit=False)
            c.ws.transport.abort()  # mid-tick: more chunks were credited
        # The goal is 1 s and a quiet run takes 0.2 s; with a soak and another server beside
        # it on the shared 2-core box it once took over 1 s, so the bound allows for load.
        took = await until(lambda: active() == 0, 5.0)
        print(f"vanished and stalled sessions cleaned up after {took:.2f} s")
        async with WorldClient.connect(url) as a, WorldClient.connect(url) as b:
            for client, sid in ((a, "vanish"), (b, "stall")):
                await client.create(sid, credits=1, format="rgb8")
                assert (await client.next_chunk(credit=False)).chunk_index == 0
            await a.close()
            await b.close()

    asyncio.run(asyncio.wait_for(main(), 60))
    assert fault_server.sample("realtime_kv_blocks", model="maze", state="used") == 0


def test_long_inference_keeps_its_robot_and_garbage_disturbs_no_one(fault_server):
    url = f"ws://{fault_server.addr}/v1/realtime/robot/openpi"

    async def main() -> None:
        async with websockets.connect(url, ping_interval=0.5, ping_timeout=0.5, max_size=None) as a, \
                websockets.connect(url, max_size=None) as bad:
            await a.recv(), await bad.recv()  # metadata
            await a.send(msgpack_numpy.packb(robot_obs(f"sleep:{LONG_S}")))
            await asyncio.sleep(0.2)
            started = time.monotonic()
            await bad.send(b"\xc1 not msgpack")
            text = await asyncio.wait_for(bad.recv(), 1.0)
            assert text.startswith("invalid request") and time.monotonic() - started < 1.0
            reply = msgpack_numpy.unpackb(await asyncio.wait_for(a.recv(), LONG_S + 30))
            assert reply["actions"].shape == (4, 3)
            await a.send(msgpack_numpy.packb(robot_obs()))  # still connected, still served
            assert msgpack_numpy.unpackb(await a.recv())["actions"].shape == (4, 3)

    asyncio.run(asyncio.wait_for(main(), LONG_S + 60))
