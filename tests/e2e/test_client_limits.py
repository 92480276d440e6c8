"""What one client may hold (realtime/server/limits.py), through a real server on loopback: the
idle timeout of every kind and the live-session limit per client address.

The kinds: the tiny world, the dummy policy behind the real ``openpi-client``, and a test
voice (``Ticks``: windows that take a set time, so "speaking" and "a window in flight" are
exact); the timeouts are short (0.5 s) so each test runs in a few seconds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Iterator, Mapping, Sequence

import httpx
import numpy as np
import pytest
import websockets
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from models.policy import DummyPolicy
from models.tts.base import DecodeWindow, TTSAdapter, TTSWork, WindowAudio
from models.world.base import WorldAdapter, WorldChunk, WorldGeometry, WorldTick
from models.world.tiny import TinyWorld
from protocols.close_codes import CLOSE_IDLE_TIMEOUT, CLOSE_TRY_AGAIN_LATER
from protocols.openpi import PolicyMetadata
from realtime.server.app import build_app
from realtime.server.config import LimitsConfig, PolicyConfig, ServerConfig, TTSConfig, WorldConfig
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve

IDLE_S = 0.5
META = PolicyMetadata(action_horizon=5, action_dim=3, image_keys=("cam",), image_resolution=(32, 32), state_dim=2)
OBS = {"cam": np.zeros((32, 32, 3), np.uint8), "state": np.zeros(2, np.float32), "prompt": "go"}


class Ticks(TTSAdapter):
    """A voice whose every sentence is ``windows`` windows of 4 samples, each taking ``window_s``."""

    name = "ticks"
    voices = ("tick",)

    def __init__(self, windows: int = 3, window_s: float = 0.8) -> None:
        self.windows, self.window_s = windows, window_s
        self.made: dict[tuple[str, int, int], int] = {}  # engine thread only

    def describe(self) -> Mapping[str, Any]:
        return {"kind": self.kind, "name": self.name}

    def synthesize_batch(self, works: Sequence[TTSWork]) -> list[WindowAudio]:
        time.sleep(self.window_s)
        out = []
        for w in works:
            key = (w.session_id, w.utterance_index, w.sentence_index)
            n = self.made[key] = self.made.get(key, 0) + 1 if isinstance(w, DecodeWindow) else 1
            done = n >= self.windows
            if done:
                del self.made[key]
            out.append(WindowAudio(w.session_id, w.utterance_index, w.sentence_index, n - 1, b"\x01\x00" * 4, 4,
                                  22050, done, 4 * n))
        return out

    def drop_session(self, session_id: str) -> None:
        for key in [k for k in self.made if k[0] == session_id]:
            del self.made[key]


class Wall(WorldAdapter):
    """A world of big blank frames made at once (3 MiB a chunk as rgb8): a client that stops
    reading fills every buffer on the way within a few chunks."""

    name = "wall"
    max_batch = 8
    geometry = WorldGeometry(height=1024, width=1024, frames_per_chunk=1, fps=15.0)

    def __init__(self) -> None:
        self.frames = np.zeros((1, 1024, 1024, 3), np.uint8)

    def generate(self, works: Sequence[WorldTick]) -> list[WorldChunk]:
        return [WorldChunk.answering(w, self.frames) for w in works]


def app(idle_s: float = IDLE_S, per_client: int = 0, infer_ms: float = 0.0,
        world: Mapping[str, Any] | None = None, **config: Any):
    inventory = Inventory()
    for adapter in (TinyWorld(max_batch=8), Wall(), DummyPolicy(metadata=META, infer_ms=infer_ms), Ticks()):
        inventory.adapters[adapter.name] = adapter
    return build_app(ServerConfig(world=WorldConfig(models=("tiny", "wall"), **(world or {})),
                                  policy=PolicyConfig(policy="dummy"),
                                  tts=TTSConfig(enabled=True),
                                  limits=LimitsConfig(idle_timeout_s=idle_s, max_sessions_per_client=per_client),
                                  **config), inventory)


@pytest.fixture
def server(request) -> Iterator[str]:
    with serve(app(**getattr(request, "param", {}))) as addr:
        yield addr


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def live(addr: str) -> set[tuple[str, str]]:
    return {(s["kind"], s["session_id"]) for s in httpx.get(f"http://{addr}/v1/sessions", timeout=5).json()["data"]}


async def world(addr: str, sid: str, credits: int = 0, headers: dict | None = None, model: str = "tiny"):
    ws = await websockets.connect(f"ws://{addr}/v1/realtime/world", max_size=None, additional_headers=headers)
    await ws.send(json.dumps({"type": "session.create", "session_id": sid, "format": "rgb8", "credits": credits,
                              "model": model}))
    return ws, await text(ws)


async def text(ws) -> dict:
    """The next text message (frames of chunks skipped)."""
    while True:
        msg = await ws.recv()
        if isinstance(msg, str):
            return json.loads(msg)


async def rest(ws) -> list[dict]:
    """Every text message until the server closes the socket."""
    out = []
    try:
        while True:
            msg = await ws.recv()
            if isinstance(msg, str):
                out.append(json.loads(msg))
    except websockets.ConnectionClosed:
        return out


async def tts(addr: str, headers: dict | None = None):
    ws = await websockets.connect(f"ws://{addr}/v1/realtime/tts", max_size=None, additional_headers=headers)
    return ws, await text(ws)


async def gone(addr: str, key: tuple[str, str], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while key in live(addr):
        assert time.monotonic() < deadline, f"{key} still live"
        await asyncio.sleep(0.05)


# --------------------------------------------------------------------------- idle timeout
def test_an_idle_world_session_is_told_reported_and_closed_and_its_id_freed(server):
    async def main():
        ws, created = await world(server, "idle-w", credits=0)
        assert created["type"] == "session.created"
        # Held by a client with no credits: the event is accepted but never applied.
        await ws.send(json.dumps({"type": "event", "event_id": 1, "prompt": "left"}))
        assert (await text(ws))["type"] == "event.accepted"
        started = time.monotonic()
        messages = await rest(ws)
        waited = time.monotonic() - started
        assert [m["type"] for m in messages] == ["error", "session.closed"]
        assert messages[0]["code"] == "idle_timeout" and "0.5 s" in messages[0]["message"]
        assert messages[1] == {"type": "session.closed", "session_id": "idle-w", "dropped_event_ids": [1]}
        assert ws.close_code == CLOSE_IDLE_TIMEOUT and ws.close_reason == "idle timeout"
        assert IDLE_S * 0.9 < waited < IDLE_S + 3
        await gone(server, ("world", "idle-w"))
        again, created = await world(server, "idle-w", credits=2)  # the id and its slot are free
        assert created["type"] == "session.created"
        assert (await text(again))["chunk_index"] == 0
        await again.close()

    run(main())


def test_a_world_connection_without_a_session_is_closed_when_idle(server):
    async def main():
        ws = await websockets.connect(f"ws://{server}/v1/realtime/world")
        messages = await rest(ws)
        assert [m["code"] for m in messages] == ["idle_timeout"] and "no message for 0.5 s" in messages[0]["message"]
        assert ws.close_code == CLOSE_IDLE_TIMEOUT
        # A create that announces a first image and never sends it: no session, the same close.
        ws = await websockets.connect(f"ws://{server}/v1/realtime/world")
        await ws.send(json.dumps({"type": "session.create", "session_id": "no-image",
                                  "image": {"format": "png", "bytes": 100}}))
        assert [m["code"] for m in await rest(ws)] == ["idle_timeout"]
        assert ws.close_code == CLOSE_IDLE_TIMEOUT
        assert ("world", "no-image") not in live(server)

    run(main())


# A longer timeout here: the client shares the process (and two loaded cores) with the server,
# and a stall of either must not read as the client's idleness.
@pytest.mark.parametrize("server", [{"idle_s": 1.5}], indirect=True)
def test_a_world_client_that_takes_chunks_or_talks_is_not_idle(server):
    async def main():
        reader, _ = await world(server, "busy-reader", credits=4)
        talker, _ = await world(server, "busy-talker", credits=0)
        until = time.monotonic() + 2 * 1.5

        async def read() -> int:  # takes chunks, crediting each: never idle
            chunks = 0
            while time.monotonic() < until:
                msg = await text(reader)
                assert msg["type"] == "chunk", msg
                chunks += 1
                await reader.send(json.dumps({"type": "credit", "chunks": 1}))
            return chunks

        async def talk() -> int:  # takes nothing, but sends an event several times per timeout
            event_id = 0
            while time.monotonic() < until:
                event_id += 1
                await talker.send(json.dumps({"type": "event", "event_id": event_id, "prompt": "x"}))
                assert (await text(talker))["type"] == "event.accepted"
                await asyncio.sleep(0.25)
            return event_id

        chunks, events = await asyncio.gather(read(), talk())
        # Each message was a chunk or an acceptance (no idle_timeout), and both sessions still answer.
        assert chunks >= 2 and events >= 6
        await talker.send(json.dumps({"type": "event", "event_id": events + 1, "prompt": "x"}))
        assert (await text(talker))["type"] == "event.accepted"
        assert (await text(reader))["type"] == "chunk"
        await reader.close()
        await talker.close()

    run(main())


# The default (one tick in flight for a lone session) and two in flight, where the driver
# has a tick queued behind the chunk the stalled client does not take.
@pytest.mark.parametrize("server", [{}, {"world": {"session_ticks_in_flight": 2,
                                                  "session_ticks_in_flight_alone": None}}],
                         indirect=True, ids=["auto", "two-in-flight"])
def test_a_stalled_world_client_is_dropped_and_its_session_freed(server):
    """A client that holds credits but stops reading: no chunk is taken, so it is idle
    (ticks done in the engine whose chunks wait for it are not work in flight); its
    goodbye cannot be taken either, so the socket is dropped (no close frame)."""
    async def main():
        ws, _ = await world(server, "stalled", credits=64, model="wall")  # 64 x 3 MiB: more than TCP buffers
        ws.transport.pause_reading()  # TCP back-pressure: the server's sends stop going out
        started = time.monotonic()
        await gone(server, ("world", "stalled"), timeout_s=IDLE_S + 15)
        assert time.monotonic() - started < IDLE_S + 2 + 5  # the timeout, the goodbye's, a loaded machine
        ws.transport.resume_reading()
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                await ws.recv()
        assert ws.close_code != CLOSE_IDLE_TIMEOUT  # dropped: the close frame could not be sent

    run(main())


def test_an_idle_voice_is_closed_but_not_while_it_speaks(server):
    async def main():
        ws, first = await tts(server)
        assert first["type"] == "session.updated"
        # One sentence of three windows of 0.8 s each: a window in flight (longer than the
        # timeout) and the audio between windows keep the session; no message is sent meanwhile.
        await ws.send(json.dumps({"type": "input.text", "text": "Hello there."}))
        await ws.send(json.dumps({"type": "input.done"}))
        started, types, pcm = time.monotonic(), [], 0
        while "response.done" not in types:
            msg = await ws.recv()
            if isinstance(msg, bytes):
                pcm += len(msg)
            else:
                types.append(json.loads(msg)["type"])
        assert time.monotonic() - started > 2 * IDLE_S
        assert types == ["audio.start", "audio.done", "response.done"] and pcm == 3 * 8
        sid = next(s for k, s in live(server) if k == "tts")
        messages = await rest(ws)  # then silence: idle
        assert [m["code"] for m in messages] == ["idle_timeout"]
        assert ws.close_code == CLOSE_IDLE_TIMEOUT and ws.close_reason == "idle timeout"
        await gone(server, ("tts", sid))

    run(main())


@pytest.mark.parametrize("server", [{"infer_ms": 1500.0}], indirect=True)
def test_an_idle_robot_is_closed_but_not_during_a_long_inference(server):
    def main():
        robot = WebsocketClientPolicy(host=f"ws://{server}/v1/realtime/robot/openpi")
        started = time.monotonic()
        result = robot.infer({**OBS, "session_id": "idle-r"})  # 1.5 s: three idle timeouts
        assert time.monotonic() - started > 1.4 and result["actions"].shape == (5, 3)
        assert ("policy", "idle-r") in live(server)
        deadline = time.monotonic() + 5
        while ("policy", "idle-r") in live(server):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(websockets.ConnectionClosed) as info:
            robot.infer({**OBS, "session_id": "idle-r"})
        assert info.value.rcvd.code == CLOSE_IDLE_TIMEOUT and info.value.rcvd.reason == "idle timeout"

    main()


def test_a_robot_answered_inline_is_not_idle_while_it_calls():
    """An instant policy runs on the event loop (no wait on the engine, no watch on the next
    receive): each request and each reply taken is still activity; silence then is idle."""
    built = app()
    with serve(built) as addr:
        robot = WebsocketClientPolicy(host=f"ws://{addr}/v1/realtime/robot/openpi")
        started = time.monotonic()
        calls = 0
        while time.monotonic() - started < 6 * IDLE_S:  # three timeouts' worth, a call every 0.1 s
            assert robot.infer({**OBS, "session_id": "inline-r"})["actions"].shape == (5, 3)
            calls += 1
            time.sleep(0.1)
        assert built.state.engine.stats.inline_works > 0 and calls >= 10
        assert ("policy", "inline-r") in live(addr)
        # Then nothing: the idle text, then close 4408.
        assert robot._ws.recv(timeout=IDLE_S + 5).startswith("idle_timeout: no request for 0.5 s")
        with pytest.raises(websockets.ConnectionClosed) as info:
            robot._ws.recv(timeout=5)
        assert info.value.rcvd.code == CLOSE_IDLE_TIMEOUT


@pytest.mark.parametrize("server", [{"idle_s": 0.0}], indirect=True)
def test_a_timeout_of_zero_never_closes(server):
    async def main():
        ws, _ = await world(server, "forever", credits=0)
        voice, _ = await tts(server)
        await asyncio.sleep(1.0)
        assert {("world", "forever")} <= live(server) and any(k == "tts" for k, _ in live(server))
        await ws.send(json.dumps({"type": "credit", "chunks": 1}))
        assert (await text(ws))["type"] == "chunk"
        await ws.close()
        await voice.close()

    run(main())


def test_a_drain_longer_than_the_idle_timeout_closes_every_kind_with_1001_never_as_idle(caplog):
    """The drain and the idle timeout on one socket: a voice mid-utterance keeps the drain
    going for several idle timeouts, and meanwhile no socket (idle or not) is closed as
    idle; each kind gets its drain goodbye and close 1001, once."""
    caplog.set_level(logging.INFO, logger="realtime")
    server = serve(app(drain_timeout_s=10.0))
    addr = server.__enter__()
    try:
        async def main() -> float:
            speaking, _ = await tts(addr)
            quiet_voice, _ = await tts(addr)
            idle_world, _ = await world(addr, "drain-idle", credits=0)
            await idle_world.send(json.dumps({"type": "event", "event_id": 1, "prompt": "left"}))
            assert (await text(idle_world))["type"] == "event.accepted"
            robot = await websockets.connect(f"ws://{addr}/v1/realtime/robot/openpi", max_size=None)
            assert isinstance(await robot.recv(), bytes)  # the policy's metadata
            await speaking.send(json.dumps({"type": "input.text", "text": "Hello there."}))
            await speaking.send(json.dumps({"type": "input.done"}))
            assert (await text(speaking))["type"] == "audio.start"
            started = time.monotonic()
            stopping = asyncio.ensure_future(asyncio.to_thread(server.__exit__, None, None, None))
            said = await asyncio.gather(*(rest(ws) for ws in (speaking, quiet_voice, idle_world, robot)))
            drained = time.monotonic() - started
            await stopping
            assert [m["type"] for m in said[0]] == ["audio.done", "response.done"]
            assert said[1] == [] and said[3] == []
            assert said[2] == [{"type": "session.closed", "session_id": "drain-idle", "dropped_event_ids": [1]}]
            for ws in (speaking, quiet_voice, idle_world, robot):
                assert (ws.close_code, ws.close_reason) == (1001, "server shutting down")
            return drained

        drained = run(main())
    finally:
        server.__exit__(None, None, None)  # no-op once stopped
    # The rest of the utterance (two 0.8 s windows) kept the drain going past the idle timeout.
    assert drained > 3 * IDLE_S
    assert not [r.getMessage() for r in caplog.records if "idle for" in r.getMessage()]


def test_a_stalled_world_client_during_a_drain_is_dropped_by_the_drain_not_as_idle(caplog):
    """A client that stops reading just before SIGTERM: the drain, not the idle timeout
    (1.5 s, shorter than the drain's 1 s deadline plus its 2 s close), ends it; the close
    frame it cannot take does not hold the server's shutdown."""
    caplog.set_level(logging.INFO, logger="realtime")
    server = serve(app(idle_s=1.5, drain_timeout_s=1.0))
    addr = server.__enter__()
    try:
        async def main() -> float:
            ws, created = await world(addr, "stalled-drain", credits=64, model="wall")
            assert created["type"] == "session.created"
            ws.transport.pause_reading()
            await asyncio.sleep(0.5)  # the server's sends back up
            started = time.monotonic()
            await asyncio.to_thread(server.__exit__, None, None, None)
            stopped = time.monotonic() - started
            ws.transport.resume_reading()
            with pytest.raises(websockets.ConnectionClosed):
                while True:
                    await ws.recv()
            return stopped

        stopped = run(main())
    finally:
        server.__exit__(None, None, None)  # no-op once stopped
    assert stopped < 1.0 + 2.0 + 4.0  # the deadline, the close frame's timeout, a loaded machine
    lines = [r.getMessage() for r in caplog.records]
    assert not [line for line in lines if "idle for" in line], lines


# --------------------------------------------------------------------------- per-client limit
@pytest.mark.parametrize("server", [{"idle_s": 0.0, "per_client": 3}], indirect=True)
def test_the_client_past_its_limit_is_refused_on_every_kind_and_the_first_keep_working(server):
    async def main():
        w1, c1 = await world(server, "lim-w1", credits=1)
        w2, c2 = await world(server, "lim-w2", credits=1)
        robot = await asyncio.to_thread(WebsocketClientPolicy, host=f"ws://{server}/v1/realtime/robot/openpi")
        assert c1["type"] == c2["type"] == "session.created"
        before = live(server)

        # The 4th: a world create gets too_many_sessions and the connection stays usable.
        w3, refused = await world(server, "lim-w3", credits=1)
        assert refused["type"] == "error" and refused["code"] == "too_many_sessions"
        assert "--max-sessions-per-client 3" in refused["message"] and "127.0.0.1" in refused["message"]
        # A voice: the error, then close 1013.
        voice, refused = await tts(server)
        assert refused["code"] == "too_many_sessions" and "--max-sessions-per-client 3" in refused["message"]
        with pytest.raises(websockets.ConnectionClosed):
            await voice.recv()
        assert voice.close_code == CLOSE_TRY_AGAIN_LATER
        # A robot: the real client reads no metadata; the text and 1013 come instead.
        raw = await websockets.connect(f"ws://{server}/v1/realtime/robot/openpi")
        assert (await raw.recv()).startswith("too_many_sessions: client 127.0.0.1 already holds 3")
        with pytest.raises(websockets.ConnectionClosed):
            await raw.recv()
        assert raw.close_code == CLOSE_TRY_AGAIN_LATER
        assert live(server) == before  # nothing else changed

        # The first three keep working.
        assert (await text(w1))["chunk_index"] == 0 and (await text(w2))["chunk_index"] == 0
        assert (await asyncio.to_thread(robot.infer, OBS))["actions"].shape == (5, 3)

        # Closing one frees its slot: the refused connection may create now.
        await w1.send(json.dumps({"type": "session.close"}))
        assert (await text(w1))["type"] == "session.closed"
        await w3.send(json.dumps({"type": "session.create", "session_id": "lim-w3", "format": "rgb8"}))
        assert (await text(w3))["type"] == "session.created"
        for ws in (w1, w2, w3):
            await ws.close()
        await asyncio.to_thread(robot._ws.close)  # openpi-client has no close of its own

    run(main())


@pytest.mark.parametrize("server", [{"idle_s": 0.0, "per_client": 1}], indirect=True)
def test_clients_behind_a_trusted_proxy_are_counted_apart(server):
    """Loopback is a trusted proxy by default (deploy/ runs nginx there): X-Forwarded-For
    names the client, so two clients behind it each get their own limit."""
    async def main():
        a, created_a = await world(server, "fwd-a", headers={"X-Forwarded-For": "198.51.100.7"})
        b, created_b = await world(server, "fwd-b", headers={"X-Forwarded-For": "198.51.100.8"})
        assert created_a["type"] == created_b["type"] == "session.created"
        a2, refused = await world(server, "fwd-a2", headers={"X-Forwarded-For": "198.51.100.7"})
        assert refused["code"] == "too_many_sessions" and "198.51.100.7" in refused["message"]
        for ws in (a, b, a2):
            await ws.close()

    run(main())


def test_an_untrusted_peer_cannot_name_another_client():
    with serve(app(idle_s=0.0, per_client=1, forwarded_allow_ips=("192.0.2.1",))) as addr:
        async def main():
            a, created = await world(addr, "spoof-a", headers={"X-Forwarded-For": "198.51.100.7"})
            b, refused = await world(addr, "spoof-b", headers={"X-Forwarded-For": "198.51.100.8"})
            assert created["type"] == "session.created"
            assert refused["code"] == "too_many_sessions" and "client 127.0.0.1" in refused["message"]
            await a.close()
            await b.close()

        run(main())
