"""LRU residency through the real server: swap to host and back, or drop with session_evicted."""

from __future__ import annotations

import asyncio

import pytest

from clients.world import WorldClient
from models.world.maze.adapter import MazeWorld
from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve


class UnadmittingMaze(MazeWorld):
    """The maze without admission control (the base ``admit``): a full host then drops sessions."""

    def admit(self, session_id, options):
        return None


def maze_app(host_budget_bytes: int, model_class: type[MazeWorld] = MazeWorld, cpu_lanes: int = 1):
    # Room on the "device" for one session only, so a second one must evict the first.
    model = model_class(device="cpu", steps=1, window=2, max_batch=1, max_sessions=1,
                        host_budget_bytes=host_budget_bytes, cpu_lanes=cpu_lanes)
    inventory = Inventory()
    inventory.adapters[model.name] = model
    return build_app(ServerConfig(world=WorldConfig(models=("maze",))), inventory), model


def url(addr: str) -> str:
    return f"ws://{addr}/v1/realtime/world"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


@pytest.mark.parametrize("lanes", [1, 2])
def test_idle_session_is_swapped_to_host_and_back(lanes):
    # Two lanes: a's last clean pass runs ahead, and b's first tick waits for it before a is swapped.
    app, model = maze_app(host_budget_bytes=1 << 26, cpu_lanes=lanes)
    assert model.describe()["clean_pass_ahead"] is (lanes == 2)
    with serve(app) as addr:
        async def main():
            async with WorldClient.connect(url(addr)) as a, WorldClient.connect(url(addr)) as b:
                await a.create("a", credits=2, seed=1, format="rgb8")
                assert [(await a.next_chunk(credit=False)).chunk_index for _ in range(2)] == [0, 1]
                await b.create("b", credits=2, seed=2, format="rgb8")
                assert [(await b.next_chunk(credit=False)).chunk_index for _ in range(2)] == [0, 1]
                assert model.residency.is_swapped("a")
                await a.credit(1)
                assert (await a.next_chunk(credit=False)).chunk_index == 2
                assert a.errors == [] and b.errors == []
                assert [s["state"] for s in app.state.live_sessions.sessions()] == ["active", "active"]

        run(main())


def test_session_that_does_not_fit_is_refused_busy_and_the_others_keep_going():
    app, model = maze_app(host_budget_bytes=0)
    with serve(app) as addr:
        async def main():
            async with WorldClient.connect(url(addr)) as a, WorldClient.connect(url(addr)) as b:
                await a.create("a", credits=1, seed=1)
                assert (await a.next_chunk(credit=False)).chunk_index == 0
                await b.send({"type": "session.create", "session_id": "b"})
                err = await b.expect("error")
                assert err["code"] == "busy"
                assert err["message"].startswith("no room for a new session: it needs ")
                assert "free: 0 B on the device (1 session held, 1 resident slot) and 0 B of the 0 B host" \
                    in err["message"]
                await a.credit(1)
                assert (await a.next_chunk(credit=False)).chunk_index == 1
                assert a.errors == [] and not model.residency.is_swapped("a")
                assert [s["session_id"] for s in app.state.live_sessions.sessions()] == ["a"]
                await a.close()
                await b.create("b", credits=1, seed=2)  # the id was never taken; room now
                assert (await b.next_chunk(credit=False)).chunk_index == 0

        run(main())


def test_session_dropped_when_host_is_full_is_told_and_can_reset():
    app, model = maze_app(host_budget_bytes=0, model_class=UnadmittingMaze)
    with serve(app) as addr:
        async def main():
            async with WorldClient.connect(url(addr)) as a, WorldClient.connect(url(addr)) as b:
                await a.create("a", credits=1, seed=1)
                assert (await a.next_chunk(credit=False)).chunk_index == 0
                await a.event(event_id=7)  # accepted, waits for a credit
                await b.create("b", credits=1, seed=2)
                assert (await b.next_chunk(credit=False)).chunk_index == 0
                err = await a.expect("error")
                assert (err["code"], err["pending_event_ids"]) == ("session_evicted", [7])
                await a.send({"type": "event", "event_id": 8})
                assert (await a.expect("error"))["code"] == "session_failed"
                reset = await a.reset()
                assert reset["dropped_event_ids"] == [7]
                await a.credit(1)
                chunk = await a.next_chunk(credit=False)
                assert (chunk.chunk_index, chunk.applied_event_ids) == (0, [])

        run(main())
