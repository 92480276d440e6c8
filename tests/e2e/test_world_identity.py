"""A chunk that answers another tick fails that tick where it was made, before either commit.

The world base checks a chunk's four identities once, on the engine thread (``check_chunk``):
the engine then keeps no model state for the tick (``end_tick(..., False)``) and the session
commits nothing (its ``complete_tick`` is never called), so the client hears
``session_failed`` naming the mismatch after the chunks that did commit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Iterator, Sequence

import pytest
import websockets

from models.world.base import WorldChunk, WorldTick
from models.world.tiny import TinyWorld
from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve

WRONG = {"session": "session_id", "request": "request_id", "chunk": "chunk_index", "events": "applied_event_ids"}


class Misanswering(TinyWorld):
    """The tiny world, except that a session's chunk 1 echoes one identity wrong: which one is
    the session id's prefix (``request-a`` gets a wrong ``request_id``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ended: list[tuple[str, bool]] = []

    def generate(self, works: Sequence[WorldTick]) -> list[WorldChunk]:
        chunks = super().generate(works)
        out = []
        for w, c in zip(works, chunks):
            if w.chunk_index == 1:
                name = WRONG[w.session_id.split("-")[0]]
                wrong = {"session_id": "someone-else", "request_id": "someone-else:1", "chunk_index": 2,
                         "applied_event_ids": (99,)}[name]
                c = dataclasses.replace(c, **{name: wrong})
            out.append(c)
        return out

    def end_tick(self, session_id: str, committed: bool) -> None:
        self.ended.append((session_id, committed))
        super().end_tick(session_id, committed)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Misanswering]]:
    model = Misanswering()
    inventory = Inventory()
    inventory.adapters[model.name] = model
    app = build_app(ServerConfig(world=WorldConfig(models=("tiny",))), inventory)
    with serve(app) as addr:
        yield addr, model


async def recv_json(ws) -> dict:
    while True:
        msg = await ws.recv()
        if isinstance(msg, str):
            return json.loads(msg)


@pytest.mark.parametrize("wrong", sorted(WRONG))
def test_a_chunk_with_a_wrong_identity_fails_its_tick_before_either_commit(server, wrong):
    addr, model = server
    sid = f"{wrong}-a"

    async def main() -> list[dict]:
        async with websockets.connect(f"ws://{addr}/v1/realtime/world", max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.create", "session_id": sid, "model": "tiny",
                                      "format": "rgb8", "credits": 3}))
            assert (await recv_json(ws))["type"] == "session.created"
            return [await asyncio.wait_for(recv_json(ws), 10) for _ in range(2)]

    chunk, failed = asyncio.run(main())
    assert (chunk["type"], chunk["chunk_index"], chunk["request_id"]) == ("chunk", 0, f"{sid}:0")
    assert (failed["type"], failed["code"]) == ("error", "session_failed")
    assert "answered" in failed["message"] and f"for tick ('{sid}', '{sid}:1', 1, ())" in failed["message"]
    # The model kept chunk 0's state and dropped chunk 1's: the one check decided both commits.
    assert [e for e in model.ended if e[0] == sid][:2] == [(sid, True), (sid, False)]
