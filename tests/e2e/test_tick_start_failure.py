"""A tick that fails as it starts (a reducer's ``prepare`` raising) fails its session like any
other tick failure, through a real uvicorn server and a real WebSocket client.

The tiny world gets one more control track whose reducer accepts ``{"fail": "prepare"}``
and raises from ``prepare`` on it: a value its ``validate`` let through that the tick
cannot use (as a singular camera pose once did in LingBot's trajectory reducer);
``{"fail": "tick"}`` makes the model's ``tick`` raise instead. The client must hear
``session_failed``; the session must be released, closed on disconnect and gone from
``GET /v1/sessions`` and the metrics, with nothing but a one-line warning logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Iterator, Mapping, Sequence

import httpx
import pytest
import websockets

from models.world.base import WorldTick
from models.world.tiny import TinyWorld
from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.inventory import Inventory
from sessions import ControlReducer, Prepared, TickRequest
from sessions.errors import ErrorCode, SessionError
from sessions.frozen import FrozenDict
from tests.e2e.conftest import serve

FAULT = {"track": "fault", "schema": "fault.v1"}
KEYS = {"track": "keys", "schema": "keys.v1"}


class BoomReducer(ControlReducer):
    """Accepts ``{"fail": "none" | "prepare" | "tick"}``; ``prepare`` raises on "prepare"."""

    track, schema = "fault", "fault.v1"

    def validate(self, data: FrozenDict) -> None:
        if set(data) != {"fail"} or data["fail"] not in ("none", "prepare", "tick"):
            raise SessionError(ErrorCode.BAD_REQUEST, "fault.v1: takes {fail: none | prepare | tick}")

    def prepare(self, updates: Sequence[FrozenDict]) -> Prepared:
        fail = updates[-1]["fail"] if updates else "none"
        if fail == "prepare":
            raise ArithmeticError("injected prepare failure")
        return Prepared(value=fail, next_state=None)

    def commit(self, prepared: Prepared) -> None:
        pass

    def reset(self) -> None:
        pass


class BoomWorld(TinyWorld):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.released: list[str] = []

    def reducers(self) -> dict[str, ControlReducer]:
        return {**super().reducers(), BoomReducer.track: BoomReducer()}

    def tick(self, request: TickRequest, seed: int, options: Mapping[str, Any] | None = None, *,
             format: str = "rgb8") -> WorldTick:
        if request.controls[BoomReducer.track] == "tick":
            raise ArithmeticError("injected tick failure")
        return super().tick(request, seed, options, format=format)

    def drop_session(self, session_id: str) -> None:
        self.released.append(session_id)
        super().drop_session(session_id)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, BoomWorld]]:
    model = BoomWorld()
    inventory = Inventory()
    inventory.adapters[model.name] = model
    app = build_app(ServerConfig(world=WorldConfig(models=("tiny",))), inventory)
    with serve(app) as addr:
        yield addr, model


def listed(addr: str) -> set[str]:
    return {s["session_id"] for s in httpx.get(f"http://{addr}/v1/sessions", timeout=5).json()["data"]
            if s["kind"] == "world"}


def world_sessions_metric(addr: str) -> float:
    for line in httpx.get(f"http://{addr}/metrics", timeout=5).text.splitlines():
        if line.startswith("realtime_world_sessions "):
            return float(line.split()[1])
    raise KeyError("realtime_world_sessions")


async def recv_json(ws) -> dict:
    while True:
        msg = await ws.recv()
        if isinstance(msg, str):
            return json.loads(msg)


def wait_until(check, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize("fail", ["prepare", "tick"])
@pytest.mark.parametrize("chunks_before", [0, 2])
def test_a_tick_that_cannot_start_is_told_and_the_session_ends_with_its_client(server, caplog, chunks_before, fail):
    addr, model = server
    sid = f"boom-{fail}-{chunks_before}"
    caplog.set_level(logging.INFO)

    async def main() -> dict:
        async with websockets.connect(f"ws://{addr}/v1/realtime/world", max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.create", "session_id": sid, "model": "tiny",
                                      "format": "rgb8", "credits": chunks_before}))
            assert (await recv_json(ws))["type"] == "session.created"
            for i in range(chunks_before):
                chunk = await recv_json(ws)
                assert (chunk["type"], chunk["chunk_index"]) == ("chunk", i)
            await ws.send(json.dumps({"type": "event", "event_id": 1, "controls": [
                {**KEYS, "data": {"mode": "state", "held": ["w"]}}, {**FAULT, "data": {"fail": fail}}]}))
            assert await recv_json(ws) == {"type": "event.accepted", "event_id": 1, "status": "accepted"}
            await ws.send(json.dumps({"type": "credit", "chunks": 2}))
            failed = await asyncio.wait_for(recv_json(ws), 10)
            assert sid in listed(addr)  # failed, not gone, until its client resets or leaves
            # A failed session refuses events until reset or close.
            await ws.send(json.dumps({"type": "event", "event_id": 2}))
            refused = await asyncio.wait_for(recv_json(ws), 10)
            assert (refused["code"], refused["event_id"]) == ("session_failed", 2)
        return failed

    failed = asyncio.run(asyncio.wait_for(main(), 30))
    assert failed["type"] == "error" and failed["code"] == "session_failed"
    assert f"injected {fail} failure" in failed["message"] and failed["pending_event_ids"] == [1]
    # Disconnect: closed and forgotten, the model's state released.
    wait_until(lambda: sid not in listed(addr))
    wait_until(lambda: world_sessions_metric(addr) == 0)
    wait_until(lambda: sid in model.released and sid not in model._sessions)
    # One warning naming the session, no traceback anywhere.
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(sid in m and f"injected {fail} failure" in m for m in warned), warned


def test_a_session_whose_tick_could_not_start_resets(server):
    addr, _ = server

    async def main() -> None:
        async with websockets.connect(f"ws://{addr}/v1/realtime/world", max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.create", "session_id": "boom-reset", "model": "tiny",
                                      "format": "rgb8", "credits": 0}))
            assert (await recv_json(ws))["type"] == "session.created"
            await ws.send(json.dumps({"type": "event", "event_id": 1, "controls": [
                {**FAULT, "data": {"fail": "prepare"}}]}))
            assert (await recv_json(ws))["type"] == "event.accepted"
            await ws.send(json.dumps({"type": "credit", "chunks": 1}))
            assert (await asyncio.wait_for(recv_json(ws), 10))["code"] == "session_failed"
            await ws.send(json.dumps({"type": "session.reset"}))
            reset = await asyncio.wait_for(recv_json(ws), 10)
            assert (reset["type"], reset["dropped_event_ids"]) == ("session.reset", [1])
            await ws.send(json.dumps({"type": "event", "event_id": 2, "controls": [
                {**FAULT, "data": {"fail": "none"}}]}))
            assert (await recv_json(ws))["type"] == "event.accepted"
            await ws.send(json.dumps({"type": "credit", "chunks": 1}))
            # The credit the failed tick left unspent may tick chunk 0 before event 2 arrives.
            chunks = [await asyncio.wait_for(recv_json(ws), 10)]
            while chunks[-1]["applied_event_ids"] != [2]:
                chunks.append(await asyncio.wait_for(recv_json(ws), 10))
            assert [(c["type"], c["chunk_index"]) for c in chunks] == [("chunk", i) for i in range(len(chunks))]
            assert len(chunks) <= 2

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_bug_in_the_tick_driver_still_fails_the_session_and_ends_it_with_its_client(server, monkeypatch, caplog):
    """Past the tick's start too: whatever the driver raises, the client hears and the
    session does not outlive its socket (the bug itself is logged with its traceback)."""
    from realtime.endpoints import world_driver

    addr, _ = server

    def broken(session, request_id):
        raise LookupError("injected driver bug")

    monkeypatch.setattr(world_driver.Session, "complete_tick", broken)
    caplog.set_level(logging.INFO)

    async def main() -> dict:
        async with websockets.connect(f"ws://{addr}/v1/realtime/world", max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.create", "session_id": "driver-bug", "model": "tiny",
                                      "format": "rgb8", "credits": 1}))
            assert (await recv_json(ws))["type"] == "session.created"
            return await asyncio.wait_for(recv_json(ws), 10)

    failed = asyncio.run(asyncio.wait_for(main(), 30))
    assert (failed["code"], failed["pending_event_ids"]) == ("session_failed", [])
    assert "LookupError: injected driver bug" in failed["message"]
    wait_until(lambda: "driver-bug" not in listed(addr))
    wait_until(lambda: world_sessions_metric(addr) == 0)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == ["session driver-bug: the tick driver failed: "
                                                "LookupError('injected driver bug')"]
