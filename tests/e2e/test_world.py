"""world.v1 end to end: a real uvicorn server and real WebSocket clients."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Sequence

import httpx
import numpy as np
import pytest
import websockets

from clients.world import ServerError, WorldClient
from models.base import EngineDeadError
from models.world.base import WorldTick
from models.world.tiny import TinyWorld
from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve

KEYS = {"track": "keys", "schema": "keys.v1"}


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def url(addr: str) -> str:
    return f"ws://{addr}/v1/realtime/world"


class ScriptedWorld(TinyWorld):
    """The tiny world plus faults on demand, chosen by the session's prompt."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.released: list[str] = []
        self.batch_sizes: list[int] = []
        self.prompts: list[str | None] = []  # every tick's prompt, as run
        self.delay = 0.0
        self.started = threading.Event()

    def run_batch(self, works: Sequence[WorldTick]):
        self.batch_sizes.append(len(works))
        self.started.set()
        if self.delay:
            time.sleep(self.delay)
        self.prompts += [w.prompt for w in works]
        for w in works:
            if w.prompt == "die":
                raise EngineDeadError("simulated dead CUDA context")
            if w.prompt == "explode":
                raise RuntimeError("simulated model failure")
        return super().run_batch(works)

    def drop_session(self, session_id: str) -> None:
        self.released.append(session_id)
        super().drop_session(session_id)


def scripted_app(**world):
    model = ScriptedWorld(max_batch=8)
    inventory = Inventory()
    inventory.adapters[model.name] = model
    config = ServerConfig(world=WorldConfig(models=("tiny",), **world))
    return build_app(config, inventory), model


def test_http_endpoints(tiny_server):
    assert httpx.get(f"http://{tiny_server}/healthz").text == "OK"
    models = httpx.get(f"http://{tiny_server}/v1/models").json()["data"]
    assert [(m["name"], m["kind"], m["available"]) for m in models] == [("tiny", "world", True)]
    metrics = httpx.get(f"http://{tiny_server}/metrics").text
    assert "realtime_engine_healthy 1.0" in metrics


def test_events_apply_in_order_at_chunk_boundaries(tiny_server):
    async def main():
        async with WorldClient.connect(url(tiny_server)) as c:
            created = await c.create("w1", credits=0, format="rgb8", seed=3)
            assert created == {"type": "session.created", "session_id": "w1", "model": "tiny", "height": 64,
                               "width": 64, "frames_per_chunk": 1, "fps": 15.0, "format": "rgb8", "credits": 0}
            assert (await c.hold_keys(["W"], event_id=2))["status"] == "accepted"
            assert (await c.event(event_id=1, prompt="a corridor"))["status"] == "accepted"
            assert (await c.event(event_id=1))["status"] == "duplicate"
            await c.credit(1)
            first = await c.next_chunk(credit=False)
            assert (first.chunk_index, first.applied_event_ids) == (0, [1, 2])
            assert first.header["request_id"] == "w1:0"
            assert (await c.hold_keys(["j"], event_id=5))["status"] == "accepted"
            await c.credit(2)
            second = await c.next_chunk(credit=False)
            third = await c.next_chunk(credit=False)
            assert [(x.chunk_index, x.applied_event_ids) for x in (second, third)] == [(1, [5]), (2, [])]
            # Applied ids stay duplicates; ids below the floor are stale.
            assert (await c.event(event_id=2))["status"] == "duplicate"
            await c.send({"type": "event", "event_id": 4})
            err = await c.expect("error")
            assert (err["code"], err["event_id"]) == ("stale_event", 4)
            assert "5" in err["message"]
            frame = first.frames()[0]
            assert frame.shape == (64, 64, 3) and frame.dtype == np.uint8
            closed = await c.close()
            assert closed == {"type": "session.closed", "session_id": "w1", "dropped_event_ids": []}

    run(main())


def test_chunks_are_contiguous_and_credit_bounded(tiny_server):
    async def main():
        async with WorldClient.connect(url(tiny_server)) as c:
            await c.create("w2", credits=3)
            got = [(await c.next_chunk(credit=False)).chunk_index for _ in range(3)]
            assert got == [0, 1, 2]
            # Without credit the server stops: nothing more arrives.
            await asyncio.sleep(0.3)
            assert c.chunks.empty()
            for _ in range(20):
                await c.credit(1)
                got.append((await c.next_chunk(credit=False)).chunk_index)
            assert got == list(range(23))

    run(main())


def test_frames_follow_keys_and_are_deterministic(tiny_server):
    async def play(sid: str, keys: list[str]) -> list[np.ndarray]:
        async with WorldClient.connect(url(tiny_server)) as c:
            await c.create(sid, credits=0, format="rgb8", seed=7)
            await c.hold_keys(keys)
            await c.credit(6)
            return [(await c.next_chunk(credit=False)).frames()[0] for _ in range(6)]

    async def main():
        return await asyncio.gather(play("j1", ["j"]), play("l1", ["l"]), play("j2", ["j"]))

    j1, l1, j2 = run(main())
    assert all(np.array_equal(a, b) for a, b in zip(j1, j2))
    assert not np.array_equal(j1[-1], l1[-1])
    assert not np.array_equal(j1[0], j1[-1])  # the picture moves


def test_reset_restarts_at_zero_and_keeps_the_floor(tiny_server):
    async def main():
        async with WorldClient.connect(url(tiny_server)) as c:
            await c.create("w3", credits=0)
            await c.hold_keys(["d"], event_id=10)
            await c.credit(2)
            chunks = [await c.next_chunk(credit=False) for _ in range(2)]
            assert [x.chunk_index for x in chunks] == [0, 1]
            await c.event(event_id=11)  # no credit left: stays pending, dropped by reset
            reset = await c.reset()
            assert reset == {"type": "session.reset", "session_id": "w3", "chunk_index": 0,
                             "dropped_event_ids": [11]}
            await c.send({"type": "event", "event_id": 3})
            assert (await c.expect("error"))["code"] == "stale_event"
            assert (await c.event(event_id=10))["status"] == "duplicate"  # applied before the reset
            assert (await c.event(event_id=11))["status"] == "accepted"  # dropped by it: may be sent again
            await c.credit(1)
            after = await c.next_chunk(credit=False)
            assert (after.chunk_index, after.applied_event_ids, after.header["request_id"]) == (0, [11], "w3:2")

    run(main())


def test_two_interleaved_sessions_are_independent(tiny_server):
    async def main():
        async with WorldClient.connect(url(tiny_server)) as a, WorldClient.connect(url(tiny_server)) as b:
            await a.create("ia", credits=0)
            await b.create("ib", credits=0)
            await a.event(event_id=100)
            await b.event(event_id=1)
            await a.credit(2)
            await b.credit(1)
            ca = [await a.next_chunk(credit=False) for _ in range(2)]
            cb = await b.next_chunk(credit=False)
            assert [(x.chunk_index, x.applied_event_ids) for x in ca] == [(0, [100]), (1, [])]
            assert (cb.chunk_index, cb.applied_event_ids, cb.header["request_id"]) == (0, [1], "ib:0")
            await b.event(event_id=2)  # b's floor is its own
            await a.reset()
            await b.credit(1)
            assert (await b.next_chunk(credit=False)).chunk_index == 1

    run(main())


def test_error_codes_leave_the_session_intact(tiny_server):
    async def main():
        async with WorldClient.connect(url(tiny_server)) as c:
            await c.send({"type": "event", "event_id": 1})
            assert (await c.expect("error"))["code"] == "no_session"
            await c.ws.send("{not json")
            assert (await c.expect("error"))["code"] == "bad_request"
            await c.send({"type": "teleport"})
            assert (await c.expect("error"))["code"] == "unknown_type"
            await c.create("e1", credits=0)
            await c.send({"type": "session.create", "session_id": "e1"})
            assert (await c.expect("error"))["code"] == "bad_request"
            async with WorldClient.connect(url(tiny_server)) as other:
                await other.send({"type": "session.create", "session_id": "e1"})
                assert (await other.expect("error"))["code"] == "session_exists"
            bad_controls = [
                {**KEYS, "data": {"mode": "state", "held": ["q"]}},
                {"track": "mouse", "schema": "mouse.v1", "data": {}},
            ]
            for i, control in enumerate(bad_controls):
                await c.send({"type": "event", "event_id": 50 + i, "controls": [control]})
                err = await c.expect("error")
                assert (err["code"], err["event_id"]) == ("bad_request", 50 + i)
            await c.send({"type": "event", "event_id": 60, "controls": [dict(KEYS, data={"mode": "state", "held": ["w"]})] * 2})
            assert (await c.expect("error"))["code"] == "bad_request"
            await c.send({"type": "credit", "chunks": 0})
            assert (await c.expect("error"))["code"] == "bad_request"
            # None of that changed the session: its first event and chunk are as if nothing happened.
            await c.event(event_id=50)
            await c.credit(1)
            chunk = await c.next_chunk(credit=False)
            assert (chunk.chunk_index, chunk.applied_event_ids) == (0, [50])

    run(main())


def test_the_connection_state_is_refused_before_a_message_fields(tiny_server):
    """An event or credit without a session is no_session, and a second create is refused as
    one, whatever else is wrong with the message; the event_id sent is named either way."""
    async def main():
        async with WorldClient.connect(url(tiny_server)) as c:
            await c.send({"type": "event", "event_id": 3, "prompt": 5})
            assert await c.expect("error") == {"type": "error", "code": "no_session", "event_id": 3,
                                               "message": "no session on this connection: send session.create first"}
            await c.send({"type": "credit", "chunks": 0})
            assert (await c.expect("error"))["code"] == "no_session"
            await c.send({"type": "credit", "chunks": 1, "event_id": 4})
            assert ((err := await c.expect("error"))["code"], err["event_id"]) == ("no_session", 4)
            await c.create("order", credits=0)
            await c.send({"type": "session.create", "session_id": "", "seed": -1})
            assert (await c.expect("error"))["message"] == "this connection already has session 'order'; close it first"
            await c.send({"type": "event", "event_id": 5, "prompt": 5})
            assert await c.expect("error") == {"type": "error", "code": "bad_request", "event_id": 5,
                                               "message": "prompt must be a string or null, got int"}

    run(main())


def test_queue_full_is_atomic():
    app, _ = scripted_app(max_pending_events=2)
    with serve(app) as addr:
        async def main():
            async with WorldClient.connect(url(addr)) as c:
                await c.create("q1", credits=0)
                await c.event(event_id=1)
                await c.event(event_id=2)
                await c.send({"type": "event", "event_id": 3})
                err = await c.expect("error")
                assert (err["code"], err["event_id"]) == ("queue_full", 3)
                await c.credit(1)
                chunk = await c.next_chunk(credit=False)
                assert chunk.applied_event_ids == [1, 2]
                assert (await c.event(event_id=3))["status"] == "accepted"

        run(main())


def test_failed_tick_fails_only_its_session_until_reset():
    app, model = scripted_app()
    with serve(app) as addr:
        async def main():
            async with WorldClient.connect(url(addr)) as bad, WorldClient.connect(url(addr)) as good:
                await good.create("good", credits=0)
                await bad.create("bad", credits=0, prompt="explode")
                await bad.event(event_id=1)
                await bad.credit(1)
                err = await bad.expect("error")
                assert err["code"] == "session_failed"
                assert err["pending_event_ids"] == [1]
                await bad.send({"type": "event", "event_id": 2})
                assert (await bad.expect("error"))["code"] == "session_failed"
                # The other session keeps ticking.
                await good.credit(2)
                assert [(await good.next_chunk(credit=False)).chunk_index for _ in range(2)] == [0, 1]
                # Reset with a working prompt: back at chunk 0, the failed event reported as dropped.
                await bad.send({"type": "event", "event_id": 3, "prompt": "calm"})
                assert (await bad.expect("error"))["code"] == "session_failed"
                reset = await bad.reset()
                assert reset["dropped_event_ids"] == [1]
                assert "bad" in model.released

        run(main())


def test_engine_death_turns_healthz_503_and_fails_fast():
    app, _ = scripted_app()
    with serve(app) as addr:
        async def main():
            async with WorldClient.connect(url(addr)) as c:
                await c.create("d1", credits=1, prompt="die")
                err = await c.expect("error")
                assert err["code"] == "session_failed" and "dead" in err["message"]
            assert httpx.get(f"http://{addr}/healthz").status_code == 503
            async with WorldClient.connect(url(addr)) as c:
                await c.send({"type": "session.create", "session_id": "d2"})
                err = await c.expect("error")
                assert err["code"] == "internal"

        run(main())


def test_protocol_violations_close_the_socket(tiny_server):
    async def main():
        async with websockets.connect(url(tiny_server), max_size=None) as ws:
            await ws.send(b"\x00\x01")
            msg = json.loads(await ws.recv())
            assert msg["code"] == "bad_request"
            with pytest.raises(websockets.ConnectionClosed) as info:
                await ws.recv()
            assert info.value.rcvd.code == 1003
        async with websockets.connect(url(tiny_server), max_size=None) as ws:
            await ws.send(json.dumps({"type": "event", "event_id": 1, "prompt": "x" * 70_000}))
            msg = json.loads(await ws.recv())
            assert msg["code"] == "message_too_large"
            with pytest.raises(websockets.ConnectionClosed) as info:
                await ws.recv()
            assert info.value.rcvd.code == 1009

    run(main())


def test_disconnect_mid_tick_cleans_up_and_id_can_be_recreated():
    app, model = scripted_app()
    model.delay = 0.3
    with serve(app) as addr:
        async def main():
            ws = await websockets.connect(url(addr))
            await ws.send(json.dumps({"type": "session.create", "session_id": "m1", "credits": 1}))
            json.loads(await ws.recv())
            await asyncio.get_running_loop().run_in_executor(None, model.started.wait, 5)
            await ws.close()  # while the tick runs
            for _ in range(100):
                if "m1" not in app.state.world_sessions:
                    break
                await asyncio.sleep(0.05)
            assert "m1" not in app.state.world_sessions
            assert "m1" in model.released
            model.delay = 0.0
            async with WorldClient.connect(url(addr)) as c:
                await c.create("m1", credits=1)
                assert (await c.next_chunk(credit=False)).chunk_index == 0

        run(main())


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_close_then_hang_up_is_not_a_server_error():
    """A client that sends session.close and hangs up at once: the reply has nowhere to go."""
    app, model = scripted_app()
    model.delay = 0.2
    with serve(app) as addr:
        async def main():
            ws = await websockets.connect(url(addr))
            await ws.send(json.dumps({"type": "session.create", "session_id": "h1", "credits": 2}))
            json.loads(await ws.recv())
            await asyncio.get_running_loop().run_in_executor(None, model.started.wait, 5)
            await ws.send(json.dumps({"type": "session.close"}))  # answered after the tick in flight
            await ws.close()
            for _ in range(100):
                if "h1" not in app.state.world_sessions:
                    break
                await asyncio.sleep(0.05)
            assert "h1" not in app.state.world_sessions and "h1" in model.released

        # uvicorn logs an application's exception on its own logger, which does not propagate.
        errors = _Records()
        logging.getLogger("uvicorn.error").addHandler(errors)
        try:
            run(main())
            time.sleep(0.3)
        finally:
            logging.getLogger("uvicorn.error").removeHandler(errors)
    assert [r.getMessage() for r in errors.records] == []


def test_ticks_of_different_sessions_share_a_forward():
    app, model = scripted_app()
    model.delay = 0.05
    with serve(app) as addr:
        async def main():
            clients = [WorldClient.connect(url(addr)) for _ in range(4)]
            conns = [await c.__aenter__() for c in clients]
            for i, c in enumerate(conns):
                await c.create(f"b{i}", credits=0)
            for c in conns:
                await c.credit(3)
            for c in conns:
                for _ in range(3):
                    await c.next_chunk(credit=False)
            for c in clients:
                await c.__aexit__(None, None, None)

        run(main())
    assert max(model.batch_sizes) >= 2
