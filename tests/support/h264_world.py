"""A small world.v1 server that speaks ``format: "h264"``, for the page and client tests.

It keeps the wire contract of docs/protocols.md (session.create with ``format``,
``bitrate_kbps`` and ``profile``; ``session.created`` with ``codec``; a ``chunk`` message then
one binary message a frame, each an Annex B access unit with SPS/PPS before each IDR; an
IDR at the first chunk, after ``session.reset`` and after ``keyframe``, at most one a
chunk; ``format_unavailable`` without an encoder) with the server's libx264 stream
(realtime/video.py ``H264Encoder``), and records
what it did so a test can assert the page's side exactly. It also sends jpeg, for the
page's fallback.

The world is a picture of a white square on a background whose colour follows the frame
number: W/S move the square up/down, A/D left/right, one pixel step a frame.
"""

from __future__ import annotations

import asyncio
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

WEB_DIR = Path(__file__).resolve().parents[2] / "clients" / "web"
MODEL = "fake-h264"
CODEC = "avc1.42C01F"  # constrained baseline, level 3.1
STEP = 2  # pixels the square moves a frame while a key is held


@dataclass
class SessionLog:
    """One session's chunks, as the server made them."""

    format: str
    # One entry a chunk sent: (chunk_index, each frame's kind, "key" or "delta"; empty for jpeg).
    sent: list[tuple[int, list[str]]] = field(default_factory=list)
    # The square's (x, y) after each chunk made, sent or not, by chunk index.
    positions: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class WorldLog:
    """What the server did, for the test to compare with what the page did."""

    creates: list[dict[str, Any]] = field(default_factory=list)
    keyframe_requests: int = 0
    sessions: list[SessionLog] = field(default_factory=list)  # in the order they were created


@dataclass(frozen=True)
class FakeWorld:
    """How the server behaves: frame size and rate, and the faults it plays."""

    height: int = 96
    width: int = 128
    frames_per_chunk: int = 2
    fps: float = 15.0
    encoder: bool = True  # False: h264 is answered format_unavailable
    codec: str = CODEC  # the codec string session.created names
    drop_chunks: frozenset[int] = frozenset()  # made (the encoder moves on) but never sent
    chunks: int | None = None  # a session makes this many chunks, then waits (None: no end)
    # Chunks whose first access unit is sent as an IDR slice of garbage, with no SPS or PPS
    # before it (the encoder moves on as if it had been sent).
    corrupt_chunks: frozenset[int] = frozenset()


# An IDR slice NAL unit of noise: a decoder has no parameter sets for it.
CORRUPT_IDR = b"\x00\x00\x00\x01\x65" + bytes((i * 37 + 11) % 251 + 1 for i in range(600))


def render(height: int, width: int, frame: int, x: int, y: int) -> np.ndarray:
    """The picture: a background that changes every frame, a white 16x16 square at (x, y)."""
    image = np.empty((height, width, 3), np.uint8)
    image[:] = ((frame * 7) % 200 + 20, 60, 255 - (frame * 5) % 200)
    image[y:y + 16, x:x + 16] = 255
    return image


class Encoder:
    """The server's own libx264 stream (realtime/video.py), one frame at a time, an IDR on demand."""

    def __init__(self, height: int, width: int, fps: float, bitrate_kbps: int, profile: str) -> None:
        from realtime.video import H264Encoder, H264Settings

        self.stream = H264Encoder(H264Settings(height, width, fps, bitrate_kbps, profile), preset="ultrafast")

    def encode(self, rgb: np.ndarray, idr: bool) -> bytes:
        (unit,) = self.stream.encode(rgb[None], idr_at=0 if idr else None)
        return unit


def is_idr(unit: bytes) -> bool:
    at = 0
    while (at := unit.find(b"\x00\x00\x01", at)) >= 0:
        at += 3
        if at < len(unit) and unit[at] & 0x1F == 5:
            return True
    return False


def jpeg(rgb: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="JPEG", quality=92)
    return out.getvalue()


class Session:
    """One session on one socket: the reader handles messages, the producer sends chunks."""

    def __init__(self, ws: WebSocket, world: FakeWorld, log: WorldLog, create: dict[str, Any]) -> None:
        self.ws, self.world, self.log = ws, world, log
        self.id = create["session_id"]
        self.format = create.get("format", "jpeg")
        self.bitrate = create.get("bitrate_kbps", 2500)
        self.profile = create.get("profile", "baseline")
        self.credits = create.get("credits", 4)
        self.held: set[str] = set()
        self.applied: list[int] = []
        self.x, self.y, self.frame, self.chunk_index = 8, 8, 0, 0
        self.encoder: Encoder | None = None
        self.keyframe_asked = False
        self.closed = False
        self.wake = asyncio.Event()
        self.record = SessionLog(self.format)
        log.sessions.append(self.record)
        self.send_lock = asyncio.Lock()

    async def send(self, *messages: dict[str, Any] | bytes) -> None:
        async with self.send_lock:  # a chunk and its frames go out together
            for m in messages:
                if isinstance(m, bytes):
                    await self.ws.send_bytes(m)
                else:
                    await self.ws.send_text(json.dumps(m))

    def handle(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        kind = msg["type"]
        if kind == "credit":
            self.credits += msg["chunks"]
        elif kind == "keyframe":
            self.log.keyframe_requests += 1
            self.keyframe_asked = True
        elif kind == "event":
            for control in msg.get("controls", []):
                if control["track"] == "keys" and control["data"]["mode"] == "state":
                    self.held = set(control["data"]["held"])
            self.applied.append(msg["event_id"])
            return {"type": "event.accepted", "event_id": msg["event_id"], "status": "accepted"}
        elif kind == "session.reset":
            self.x, self.y, self.chunk_index, self.encoder = 8, 8, 0, None
            return {"type": "session.reset", "session_id": self.id, "chunk_index": 0, "dropped_event_ids": []}
        elif kind == "session.close":
            self.closed = True
            return {"type": "session.closed", "session_id": self.id, "dropped_event_ids": []}
        self.wake.set()
        return None

    async def produce(self) -> None:
        period = self.world.frames_per_chunk / self.world.fps
        while not self.closed:
            if self.chunk_index == self.world.chunks:
                return
            if self.credits <= 0:
                self.wake.clear()
                await self.wake.wait()
                continue
            await self.chunk()
            await asyncio.sleep(period)

    async def chunk(self) -> None:
        w = self.world
        index = self.chunk_index
        self.chunk_index += 1
        units, kinds = [], []
        idr_given = False
        for _ in range(w.frames_per_chunk):
            self.x = int(np.clip(self.x + STEP * (("d" in self.held) - ("a" in self.held)), 0, w.width - 16))
            self.y = int(np.clip(self.y + STEP * (("s" in self.held) - ("w" in self.held)), 0, w.height - 16))
            rgb = render(w.height, w.width, self.frame, self.x, self.y)
            self.frame += 1
            if self.format != "h264":
                units.append(jpeg(rgb))
                continue
            fresh = self.encoder is None
            if fresh:
                self.encoder = Encoder(w.height, w.width, w.fps, self.bitrate, self.profile)
            # At most one IDR a chunk: a request met by this chunk's IDR waits for the next.
            idr = fresh or (self.keyframe_asked and not idr_given)
            if idr:
                self.keyframe_asked = False
                idr_given = True
            unit = self.encoder.encode(rgb, idr and not fresh)
            if index in w.corrupt_chunks and not units:
                unit = CORRUPT_IDR
            units.append(unit)
            kinds.append("key" if is_idr(unit) else "delta")
        self.record.positions.append((self.x, self.y))
        if index in w.drop_chunks:
            return
        self.credits -= 1
        applied, self.applied = self.applied, []
        header = {"type": "chunk", "session_id": self.id, "request_id": f"r{index}", "chunk_index": index,
                  "applied_event_ids": applied, "frames": len(units), "format": self.format,
                  "height": w.height, "width": w.width, "tick_ms": 1.0}
        self.record.sent.append((index, kinds))
        await self.send(header, *units)


def build_app(world: FakeWorld, log: WorldLog) -> Starlette:
    """The page (/, /web), GET /v1/models, /healthz and WS /v1/realtime/world, recording into ``log``."""

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": MODEL, "name": MODEL, "kind": "world", "available": True, "uses_prompts": False,
             "height": world.height, "width": world.width, "frames_per_chunk": world.frames_per_chunk}]})

    async def world_socket(ws: WebSocket) -> None:
        await ws.accept()
        session: Session | None = None
        producer: asyncio.Task[None] | None = None
        try:
            while True:
                msg = json.loads(await ws.receive_text())
                if msg["type"] == "session.create":
                    log.creates.append(msg)
                    fmt = msg.get("format", "jpeg")
                    if fmt == "h264" and not world.encoder:
                        await ws.send_text(json.dumps({"type": "error", "code": "format_unavailable",
                                                       "message": "this server has no H.264 encoder"}))
                        continue
                    session = Session(ws, world, log, msg)
                    created = {"type": "session.created", "session_id": session.id, "model": MODEL,
                               "height": world.height, "width": world.width,
                               "frames_per_chunk": world.frames_per_chunk, "fps": world.fps, "format": fmt,
                               "credits": session.credits}
                    if fmt == "h264":
                        created["codec"] = world.codec
                    await session.send(created)
                    producer = asyncio.create_task(session.produce())
                    continue
                if session is None:
                    continue
                reply = session.handle(msg)
                if reply is not None:
                    await session.send(reply)
                if session.closed:
                    session.wake.set()
                    session = None
        except WebSocketDisconnect:
            pass
        finally:
            if producer is not None:
                producer.cancel()

    return Starlette(routes=[
        Route("/", lambda request: FileResponse(WEB_DIR / "index.html")),
        Route("/healthz", lambda request: PlainTextResponse("OK")),
        Route("/v1/models", models),
        WebSocketRoute("/v1/realtime/world", world_socket),
        Mount("/web", app=StaticFiles(directory=WEB_DIR), name="web"),
    ])
