"""world.v1 ``format: "h264"`` end to end: a real uvicorn server, real WebSocket clients, the
frames decoded back with PyAV's H.264 decoder.

``maze-sim`` (rendered corridors at 96x160, 2 frames a chunk) walks and turns; every chunk's binary
frames are access units of one stream per session, an IDR at the start, after a reset and
once per chunk asked for with ``keyframe``.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
import websockets

from clients.world import WorldClient
from models.maze.sim_world import MazeSimWorld
from models.world.tiny import SIZE, TinyWorld
from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.inventory import Inventory
from protocols.annexb import nal_types
from tests.e2e.conftest import serve

av = pytest.importorskip("av", reason="the video extra (PyAV) is not installed")

F = 2
IDR, SPS, PPS = 5, 7, 8


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def url(addr: str) -> str:
    return f"ws://{addr}/v1/realtime/world"


def app_with(*models):
    inventory = Inventory()
    for m in models:
        inventory.add(m)
    return build_app(ServerConfig(world=WorldConfig(models=tuple(m.name for m in models))), inventory)


@pytest.fixture
def server():
    maze = MazeSimWorld(frames_per_chunk=F, height=96, width=160)
    with serve(app_with(maze, TinyWorld(frames_per_chunk=3))) as addr:
        yield addr


def idrs(units: list[bytes]) -> list[bool]:
    return [IDR in nal_types(u) for u in units]


class Decoder:
    """PyAV's H.264 decoder over one session's stream: one picture out per access unit in."""

    def __init__(self) -> None:
        self.ctx = av.CodecContext.create("h264", "r")

    def __call__(self, units: list[bytes]):
        return [f.to_ndarray(format="rgb24") for u in units for f in self.ctx.decode(av.Packet(u))]


def no_tracebacks(caplog) -> None:
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def test_an_h264_session_streams_decodable_frames_with_idrs_at_start_keyframe_and_reset(server, caplog):
    caplog.set_level(logging.INFO, logger="realtime")

    async def main():
        async with WorldClient.connect(url(server)) as c:
            created = await c.create("h1", model="maze-sim", format="h264", credits=0, bitrate_kbps=800)
            assert (created["format"], created["codec"], created["height"], created["width"]) == \
                ("h264", "avc1.42C01F", 96, 160)
            decode = Decoder()
            await c.hold_keys(["w", "l"])
            await c.credit(2)
            chunks = [await c.next_chunk(credit=False) for _ in range(2)]
            units = [u for ch in chunks for u in ch.payloads]
            assert [ch.header["frames"] for ch in chunks] == [F, F]
            assert idrs(units) == [True, False, False, False]
            assert nal_types(units[0])[:2] == [SPS, PPS]
            frames = decode(units)
            assert len(frames) == 4 and all(f.shape == (96, 160, 3) for f in frames)
            assert (frames[0] != frames[3]).any()  # walking and turning
            # A storm of requests: one IDR, at the next chunk's first frame, nothing else changes.
            for _ in range(20):
                await c.send({"type": "keyframe"})
            await c.credit(2)
            chunks = [await c.next_chunk(credit=False) for _ in range(2)]
            assert [ch.chunk_index for ch in chunks] == [2, 3]
            assert [idrs(ch.payloads) for ch in chunks] == [[True, False], [False, False]]
            assert len(decode([u for ch in chunks for u in ch.payloads])) == 4
            assert c.messages.empty()  # a keyframe is answered by nothing
            # Reset: chunk 0 again, a new stream from an IDR with its headers.
            await c.reset()
            await c.credit(1)
            chunk = await c.next_chunk(credit=False)
            assert chunk.chunk_index == 0 and idrs(chunk.payloads) == [True, False]
            assert nal_types(chunk.payloads[0])[:2] == [SPS, PPS]
            assert len(decode(chunk.payloads)) == F
            await c.close()

    run(main())
    no_tracebacks(caplog)


def test_streamed_h264_frames_and_the_main_profile(server):
    async def main():
        async with WorldClient.connect(url(server)) as c:
            created = await c.create("h2", model="tiny", format="h264", credits=2, stream_frames=True, profile="main")
            assert created["codec"] == "avc1.4D401F"
            chunks = [await c.next_chunk(credit=False) for _ in range(2)]
            assert [ch.header["streamed"] for ch in chunks] == [3, 3]
            units = [u for ch in chunks for u in ch.payloads]
            assert idrs(units) == [True] + [False] * 5
            frames = Decoder()(units)
            assert len(frames) == 6 and frames[0].shape == (SIZE, SIZE, 3)

    run(main())


def test_h264_refusals_are_documented_errors_and_change_nothing(server, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="realtime")

    async def main():
        async with websockets.connect(url(server)) as ws:
            async def ask(msg: dict) -> dict:
                await ws.send(json.dumps(msg))
                return json.loads(await asyncio.wait_for(ws.recv(), 30))

            err = await ask({"type": "keyframe"})
            assert (err["type"], err["code"]) == ("error", "no_session")
            create = {"type": "session.create", "session_id": "h3", "model": "maze-sim", "format": "h264"}
            err = await ask({**create, "bitrate_kbps": 50})
            assert (err["code"], err["message"]) == (
                "bad_request", "bitrate_kbps must be an integer in [100, 20000], got 50")
            err = await ask({**create, "format": "jpeg", "profile": "main"})
            assert err["code"] == "bad_request" and "profile" in err["message"]
            monkeypatch.setattr("realtime.video.h264_missing", lambda: "this server has no H.264 encoder "
                                "(PyAV is not installed: pip install 'realtime-sessions[video]')")
            err = await ask(create)
            assert err["code"] == "format_unavailable"
            assert "pip install 'realtime-sessions[video]'" in err["message"]
            # Nothing was created: the same id in jpeg, the default, works on the same connection.
            created = await ask({**create, "format": "jpeg", "credits": 1})
            assert (created["type"], created["format"], "codec" in created) == ("session.created", "jpeg", False)
            chunk = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert (chunk["type"], chunk["format"]) == ("chunk", "jpeg")
            payloads = [await ws.recv() for _ in range(chunk["frames"])]
            assert all(p[:2] == b"\xff\xd8" for p in payloads)
            await ws.send(json.dumps({"type": "keyframe"}))  # no-op outside h264
            closed = await ask({"type": "session.close"})
            assert closed["type"] == "session.closed"

    run(main())
    no_tracebacks(caplog)
