"""Close races on world sessions, against a real server process whose whole log is checked.

A client may close its socket at any moment: right after its own ``session.close``, after
a binary frame or an oversized frame (which the server answers by closing), and two
closes of one session may overlap (the client's ``session.close`` or disconnect with an
operator's ``DELETE /v1/sessions/world/{id}``). Each leaves no traceback or ERROR in the
server log, answers what docs/protocols.md documents, and frees the session id.
"""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Iterator

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from deploy.server_process import ServerProcess
from protocols import world_v1 as wire


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess() as proc:
        yield proc


@pytest.fixture
def clean(server: ServerProcess) -> Iterator[ServerProcess]:
    """The server, its log checked after the test (the closes' cleanup logs late)."""
    yield server
    asyncio.run(asyncio.sleep(0.3))
    assert server.alive and server.healthy()
    assert server.problems() == []


def url(server: ServerProcess) -> str:
    return f"ws://{server.addr}/v1/realtime/world"


def create(sid: str, credits: int = 8) -> str:
    return json.dumps({"type": "session.create", "session_id": sid, "credits": credits, "format": "rgb8"})


async def recv_json(ws) -> dict:
    while True:
        msg = await ws.recv()
        if isinstance(msg, str):
            data = json.loads(msg)
            if data["type"] != "chunk":
                return data


async def streaming(server: ServerProcess, sid: str):
    """A socket whose session ``sid`` is created and has sent its first chunk."""
    ws = await websockets.connect(url(server), max_size=None)
    await ws.send(create(sid))
    assert (await recv_json(ws))["type"] == "session.created"
    while not isinstance(await ws.recv(), bytes):  # the first chunk's frame
        pass
    return ws


async def recreate(server: ServerProcess, sid: str) -> None:
    """The id is free again: a new session under it ticks (the close's release may still
    be on its way through the engine's control lane, so give it a moment)."""
    for _ in range(50):
        async with websockets.connect(url(server), max_size=None) as ws:
            await ws.send(create(sid, credits=1))
            msg = await recv_json(ws)
            if msg["type"] == "session.created":
                await ws.send(json.dumps({"type": "session.close"}))
                assert (await recv_json(ws))["type"] == "session.closed"
                return
            assert msg["code"] == "session_exists", msg
        await asyncio.sleep(0.05)
    raise AssertionError(f"{sid} still taken")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_socket_closed_right_after_session_close(clean):
    async def main():
        for i in range(5):
            ws = await streaming(clean, f"after-close-{i}")
            await ws.send(json.dumps({"type": "session.close"}))
            ws.transport.abort() if i % 2 else await ws.close()  # gone with and without a close frame
            await recreate(clean, f"after-close-{i}")
    run(main())


def test_socket_closed_right_after_a_binary_frame(clean):
    async def main():
        for i in range(5):
            ws = await streaming(clean, f"after-binary-{i}")
            await ws.send(b"\x00" * 100)
            ws.transport.abort() if i % 2 else await ws.close()
            await recreate(clean, f"after-binary-{i}")
        # Read to the end once: the documented answer is bad_request, then close 1003.
        ws = await streaming(clean, "after-binary-read")
        await ws.send(b"\x00")
        assert (await recv_json(ws))["code"] == wire.BAD_REQUEST
        with pytest.raises(ConnectionClosed) as closed:
            await recv_json(ws)
        assert closed.value.rcvd.code == wire.CLOSE_UNSUPPORTED_DATA
        await recreate(clean, "after-binary-read")
    run(main())


def test_socket_closed_right_after_an_oversized_frame(clean):
    async def main():
        big = json.dumps({"type": "event", "event_id": 1, "prompt": "x" * (wire.MAX_TEXT_BYTES + 10)})
        for i in range(5):
            ws = await streaming(clean, f"after-big-{i}")
            await ws.send(big)
            ws.transport.abort() if i % 2 else await ws.close()
            await recreate(clean, f"after-big-{i}")
        ws = await streaming(clean, "after-big-read")
        await ws.send(big)
        assert (await recv_json(ws))["code"] == wire.MESSAGE_TOO_LARGE
        with pytest.raises(ConnectionClosed) as closed:
            await recv_json(ws)
        assert closed.value.rcvd.code == wire.CLOSE_TOO_BIG
        await recreate(clean, "after-big-read")
    run(main())


def test_two_session_closes_back_to_back(clean):
    async def main():
        ws = await streaming(clean, "twice")
        await ws.send(json.dumps({"type": "session.close"}))
        await ws.send(json.dumps({"type": "session.close"}))
        first, second = await recv_json(ws), await recv_json(ws)
        assert first["type"] == "session.closed" and first["session_id"] == "twice"
        # The second finds no session on the connection (docs/protocols.md, session.close).
        assert second["type"] == "error" and second["code"] == wire.NO_SESSION
        # The connection stays open and may create another session, the same id too.
        await ws.send(create("twice", credits=1))
        assert (await recv_json(ws))["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.close"}))
        await ws.send(json.dumps({"type": "session.close"}))
        await ws.close()
        await recreate(clean, "twice")
    run(main())


def test_an_admin_close_overlapping_the_clients_close(clean):
    """The race that logged ``SessionError: no_session``: the operator's close and the
    client's (``session.close``, then gone) end the session once, whichever comes first."""
    async def main():
        async with httpx.AsyncClient(base_url=f"http://{clean.addr}") as http:
            for i in range(8):
                sid = f"overlap-{i}"
                ws = await streaming(clean, sid)
                await ws.send(json.dumps({"type": "session.close"}))
                if i % 2:
                    ws.transport.abort()
                deleted = await http.delete(f"/v1/sessions/world/{sid}")
                # 200 if the admin close came first or joined the client's; 404 if the
                # client's close had already ended the session.
                assert deleted.status_code in (200, 404), deleted.text
                if not i % 2:
                    messages, code = [], "open"
                    try:
                        while True:
                            messages.append(await asyncio.wait_for(recv_json(ws), 2.0))
                    except asyncio.TimeoutError:
                        pass  # the client's close ran alone: its socket stays open
                    except ConnectionClosed as closed:
                        code = closed.rcvd.code if closed.rcvd else None
                    # One answer per close that ran: session.closed (the client's close)
                    # and closed_by_admin with 1008 when the operator's reached the session.
                    kinds = [m.get("code", m["type"]) for m in messages]
                    assert kinds and set(kinds) <= {"session.closed", wire.CLOSED_BY_ADMIN}, kinds
                    assert all(kinds.count(k) == 1 for k in kinds), kinds
                    assert code in ("open", 1008), code
                    await ws.close()
                await recreate(clean, sid)
    run(main())


@pytest.mark.parametrize("closer", ["admin", "drain"])
def test_a_close_while_a_reset_waits_for_the_running_tick_lets_that_tick_commit_first(fault_server, closer):
    """The reset stops the driver and waits for the running tick; an operator's close or a
    SIGTERM drain arriving then waits for the reset: the tick's chunk is committed and sent
    with its event, the reset is answered, and the session closes after (the close used to
    abandon the running tick: no chunk, its event dropped, two stray session_closed errors)."""
    sid = f"slow-reset-{closer}"

    async def main() -> list[dict]:
        got: list[dict] = []
        async with websockets.connect(f"ws://{fault_server.addr}/v1/realtime/world", max_size=None) as ws:
            await ws.send(create(sid, credits=1))
            assert (await recv_json(ws))["type"] == "session.created"
            while not isinstance(await ws.recv(), bytes):  # chunk 0 (the maze's seed frame)
                pass
            await ws.send(json.dumps({"type": "event", "event_id": 1, "controls": [
                {"track": "keys", "schema": "keys.v1", "data": {"mode": "state", "held": ["w"]}}]}))
            assert (await recv_json(ws))["type"] == "event.accepted"
            await ws.send(json.dumps({"type": "credit", "chunks": 1}))  # chunk 1, with event 1, runs 0.4 s
            await asyncio.sleep(0.15)
            await ws.send(json.dumps({"type": "session.reset"}))
            await asyncio.sleep(0.05)
            if closer == "admin":
                async with httpx.AsyncClient(base_url=f"http://{fault_server.addr}") as http:
                    assert (await http.delete(f"/v1/sessions/world/{sid}")).status_code == 200
            else:
                fault_server.proc.send_signal(signal.SIGTERM)
            try:
                while True:
                    msg = await asyncio.wait_for(ws.recv(), 10)
                    if isinstance(msg, str):
                        got.append(json.loads(msg))
            except ConnectionClosed as exc:
                got.append({"close": exc.rcvd.code if exc.rcvd else None})
        return got

    got = asyncio.run(main())
    seen = [(m.get("type"), m.get("code") or m.get("chunk_index"), m.get("applied_event_ids", m.get("dropped_event_ids")))
            for m in got if "close" not in m]
    expected = [("chunk", 1, [1]), ("session.reset", 0, []), ("session.closed", None, [])]
    if closer == "admin":
        expected.insert(0, ("error", "closed_by_admin", None))
    assert seen == expected, got
    assert got[-1] == {"close": 1008 if closer == "admin" else 1001}
    assert "abandons" not in fault_server.log_text()
