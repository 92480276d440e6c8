"""world.v1 ``stream_frames``: frames sent as the model makes them, the ``chunk`` commit last.

A real uvicorn server and raw WebSocket clients, so the exact message order is seen:
``chunk.frames`` (+ its binary frames) while the tick runs, then ``chunk`` with
``frames: 0, streamed: N``; a tick that fails after streaming sends ``error`` instead
of the commit. The tiny world runs with 3 frames per chunk; ``StreamingTiny`` hands
them over one by one, the plain tiny world (which does not stream) all at its end.
"""

from __future__ import annotations

import asyncio
import json
from typing import Sequence

import websockets

from clients.world import WorldClient
from models.world.base import WorldTick
from models.world.base import WorldChunk
from models.world.tiny import SIZE, TinyWorld
from protocols import world_v1 as wire
from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve

F = 3


class StreamingTiny(TinyWorld):
    """The tiny world handing each frame to the tick's sink; faults chosen by the prompt
    ("fail-late": a session's first tick fails after its first frame, later ones work)."""

    streams_frames = True

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.failed: set[str] = set()

    def generate(self, works: Sequence[WorldTick]) -> list[WorldChunk]:
        chunks = super().generate(works)
        for w, c in zip(works, chunks):
            if w.frame_sink is None:
                continue
            for i in range(F):
                if w.prompt == "fail-late" and i == 1 and w.session_id not in self.failed:
                    self.failed.add(w.session_id)
                    raise RuntimeError("simulated failure after the first frame")
                frame = c.frames[i:i + 1].copy()
                if w.prompt == "lie" and i == 2:
                    frame[:] = 255 - frame     # streams a frame that is not the chunk's
                w.frame_sink(i, frame)
        return chunks


def app_with(*models):
    inventory = Inventory()
    for m in models:
        inventory.add(m)
    return build_app(ServerConfig(world=WorldConfig(models=tuple(m.name for m in models))), inventory)


async def transcript(addr: str, sid: str, model: str, chunks: int, *, prompt: str | None = None,
                     stream: bool = True) -> list:
    """Every server message after the create, in order: dicts, and bytes for binary frames,
    until ``chunks`` commits (or an error) arrived."""
    async with websockets.connect(f"ws://{addr}/v1/realtime/world", max_size=None) as ws:
        await ws.send(json.dumps(wire.CreateRequest(sid, model=model, prompt=prompt, seed=4, format="rgb8",
                                                    credits=chunks, stream_frames=stream).to_wire()))
        assert json.loads(await ws.recv())["type"] == "session.created"
        out: list = []
        commits = 0
        while commits < chunks:
            msg = await asyncio.wait_for(ws.recv(), 60)
            out.append(msg if isinstance(msg, bytes) else json.loads(msg))
            if isinstance(out[-1], dict) and out[-1]["type"] in ("chunk", "error"):
                commits += 1
                for _ in range(out[-1].get("frames", 0) if out[-1]["type"] == "chunk" else 0):
                    out.append(await asyncio.wait_for(ws.recv(), 60))
        return out


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def test_streamed_frames_precede_their_commit_and_equal_the_unstreamed_chunks():
    with serve(app_with(StreamingTiny(name="stiny", frames_per_chunk=F), TinyWorld(frames_per_chunk=F))) as addr:
        streamed = run(transcript(addr, "s", "stiny", 2))
        plain = run(transcript(addr, "p", "stiny", 2, stream=False))
        # Each chunk: three chunk.frames of one frame each, in order, then the commit.
        kinds = [m["type"] if isinstance(m, dict) else "bin" for m in streamed]
        assert kinds == (["chunk.frames", "bin"] * F + ["chunk"]) * 2
        heads = [m for m in streamed if isinstance(m, dict)]
        assert [(h["chunk_index"], h["first"], h["frames"]) for h in heads if h["type"] == "chunk.frames"] == \
            [(c, i, 1) for c in (0, 1) for i in range(F)]
        commits = [h for h in heads if h["type"] == "chunk"]
        assert [(c["chunk_index"], c["frames"], c["streamed"]) for c in commits] == [(0, 0, F), (1, 0, F)]
        for c in commits:   # a chunk's parts carry its request id
            assert {h["request_id"] for h in heads if h["chunk_index"] == c["chunk_index"]} == {c["request_id"]}
        # The same seed without streaming: the same frames, after a chunk header each.
        assert [m["type"] if isinstance(m, dict) else "bin" for m in plain] == (["chunk"] + ["bin"] * F) * 2
        assert [m for m in streamed if isinstance(m, bytes)] == [m for m in plain if isinstance(m, bytes)]
        # A model that does not stream: its frames go out at once when its tick ends, then the commit.
        tiny = run(transcript(addr, "t", "tiny", 1))
        assert [m["type"] if isinstance(m, dict) else "bin" for m in tiny] == ["chunk.frames"] + ["bin"] * F + ["chunk"]
        assert (tiny[0]["first"], tiny[0]["frames"], tiny[-1]["streamed"]) == (0, F, F)


def test_a_tick_failing_after_streaming_sends_an_error_not_a_commit_and_the_client_drops_its_frames():
    with serve(app_with(StreamingTiny(name="stiny", frames_per_chunk=F))) as addr:
        late = run(transcript(addr, "f", "stiny", 1, prompt="fail-late"))
        kinds = [m["type"] if isinstance(m, dict) else "bin" for m in late]
        assert kinds == ["chunk.frames", "bin", "error"] and late[-1]["code"] == "session_failed"
        # Frames that are not the chunk's: all three were sent, the seam's check fails the tick.
        lie = run(transcript(addr, "l", "stiny", 1, prompt="lie"))
        assert [m["type"] if isinstance(m, dict) else "bin" for m in lie] == ["chunk.frames", "bin"] * F + ["error"]
        assert lie[-1]["code"] == "session_failed" and "not the chunk's" in lie[-1]["message"]

        async def client() -> None:
            async with WorldClient.connect(f"ws://{addr}/v1/realtime/world") as c:
                await c.create("c", model="stiny", prompt="fail-late", format="rgb8", credits=1, stream_frames=True)
                assert (await c.expect("error"))["code"] == "session_failed"
                assert c.chunks.empty()
                await c.reset()          # the failed tick spent no credit: chunk 0 runs again
                chunk = await c.next_chunk(credit=False)
                assert (chunk.chunk_index, len(chunk.payloads), chunk.header["streamed"]) == (0, F, F)
                assert all(f.shape == (SIZE, SIZE, 3) for f in chunk.frames())

        run(client())


def test_stream_frames_must_be_a_boolean():
    with serve(app_with(TinyWorld())) as addr:
        async def main() -> None:
            async with websockets.connect(f"ws://{addr}/v1/realtime/world") as ws:
                await ws.send(json.dumps({"type": "session.create", "session_id": "x", "stream_frames": 1}))
                err = json.loads(await ws.recv())
                assert (err["type"], err["code"]) == ("error", "bad_request") and "stream_frames" in err["message"]

        run(main())
