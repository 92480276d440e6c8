"""A Python client for world.v1 sessions (asyncio + websockets).

Use it from code::

    async with WorldClient.connect("ws://127.0.0.1:8000/v1/realtime/world", session_id="w1") as client:
        created = await client.create(credits=4)   # the session_id given to connect
        await client.hold_keys(["w"])          # keys.v1 state event
        chunk = await client.next_chunk()      # header dict + decoded frames
        await client.credit(1)

or from a shell: ``python -m clients.world --keys w --chunks 30 --out last.png``, or as video:
``python -m clients.world --format h264 --out run.mp4`` (clients/h264.py: the access units
muxed into an MP4 as the server encoded them).

``connect(url, session_id=...)`` puts the id in the URL's query too (``?session_id=``,
protocols/routing.py), so a proxy in front of several replicas (deploy/) sends every
connection of the session to the same one; the server itself ignores the query.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import websockets

from clients.cli_args import DEFAULT_HOST, DEFAULT_PORT, add_server_options, count, fresh_id, server_url
from clients.h264 import H264Recording, pyav_missing
from protocols import world_v1 as wire
from protocols.routing import with_session_id

PATH = "/v1/realtime/world"
# The formats the command line offers (world.v1's, less rgb8, which no file here takes).
CLI_FORMATS = ("png", "jpeg", "h264")
DEFAULT_URL = f"ws://{DEFAULT_HOST}:{DEFAULT_PORT}{PATH}"


class ServerError(Exception):
    """An ``error`` message from the server."""

    def __init__(self, msg: dict[str, Any]) -> None:
        super().__init__(f"{msg.get('code')}: {msg.get('message')}")
        self.code = msg.get("code")
        self.message = msg.get("message")
        self.event_id = msg.get("event_id")
        self.raw = msg


@dataclass
class Chunk:
    header: dict[str, Any]
    payloads: list[bytes] = field(repr=False)

    @property
    def chunk_index(self) -> int:
        return self.header["chunk_index"]

    @property
    def applied_event_ids(self) -> list[int]:
        return self.header["applied_event_ids"]

    def frames(self) -> list[np.ndarray]:
        """Decode the payloads to ``[H, W, 3]`` uint8 arrays (not ``h264``: its frames only
        decode as a stream, clients/h264.py's ``H264Recording``)."""
        h, w, fmt = self.header["height"], self.header["width"], self.header["format"]
        if fmt == "h264":
            raise ValueError("h264 frames decode as a stream, not chunk by chunk: use clients.h264.H264Recording")
        if fmt == "rgb8":
            return [np.frombuffer(p, np.uint8).reshape(h, w, 3) for p in self.payloads]
        from PIL import Image  # jpeg/png decoding only

        return [np.asarray(Image.open(io.BytesIO(p)).convert("RGB")) for p in self.payloads]


class WorldClient:
    """One world session over one WebSocket. Messages other than chunks are queued
    on ``messages``; chunks on ``chunks``; errors raise where they are awaited."""

    def __init__(self, ws: Any, session_id: str | None = None) -> None:
        self.ws = ws
        self.session_id = session_id  # the one in the URL, create's default
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.chunks: asyncio.Queue[Chunk] = asyncio.Queue()
        self.errors: list[dict[str, Any]] = []
        self._next_event_id = 0
        self._reader = asyncio.create_task(self._read())

    @classmethod
    def connect(cls, url: str = DEFAULT_URL, session_id: str | None = None, **kwargs: Any) -> "_Connector":
        """Open a socket; with ``session_id`` the URL carries it (``?session_id=``) for the
        proxy's routing and ``create`` uses it by default."""
        return _Connector(url, session_id, kwargs)

    async def _read(self) -> None:
        # Frames of chunks not committed yet (stream_frames), by request_id.
        provisional: dict[str, list[bytes]] = {}
        try:
            while True:
                msg = await self.ws.recv()
                if isinstance(msg, bytes):
                    raise RuntimeError("binary frame outside a chunk")
                data = json.loads(msg)
                kind = data.get("type")
                if kind == "chunk.frames":
                    part = [await self.ws.recv() for _ in range(data["frames"])]
                    provisional.setdefault(data["request_id"], []).extend(part)
                elif kind == "chunk":
                    payloads = [await self.ws.recv() for _ in range(data["frames"])]
                    if "streamed" in data:
                        payloads = provisional.pop(data["request_id"], [])
                    await self.chunks.put(Chunk(data, payloads))
                else:
                    if kind == "error":
                        self.errors.append(data)
                        provisional.clear()   # a failed tick's frames are not a chunk
                    await self.messages.put(data)
        except websockets.ConnectionClosed:
            pass

    async def send(self, msg: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(msg))

    async def expect(self, *types: str, timeout: float = 30.0) -> dict[str, Any]:
        """The next non-chunk message; raises ServerError for an unexpected error."""
        async with asyncio.timeout(timeout):  # not wait_for: on 3.11 it can swallow a cancellation
            msg = await self.messages.get()
        if msg["type"] == "error" and "error" not in types:
            raise ServerError(msg)
        if types and msg["type"] not in types:
            raise AssertionError(f"expected {types}, got {msg}")
        return msg

    async def create(self, session_id: str | None = None, *, image: bytes | None = None,
                     image_format: str = "png", **options: Any) -> dict[str, Any]:
        """``session.create``; ``image``: the encoded first image (``image_format`` png or
        jpeg), sent as the binary message that follows the create."""
        session_id = session_id if session_id is not None else self.session_id
        if session_id is None:
            raise ValueError("no session_id: pass one here or to connect()")
        spec = wire.ImageSpec(image_format, len(image)) if image is not None else None
        await self.send(wire.CreateRequest(session_id, image=spec, **options).to_wire())
        if image is not None:
            await self.ws.send(image)
        return await self.expect("session.created")

    async def event(self, *, event_id: int | None = None, prompt: str | None = None,
                    controls: Sequence[wire.Control | Mapping[str, Any]] = ()) -> dict[str, Any]:
        """Send an ``event`` (controls as ``wire.Control`` or as their wire objects) and
        wait for its ``event.accepted``."""
        controls = [c if isinstance(c, wire.Control) else wire.Control(c["track"], c["schema"], c["data"])
                    for c in controls]
        if event_id is None:
            event_id = self._next_event_id
        self._next_event_id = max(self._next_event_id, event_id + 1)
        await self.send(wire.Event(event_id, prompt, tuple(controls)).to_wire())
        return await self.expect("event.accepted")

    async def hold_keys(self, keys: Sequence[str], **kw: Any) -> dict[str, Any]:
        control = wire.keys_control({"mode": "state", "held": list(keys)})
        return await self.event(controls=[control], **kw)

    async def script_keys(self, frames: Sequence[Sequence[str]], **kw: Any) -> dict[str, Any]:
        control = wire.keys_control({"mode": "script", "frames": [list(f) for f in frames]})
        return await self.event(controls=[control], **kw)

    async def credit(self, chunks: int = 1) -> None:
        await self.send(wire.Credit(chunks).to_wire())

    async def keyframe(self) -> None:
        """Ask an ``h264`` session for an IDR at its next frame (at most one a chunk)."""
        await self.send({"type": "keyframe"})

    async def next_chunk(self, timeout: float = 30.0, *, credit: bool = True) -> Chunk:
        async with asyncio.timeout(timeout):
            chunk = await self.chunks.get()
        if credit:
            await self.credit(1)
        return chunk

    async def reset(self) -> dict[str, Any]:
        await self.send(wire.Reset().to_wire())
        return await self.expect("session.reset")

    async def close(self) -> dict[str, Any]:
        await self.send(wire.Close().to_wire())
        return await self.expect("session.closed")


class _Connector:
    def __init__(self, url: str, session_id: str | None, kwargs: dict[str, Any]) -> None:
        self.url = with_session_id(url, session_id) if session_id is not None else url
        self.session_id, self.kwargs, self.client = session_id, kwargs, None

    async def __aenter__(self) -> WorldClient:
        ws = await websockets.connect(self.url, max_size=None, **self.kwargs)
        self.client = WorldClient(ws, self.session_id)
        return self.client

    async def __aexit__(self, *exc: Any) -> None:
        assert self.client is not None
        self.client._reader.cancel()
        await self.client.ws.close()


def _create_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {"credits": 4, "format": args.format}
    if args.model:
        options["model"] = args.model
    # Sent only when given: the server's defaults (2500 kbps, baseline) otherwise.
    if args.bitrate_kbps is not None:
        options["bitrate_kbps"] = args.bitrate_kbps
    if args.profile is not None:
        options["profile"] = args.profile
    return options


async def _main(args: argparse.Namespace) -> None:
    async with WorldClient.connect(args.url, session_id=args.session) as client:
        created = await client.create(**_create_options(args))
        print(json.dumps(created))
        video = H264Recording(created["fps"]) if created["format"] == "h264" else None
        if args.keys:
            await client.hold_keys(list(args.keys))
        started = time.perf_counter()
        last = None
        for _ in range(args.chunks):
            last = await client.next_chunk()
            if video is not None:
                for unit in last.payloads:
                    video.add(unit)
        elapsed = time.perf_counter() - started
        frames = args.chunks * created["frames_per_chunk"]
        print(f"{frames} frames in {elapsed:.2f} s: {frames / elapsed:.1f} frames/s; last chunk {last.header}")
        await client.close()
    if args.out and last is not None:
        _write(args.out, last, video)


def _write(out: str, last: Chunk, video: H264Recording | None) -> None:
    """``out``: an MP4 of the whole h264 stream, or the last frame as an image."""
    if out.lower().endswith(".mp4"):
        assert video is not None  # main() refuses .mp4 without h264
        written = video.write_mp4(out)
        print(f"wrote {out}: {written} frames of H.264, as received")
        return
    from PIL import Image

    picture = video.last_frame() if video is not None else last.frames()[-1]
    Image.fromarray(picture).resize((256, 256), Image.NEAREST).save(out)
    print(f"wrote {out}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clients.world",
        description="Play one world.v1 session from the terminal: hold keys for a number of "
                    "chunks, print the frame rate and optionally save the last frame.",
        epilog="examples: python -m clients.world --keys wj --chunks 60 --out last.png; "
               "python -m clients.world --format h264 --out run.mp4")
    add_server_options(parser, PATH)
    parser.add_argument("--session", default=None,
                        help="session id to create; must not be in use on the server (default: a fresh cli-XXXXXXXX)")
    parser.add_argument("--model", default=None,
                        help="world model to run (see GET /v1/models); default: the server's first")
    parser.add_argument("--keys", default="w",
                        help="keys to hold, one letter each: w a s d move, i j k l look; '' for none "
                             "(default: %(default)s)")
    parser.add_argument("--chunks", type=count, default=30,
                        help="how many chunks to play; a chunk is one tick of the server's frames_per_chunk "
                             "frames (default: %(default)s)")
    parser.add_argument("--format", choices=CLI_FORMATS, default="png",
                        help="how the server sends frames: png or jpeg images, or h264, one H.264 stream "
                             "(needs PyAV here, the video extra, and a server with an encoder) "
                             "(default: %(default)s)")
    parser.add_argument("--bitrate-kbps", type=int, default=None,
                        help="h264: the stream's bitrate in kbit/s, 100..20000 (default: the server's, 2500)")
    parser.add_argument("--profile", choices=("baseline", "main"), default=None,
                        help="h264: the H.264 profile (default: the server's, baseline)")
    parser.add_argument("--out", default=None,
                        help="write the last frame to this path (an image, e.g. last.png), or with --format "
                             "h264 and a .mp4 path the whole stream as a playable MP4, muxed without re-encoding")
    args = parser.parse_args(argv)
    if args.format != "h264" and (args.bitrate_kbps is not None or args.profile is not None):
        parser.error("--bitrate-kbps and --profile go with --format h264")
    if args.out and args.out.lower().endswith(".mp4") and args.format != "h264":
        parser.error("--out *.mp4 needs --format h264 (the MP4 holds the server's H.264 stream)")
    if args.format == "h264" and args.out and (missing := pyav_missing()):
        parser.error(missing)
    args.url = server_url(args, PATH)
    args.session = args.session or fresh_id("cli")
    try:
        asyncio.run(_main(args))
    except ServerError as exc:
        print(f"server error: {exc}", file=sys.stderr)
        return 1
    except (OSError, websockets.InvalidURI, websockets.InvalidHandshake, websockets.ConnectionClosed,
            asyncio.TimeoutError) as exc:
        print(f"cannot talk to {args.url}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
