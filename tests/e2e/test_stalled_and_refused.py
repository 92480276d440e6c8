"""A client that stops reading, or sends what it should not, holds nothing and breaks
nothing: through a real server on loopback, with the idle timeout long (300 s) so that
no drop here comes from it.

* world: ``session.close`` or an admin DELETE behind a chunk the client does not take
  ends the session within the goodbye bound; ``session.close`` naming another session,
  a key that only ``str.lower`` maps onto W A S D I J K L, and an oversized text frame
  where the first image is due are refused and leave the session streaming;
* tts.v1: a message that would queue more than MAX_PENDING_ITEMS sentences is refused
  whole; thousands of cancels leave nothing behind;
* OpenPI: a dtype numpy cannot parse and an array as ``endpoint`` are the protocol's
  errors (no traceback); one connection holds at most MAX_SESSIONS_PER_CONNECTION ids.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import httpx
import msgpack
import numpy as np
import pytest
import websockets
from openpi_client import msgpack_numpy

from protocols import tts_v1
from protocols.close_codes import CLOSE_TRY_AGAIN_LATER
from realtime.endpoints.idle import GOODBYE_TIMEOUT_S
from realtime.server.limits import SOCKETS_PER_SESSION_SLOT
from realtime.endpoints.openpi import MAX_SESSIONS_PER_CONNECTION
from tests.e2e.conftest import serve
from tests.e2e.test_client_limits import OBS, app, gone, live, run, text, world

LONG_IDLE_S = 300.0
OPENPI = "/v1/realtime/robot/openpi"


@pytest.fixture
def server():
    with serve(app(idle_s=LONG_IDLE_S)) as addr:
        yield addr


def no_tracebacks(caplog) -> None:
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def stalled_world(addr: str, sid: str):
    """A world session of 3 MiB chunks holding 64 credits whose client stopped reading."""
    ws, created = await world(addr, sid, credits=64, model="wall")
    assert created["type"] == "session.created"
    ws.transport.pause_reading()  # TCP back-pressure: the server's chunk send stops going out
    await asyncio.sleep(1.0)  # a few chunks fill every buffer on the way
    return ws


# --------------------------------------------------------------------------- world
def test_a_close_behind_a_chunk_the_client_does_not_take_ends_the_session(server, caplog):
    caplog.set_level(logging.INFO, logger="realtime")

    async def main():
        ws = await stalled_world(server, "stuck-close")
        started = time.monotonic()
        await ws.send(json.dumps({"type": "session.close"}))
        await gone(server, ("world", "stuck-close"), timeout_s=GOODBYE_TIMEOUT_S + 10)
        assert time.monotonic() - started < GOODBYE_TIMEOUT_S + 8  # the bound, and a loaded machine
        ws.transport.resume_reading()
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                await ws.recv()

    run(main())
    assert any("dropping the client" in r.getMessage() for r in caplog.records)
    no_tracebacks(caplog)


def test_an_admin_close_of_a_client_that_stopped_reading_answers_and_ends_it(server, caplog):
    async def main():
        ws = await stalled_world(server, "stuck-admin")
        started = time.monotonic()
        reply = await asyncio.to_thread(httpx.delete, f"http://{server}/v1/sessions/world/stuck-admin", timeout=30)
        assert reply.status_code == 200
        await gone(server, ("world", "stuck-admin"), timeout_s=2 * GOODBYE_TIMEOUT_S + 10)
        assert time.monotonic() - started < 2 * GOODBYE_TIMEOUT_S + 8
        ws.transport.abort()

    run(main())
    no_tracebacks(caplog)


def test_close_naming_another_session_kelvin_keys_and_an_oversized_image_frame_are_refused(server, caplog):
    async def main():
        ws, _ = await world(server, "w-own", credits=0)
        await ws.send(json.dumps({"type": "session.close", "session_id": "someone-else"}))
        err = await text(ws)
        assert (err["type"], err["code"]) == ("error", "bad_request") and "someone-else" in err["message"]
        kelvin = {"track": "keys", "schema": "keys.v1", "data": {"mode": "state", "held": ["\u212a"]}}
        await ws.send(json.dumps({"type": "event", "event_id": 1, "controls": [kelvin]}))
        err = await text(ws)
        assert (err["code"], err["event_id"]) == ("bad_request", 1) and "unknown key" in err["message"]
        await ws.send(json.dumps({"type": "credit", "chunks": 3}))
        indexes = []
        while len(indexes) < 3:  # the session still streams, from chunk 0
            msg = await text(ws)
            if msg["type"] == "chunk":
                indexes.append(msg["chunk_index"])
        assert indexes == [0, 1, 2]
        await ws.close()
        assert ("world", "w-own") not in live(server)

        # An image is announced; an oversized text frame comes where it is due.
        ws = await websockets.connect(f"ws://{server}/v1/realtime/world", max_size=None)
        await ws.send(json.dumps({"type": "session.create", "session_id": "w-img", "model": "tiny",
                                  "image": {"format": "png", "bytes": 4}}))
        await ws.send("x" * 70_000)
        err = await text(ws)
        assert err["code"] == "bad_request" and "a text frame" in err["message"], err
        await ws.close()

    run(main())
    no_tracebacks(caplog)


# --------------------------------------------------------------------------- tts.v1
def test_a_message_over_the_sentence_limit_is_refused_whole_and_cancels_leave_nothing():
    server_app = app(idle_s=LONG_IDLE_S)

    async def main():
        ws = await websockets.connect(f"ws://{server}/v1/realtime/tts", max_size=None)
        await text(ws)  # session.updated
        await ws.send(json.dumps({"type": "input.text", "text": "a\n" * 2048}))  # 2048 sentences in one message
        err = await text(ws)
        assert err["code"] == tts_v1.BUFFER_FULL and str(tts_v1.MAX_PENDING_ITEMS) in err["message"]
        # Nothing of it was queued: the next utterance is the only one spoken.
        await ws.send(json.dumps({"type": "input.text", "text": "Hi."}))
        await ws.send(json.dumps({"type": "input.done"}))
        seen = []
        while not seen or seen[-1]["type"] != "response.done":
            msg = await ws.recv()
            if isinstance(msg, str):
                seen.append(json.loads(msg))
        starts = [m for m in seen if m["type"] == "audio.start"]
        assert [s["text"] for s in starts] == ["Hi."] and seen[-1]["utterance_index"] == 0

        owner = next(e.owner for e in server_app.state.live_sessions._by_key.values() if e.kind == "tts")
        for _ in range(3000):
            await ws.send(json.dumps({"type": "response.cancel"}))
        for _ in range(3000):
            assert json.loads(await ws.recv())["type"] == "response.cancelled"
        assert len(owner.cancelled) <= 1 and len(owner.samples) <= 1
        await ws.close()

    with serve(server_app) as server:
        run(main())


# --------------------------------------------------------------------------- OpenPI
def test_openpi_malformed_dtypes_and_endpoints_are_protocol_errors(server, caplog):
    async def refused(body: bytes) -> tuple[str, int | None]:
        async with websockets.connect(f"ws://{server}{OPENPI}", max_size=None, compression=None) as ws:
            await ws.recv()  # metadata
            await ws.send(body)
            reply = await ws.recv()
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            return reply, ws.close_code

    async def main():
        bad_dtype = {b"__ndarray__": True, b"data": b"", b"dtype": "f4,(", b"shape": [0]}
        reply, code = await refused(msgpack.packb({**{k: v for k, v in OBS.items() if k == "prompt"},
                                                   "extra": bad_dtype}))
        assert reply == "invalid request: unknown array dtype 'f4,('" and code == 1011
        reply, code = await refused(msgpack.packb({"endpoint": {b"__ndarray__": True, b"data": b"\x00" * 3,
                                                                b"dtype": "|u1", b"shape": [3]}}))
        assert reply == "invalid request: endpoint must be a string, got uint8 [3]" and code == 1011
        reply, _ = await refused(msgpack.packb({"endpoint": "r" * (4 << 20)}))
        assert reply.startswith("invalid request: unknown endpoint 'rrr") and len(reply) < 300

    run(main())
    no_tracebacks(caplog)


def test_one_openpi_connection_holds_a_bounded_number_of_session_ids(server):
    async def main():
        async with websockets.connect(f"ws://{server}{OPENPI}", max_size=None, compression=None) as ws:
            await ws.recv()  # metadata
            for i in range(MAX_SESSIONS_PER_CONNECTION):
                await ws.send(msgpack.packb({"endpoint": "reset", "session_id": f"r{i}"}))
                assert msgpack.unpackb(await ws.recv()) == {"status": "reset successful"}
            assert sum(kind == "policy" for kind, _ in live(server)) == MAX_SESSIONS_PER_CONNECTION
            await ws.send(msgpack.packb({"endpoint": "reset", "session_id": "one-more"}))
            reply = await ws.recv()
            assert reply.startswith("too_many_sessions: ")
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            assert ws.close_code == CLOSE_TRY_AGAIN_LATER
        deadline = time.monotonic() + 5
        while any(kind == "policy" for kind, _ in live(server)):  # every id released with the connection
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)

    run(main())


def test_world_errors_quote_client_values_short_and_lone_surrogates_are_refused(server, caplog):
    caplog.set_level(logging.INFO, logger="realtime")  # each error is logged at INFO: short there too
    big = "A" * 60_000

    async def main():
        async with websockets.connect(f"ws://{server}/v1/realtime/world", max_size=None) as ws:
            for create in ({"session_id": big}, {"session_id": "s1", "model": "x" * 60_000},
                           {"session_id": "s1", "prompt": "\ud800"}):
                await ws.send(json.dumps({"type": "session.create", "credits": 0, **create}))
                err = await text(ws)
                assert err["code"] == "bad_request" and len(err["message"]) < 400, err["message"][:200]
            await ws.send(json.dumps({"type": "session.create", "session_id": "s1", "credits": 0, "model": "tiny"}))
            assert (await text(ws))["type"] == "session.created"
            for event in ({big: 1}, {"controls": [{"track": big, "schema": "keys.v1", "data": {}}]},
                          {"controls": [{"track": "keys", "schema": big, "data": {}}]},
                          {"controls": [{"track": "keys", "schema": "keys.v1", "data": {"mode": big}}]},
                          {"controls": [{"track": "keys", "schema": "keys.v1",
                                         "data": {"mode": "state", "held": [], big: 1}}]},
                          {"controls": [{"track": "keys", "schema": "keys.v1", "data": {}, big: 1}]},
                          {"controls": [{"track": "x" * 30_000, "schema": "keys.v1", "data": {}}] * 2},
                          {"prompt": "go \udc00"}):
                await ws.send(json.dumps({"type": "event", "event_id": 1, **event}))
                err = await text(ws)
                assert (err["code"], err.get("event_id")) == ("bad_request", 1) and len(err["message"]) < 400, \
                    err["message"][:200]
            await ws.send(json.dumps({"type": "event", "event_id": 1, "prompt": "go \ud83d\ude00"}))
            assert (await text(ws))["type"] == "event.accepted"

    run(main())
    no_tracebacks(caplog)
    assert caplog.records and max(len(r.getMessage()) for r in caplog.records) < 1000


def test_an_admin_close_reports_the_events_no_chunk_applied(server):
    async def main():
        ws, _ = await world(server, "adm-events", credits=0)
        for eid in (1, 2, 3):
            await ws.send(json.dumps({"type": "event", "event_id": eid}))
            assert (await text(ws))["type"] == "event.accepted"
        reply = await asyncio.to_thread(httpx.delete, f"http://{server}/v1/sessions/world/adm-events", timeout=30)
        assert reply.status_code == 200
        seen = []
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                seen.append(await text(ws))
        assert [m["type"] for m in seen] == ["error", "session.closed"] and seen[0]["code"] == "closed_by_admin"
        assert seen[1]["dropped_event_ids"] == [1, 2, 3] and ws.close_code == 1008

    run(main())


def test_a_robot_reconnecting_under_its_session_id_is_served_not_cancelled():
    """The id of a robot that dropped mid-request (an RST) or closed is released in the policy
    after its connection ends; a robot reconnecting under it at once waits for that release
    (it had its first request cancelled by it, 40 times in 40)."""
    with serve(app(idle_s=LONG_IDLE_S, infer_ms=150.0)) as addr:
        async def one(abort: bool) -> None:
            old = await websockets.connect(f"ws://{addr}{OPENPI}", max_size=None, compression=None)
            await old.recv()  # metadata
            await old.send(msgpack_numpy.packb({**OBS, "session_id": "arm-7"}))
            if abort:
                old.transport.abort()  # gone mid-request
            else:
                await old.recv()
                await old.close()
            async with websockets.connect(f"ws://{addr}{OPENPI}", max_size=None, compression=None) as new:
                await new.recv()
                await new.send(msgpack_numpy.packb({**OBS, "session_id": "arm-7"}))
                reply = await new.recv()
                assert isinstance(reply, bytes), reply  # actions, not "request cancelled: ..."

        async def main():
            for abort in (True, False, True, False):
                await one(abort)

        run(main())


def test_open_websockets_per_client_address_are_bounded_sessions_or_not():
    """World connections without a session take no session slot; without this bound one
    client could open them faster than the idle timeout closes them, until no file
    descriptor was left. Past 4 per session slot, the upgrade is answered 429."""
    per_client = 2
    limit = SOCKETS_PER_SESSION_SLOT * per_client
    with serve(app(idle_s=LONG_IDLE_S, per_client=per_client)) as addr:
        async def main():
            held = [await websockets.connect(f"ws://{addr}/v1/realtime/world") for _ in range(limit)]
            with pytest.raises(websockets.InvalidStatus) as refused:
                await websockets.connect(f"ws://{addr}/v1/realtime/world")
            assert refused.value.response.status_code == 429
            assert b"open WebSocket connections" in refused.value.response.body
            assert httpx.get(f"http://{addr}/healthz").text == "OK"  # plain HTTP is not counted
            await held.pop().close()
            await asyncio.sleep(0.2)
            again = await websockets.connect(f"ws://{addr}/v1/realtime/tts")  # a slot came free
            for ws in [again, *held]:
                await ws.close()

        run(main())
