"""Hostile input on live sockets: a real server process (tiny world, dummy policy, the voice
when the tts extra is installed), its whole log checked for tracebacks afterwards.

Each case once broke a session or left a traceback (issue 14); now each gets its
documented error, and the same connection keeps working.
"""

from __future__ import annotations

import asyncio
import json
from typing import Iterator

import httpx
import msgpack
import numpy as np
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from deploy.server_process import ServerProcess

DEEP = "[" * 1000 + "]" * 1000


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(tts=True) as proc:
        yield proc
        assert proc.alive and proc.healthy()
        assert proc.problems() == []


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def has_tts(server: ServerProcess) -> bool:
    models = httpx.get(f"http://{server.addr}/v1/models").json()["data"]
    return any(m["kind"] == "tts" and m["available"] for m in models)


async def recv_json(ws) -> dict:
    while True:
        msg = await ws.recv()
        if isinstance(msg, str):
            return json.loads(msg)


# ------------------------------------------------------------------ world.v1
def world_url(server: ServerProcess) -> str:
    return f"ws://{server.addr}/v1/realtime/world"


def test_world_deep_nesting_and_huge_numbers_are_bad_request_and_the_session_stays(server):
    async def main():
        async with websockets.connect(world_url(server)) as ws:
            await ws.send('{"type":"session.create","session_id":"deep-1","prompt":%s}' % DEEP)
            assert (await recv_json(ws))["code"] == "bad_request"
            await ws.send('{"type":"session.create","session_id":"deep-1","seed":%s}' % ("9" * 400))
            assert (await recv_json(ws))["code"] == "bad_request"
            await ws.send('{"type":"session.create","session_id":"deep-1","credits":1e400}')
            assert (await recv_json(ws))["code"] == "bad_request"
            await ws.send(json.dumps({"type": "session.create", "session_id": "deep-1", "credits": 0}))
            assert (await recv_json(ws))["type"] == "session.created"
            await ws.send('{"type":"event","event_id":1,"prompt":%s}' % DEEP)
            assert (await recv_json(ws))["code"] == "bad_request"
            await ws.send('{"type":"event","event_id":NaN}')
            assert (await recv_json(ws))["code"] == "bad_request"
            # A lone surrogate is no text (a model that encodes its prompt failed every tick on one).
            await ws.send(json.dumps({"type": "event", "event_id": 1, "prompt": "\ud800 fine"}))
            refused = await recv_json(ws)
            assert (refused["code"], refused["event_id"]) == ("bad_request", 1) and "surrogate" in refused["message"]
            await ws.send(json.dumps({"type": "event", "event_id": 1, "prompt": "\ud83d\ude00 fine"}))  # a pair
            assert await recv_json(ws) == {"type": "event.accepted", "event_id": 1, "status": "accepted"}
            # A misspelt field does nothing: no credit given, no reset, no close.
            for msg in ({"type": "credit", "chunk": 1}, {"type": "session.reset", "hard": 1},
                        {"type": "session.close", "sessionid": "deep-1"}):
                await ws.send(json.dumps(msg))
                refused = await recv_json(ws)
                assert refused["code"] == "bad_request" and "unknown" in refused["message"]
            await ws.send(json.dumps({"type": "credit", "chunks": 1}))
            chunk = await recv_json(ws)
            assert (chunk["type"], chunk["chunk_index"], chunk["applied_event_ids"]) == ("chunk", 0, [1])

    run(main())


@pytest.mark.parametrize("last", ["session.close", "binary", "oversized"])
def test_world_close_races_leave_no_traceback(server, last):
    async def one(i: int) -> None:
        ws = await websockets.connect(world_url(server))
        await ws.send(json.dumps({"type": "session.create", "session_id": f"race-{last}-{i}", "credits": 8}))
        if i % 2:
            await recv_json(ws)  # half of them race with chunks being sent
        if last == "session.close":
            await ws.send(json.dumps({"type": "session.close"}))
        elif last == "binary":
            await ws.send(b"\x00\x01")
        else:
            await ws.send("x" * (65 * 1024))
        ws.transport.abort() if i % 3 == 0 else await ws.close()

    async def main():
        await asyncio.gather(*(one(i) for i in range(12)))
        # Every id is free again: their sessions were all cleaned up.
        await asyncio.sleep(0.5)
        async with websockets.connect(world_url(server)) as ws:
            for i in range(12):
                await ws.send(json.dumps({"type": "session.create", "session_id": f"race-{last}-{i}", "credits": 0}))
                assert (await recv_json(ws))["type"] == "session.created"
                await ws.send(json.dumps({"type": "session.close"}))
                assert (await recv_json(ws))["type"] == "session.closed"

    run(main())
    assert server.problems() == []


# ------------------------------------------------------------------ tts.v1
def tts_url(server: ServerProcess) -> str:
    return f"ws://{server.addr}/v1/realtime/tts"


async def speak(ws, text: str) -> tuple[list[dict], int]:
    await ws.send(json.dumps({"type": "input.text", "text": text}))
    await ws.send(json.dumps({"type": "input.done"}))
    messages, audio = [], 0
    while True:
        msg = await ws.recv()
        if isinstance(msg, bytes):
            audio += len(msg)
            continue
        messages.append(json.loads(msg))
        if messages[-1]["type"] in ("response.done", "error"):
            return messages, audio


def test_tts_hostile_frames_get_their_codes_and_the_session_keeps_speaking(server):
    if not has_tts(server):
        pytest.skip("the tts extra is not installed")
    cases = [
        ('{"type":"input.text","text":"hi","x":%s}' % DEEP, "bad_request"),
        ('{"type":"session.update","speed":%s}' % ("9" * 400), "bad_request"),
        ('{"type":"session.update","speed":%s}' % ("9" * 99), "bad_speed"),
        ('{"type":"session.update","speed":1e400}', "bad_request"),
        ('{"type":"session.update","speed":Infinity}', "bad_request"),
        (json.dumps({"type": "input.text", "text": "Hello \ud800 there."}), "invalid_text"),
        (json.dumps({"type": "input.text", "text": "Hello\x00 there."}), "invalid_text"),
        (json.dumps({"type": "input.text", "text": "a" * (1024 * 1024)}), "message_too_large"),
    ]

    async def main():
        async with websockets.connect(tts_url(server), max_size=None) as ws:
            assert (await recv_json(ws))["type"] == "session.updated"
            for raw, code in cases:
                await ws.send(raw)
                err = await recv_json(ws)
                assert (err["type"], err["code"]) == ("error", code), raw[:80]
            messages, audio = await speak(ws, "Still speaking.")
            kinds = [m["type"] for m in messages]
            assert kinds == ["audio.start", "audio.done", "response.done"] and audio > 0
            assert messages[0]["text"] == "Still speaking."

    run(main())


@pytest.mark.parametrize("last", ["session.close", "binary", "oversized"])
def test_tts_close_races_leave_no_traceback(server, last):
    if not has_tts(server):
        pytest.skip("the tts extra is not installed")

    async def one(i: int) -> None:
        ws = await websockets.connect(tts_url(server), max_size=None)
        await recv_json(ws)
        await ws.send(json.dumps({"type": "input.text", "text": "A short one. "}))
        if i % 2:
            assert (await recv_json(ws))["type"] == "audio.start"  # race with audio being sent
        if last == "session.close":
            await ws.send(json.dumps({"type": "session.close"}))
        elif last == "binary":
            await ws.send(b"\x00\x01")
        else:
            await ws.send("x" * (65 * 1024))
        ws.transport.abort() if i % 3 == 0 else await ws.close()

    async def main():
        await asyncio.gather(*(one(i) for i in range(6)))

    run(main())
    assert server.healthy()
    assert server.problems() == []


# ------------------------------------------------------------------ OpenPI
def test_openpi_hostile_numbers_end_only_that_robot(server):
    url = f"ws://{server.addr}/v1/realtime/robot/openpi"

    async def main():
        async with websockets.connect(url, max_size=None, compression=None) as good:
            meta = msgpack.unpackb(await good.recv())
            h, w = meta["image_resolution"]
            obs = {k: {b"__ndarray__": True, b"data": bytes(h * w * 3), b"dtype": "|u1", b"shape": [h, w, 3]}
                   for k in meta["image_keys"]}
            obs[meta["state_key"]] = [0.0] * meta["state_dim"]
            bad = [
                {**obs, "sampling_params": {"num_inference_steps": 2**64 - 1}},
                {**obs, "x": {b"__npgeneric__": True, b"data": 2**64 - 1, b"dtype": "<i1"}},
                {**obs, "x": {b"__ndarray__": True, b"data": b"", b"dtype": "<f4", b"shape": [0, 2**63]}},
                {**obs, "x": {b"__ndarray__": True, b"data": b"", b"dtype": "<f4", b"shape": [0] * 40}},
                {**obs, meta["state_key"]: [1e300] * meta["state_dim"]},
            ]
            for body in bad:
                async with websockets.connect(url, max_size=None, compression=None) as robot:
                    await robot.recv()
                    await robot.send(msgpack.packb(body))
                    text = await robot.recv()
                    assert isinstance(text, str) and text.startswith("invalid request: ")
                    with pytest.raises(ConnectionClosed) as info:
                        await robot.recv()
                    assert info.value.rcvd.code == 1011
            await good.send(msgpack.packb(obs))
            reply = msgpack.unpackb(await good.recv())
            assert reply["actions"][b"__ndarray__"] is True

    run(main())


@pytest.mark.parametrize("last", ["observation", "text", "garbage"])
def test_openpi_close_races_leave_no_traceback(server, last):
    url = f"ws://{server.addr}/v1/realtime/robot/openpi"

    async def one(i: int) -> None:
        ws = await websockets.connect(url, max_size=None, compression=None)
        meta = msgpack.unpackb(await ws.recv())
        h, w = meta["image_resolution"]
        obs = {k: {b"__ndarray__": True, b"data": bytes(h * w * 3), b"dtype": "|u1", b"shape": [h, w, 3]}
               for k in meta["image_keys"]}
        obs[meta["state_key"]] = [0.0] * meta["state_dim"]
        if last == "observation":
            await ws.send(msgpack.packb(obs))  # and leave mid-inference
        elif last == "text":
            await ws.send("not msgpack")
        else:
            await ws.send(b"\xc1" * (1024 * 1024))
        ws.transport.abort() if i % 2 else await ws.close()

    async def main():
        await asyncio.gather(*(one(i) for i in range(8)))

    run(main())
    assert server.healthy()
    assert server.problems() == []


# ------------------------------------------------------------------ every endpoint
@pytest.mark.parametrize("path", ["/v1/realtime/world", "/v1/realtime/tts", "/v1/realtime/robot/openpi"])
def test_a_text_frame_that_is_not_utf8_closes_1007_without_a_traceback(server, path):
    async def main():
        async with websockets.connect(f"ws://{server.addr}{path}", max_size=None) as ws:
            if "tts" in path and not has_tts(server):
                return
            await ws.recv()  # session.updated / the OpenPI metadata; world sends nothing first
            await ws.send(b'{"type":"\xed\xa0\x80"}', text=True)  # a UTF-8-encoded lone surrogate
            with pytest.raises(ConnectionClosed) as info:
                while True:
                    await ws.recv()
            assert info.value.rcvd.code == 1007

    if path == "/v1/realtime/world":
        async def main():  # noqa: F811 - world sends nothing before the client speaks
            async with websockets.connect(f"ws://{server.addr}{path}") as ws:
                await ws.send(b"\xff\xfe", text=True)
                with pytest.raises(ConnectionClosed) as info:
                    await ws.recv()
                assert info.value.rcvd.code == 1007
    run(main())
    assert server.problems() == []
