"""keys.v1 through a real server and a real model: what the frames show for each key update."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

import numpy as np

from clients.world import WorldClient
from models.world.tiny import TinyWorld
from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve


def test_a_key_pulse_inside_one_chunk_acts_for_one_frame():
    """Issue 12, defect 2: held [j] then held [] before one tick left no trace; it must
    act as script [[j], [], []] does, on a real model with 3-frame chunks."""
    model = TinyWorld(frames_per_chunk=3)
    inventory = Inventory()
    inventory.adapters[model.name] = model
    app = build_app(ServerConfig(world=WorldConfig(models=("tiny",), frames_per_chunk=3)), inventory)

    async def play(addr: str, sid: str, send: Callable[[WorldClient], Awaitable[None]]) -> list[np.ndarray]:
        async with WorldClient.connect(f"ws://{addr}/v1/realtime/world") as c:
            await c.create(sid, credits=0, format="rgb8", seed=5)
            await send(c)
            await c.credit(2)
            chunks = [await c.next_chunk(credit=False) for _ in range(2)]
            assert chunks[1].applied_event_ids == []  # every update went into the first tick
            return [f for x in chunks for f in x.frames()]

    async def pulse(c: WorldClient) -> None:
        await c.hold_keys(["j"])
        await c.hold_keys([])

    async def scripted(c: WorldClient) -> None:
        await c.script_keys([["j"], [], []])

    async def still(c: WorldClient) -> None:
        await c.hold_keys([])

    with serve(app) as addr:
        pulsed, scripted_frames, no_key = (
            asyncio.run(asyncio.wait_for(play(addr, sid, send), 60))
            for sid, send in (("p", pulse), ("s", scripted), ("n", still))
        )
    assert len(pulsed) == len(scripted_frames) == 6
    assert all(np.array_equal(a, b) for a, b in zip(pulsed, scripted_frames))
    assert not np.array_equal(pulsed[0], no_key[0])  # the pulse did act
