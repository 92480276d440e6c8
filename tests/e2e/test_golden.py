"""Golden transcripts: what clients see on the wire, recorded once and compared after.

Each scenario drives a real server through a real WebSocket client, one step at a
time (a step waits for a known number of server frames, so the order is fixed),
and writes down every server frame: text frames as parsed JSON, binary frames as
their length and sha256 (msgpack frames of OpenPI are decoded to show their
structure), and the close code the server sent.

Normalised, because they vary from run to run by nature (and only these):

* world ``chunk.tick_ms`` -> ``"<ms>"`` (wall time of a tick);
* OpenPI ``server_timing.*`` and ``policy_timing.*`` floats -> ``"<ms>"``;
* nothing else: session ids, request ids, frames and PCM are deterministic
  (tiny world weights from seed 0, TTS noise from seed 0, one torch thread).

What a model computes (world frames, PCM, OpenPI action arrays) is deterministic on one
machine but not across CPUs: float kernels differ by instruction set and round
differently, so a frame or a PCM chunk can change in its last bits. Those payloads are
written down as their length (exact) and an ``approx`` summary of their values
(``_summary``: mean and standard deviation of the decoded pixels or samples, or the
action values themselves) that ``same`` compares within ``APPROX`` of each value's
scale; everything else, including every byte count, must be equal.

Re-record after an intended wire change with ``GOLDEN_RECORD=1`` and say why in
the commit message; the files are in ``tests/e2e/golden/``.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import torch
import websockets
import websockets.sync.client

from models.policy.flow import FlowMatchingPolicy, FlowPolicyConfig
from models.world.tiny import TinyWorld
from realtime.server.app import build_app
from realtime.server.config import PolicyConfig, ServerConfig, TTSConfig, WorldConfig
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve

GOLDEN = Path(__file__).parent / "golden"
RECORD = os.environ.get("GOLDEN_RECORD") == "1"
KEYS = {"track": "keys", "schema": "keys.v1"}


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Intra-op threads can change float sums; one thread keeps frames and PCM exact."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


APPROX = 0.005  # relative to max(1, |value|): a few pixels or samples rounded the other way move less


def same(got: Any, want: Any) -> bool:
    """Equal, except that ``approx`` lists agree within ``APPROX`` (see the module docstring)."""
    if isinstance(got, dict) and isinstance(want, dict):
        if got.keys() != want.keys():
            return False
        return all(_close(got[k], want[k]) if k == "approx" else same(got[k], want[k]) for k in got)
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))
    return got == want and type(got) is type(want)


def _close(got: Any, want: Any) -> bool:
    a, b = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return a.shape == b.shape and bool((np.abs(a - b) <= APPROX * np.maximum(1.0, np.abs(b))).all())


def check(name: str, transcript: list[Any]) -> None:
    path = GOLDEN / f"{name}.json"
    text = json.dumps(transcript, indent=1, sort_keys=False) + "\n"
    if RECORD:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    expected = json.loads(path.read_text())
    assert same(json.loads(text), expected), f"{name}: the wire changed; diff against {path}"


def _digest(data: bytes) -> dict[str, Any]:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _summary(values: np.ndarray) -> dict[str, Any]:
    v = values.astype(np.float64)
    return {"bytes": int(values.nbytes), "approx": [round(float(v.mean()), 3), round(float(v.std()), 3)]}


def _payload(data: bytes, kind: str) -> dict[str, Any]:
    """A model's binary output: ``rgb8`` frames, ``png`` / ``jpeg`` images, ``pcm16`` audio."""
    if kind == "rgb8":
        values = np.frombuffer(data, np.uint8)
    elif kind == "pcm16":
        values = np.frombuffer(data, "<i2")
    else:
        from PIL import Image

        values = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    # Compressed images change length with their pixels; the decoded size is what is exact.
    return {**_summary(values), **({"encoded": kind} if kind in ("png", "jpeg") else {})}


# ------------------------------------------------------------------------------- world
class _Recorder:
    def __init__(self, ws: Any, binary: str) -> None:
        self.ws, self.log, self.binary = ws, [], binary   # binary: what the server's binary frames hold

    async def step(self, msg: Any, frames: int) -> None:
        """Send ``msg`` (a dict, raw text or bytes) and record the next ``frames`` server frames."""
        if msg is not None:
            await self.ws.send(json.dumps(msg) if isinstance(msg, dict) else msg)
        for _ in range(frames):
            self.log.append(self._frame(await asyncio.wait_for(self.ws.recv(), 60)))

    def _frame(self, raw: Any) -> Any:
        if isinstance(raw, bytes):
            return _payload(raw, self.binary)
        data = json.loads(raw)
        if data.get("type") == "chunk":
            data["tick_ms"] = "<ms>"
        return data

    async def closed(self) -> None:
        try:
            extra = await asyncio.wait_for(self.ws.recv(), 10)
            self.log.append({"unexpected": self._frame(extra)})
        except websockets.ConnectionClosed:
            pass
        self.log.append({"close": self.ws.close_code})


def _world_app():
    inventory = Inventory()
    model = TinyWorld(max_batch=8)
    inventory.adapters[model.name] = model
    config = ServerConfig(world=WorldConfig(models=("tiny",)), policy=PolicyConfig(policy=""),
                          tts=TTSConfig(enabled=False))
    return build_app(config, inventory)


async def _world_session(addr: str) -> list[Any]:
    async with websockets.connect(f"ws://{addr}/v1/realtime/world", max_size=None) as ws:
        r = _Recorder(ws, "rgb8")
        await r.step({"type": "event", "event_id": 1}, 1)  # no session yet
        await r.step({"type": "session.create", "session_id": "g1", "credits": 0, "format": "rgb8", "seed": 3}, 1)
        await r.step({"type": "event", "event_id": 1, "prompt": "a corridor",
                      "controls": [{**KEYS, "data": {"mode": "state", "held": ["w"]}}]}, 1)
        await r.step({"type": "event", "event_id": 1}, 1)  # duplicate
        await r.step({"type": "credit", "chunks": 1}, 2)  # chunk + one frame
        await r.step({"type": "event", "event_id": 3,
                      "controls": [{**KEYS, "data": {"mode": "script", "frames": [["j"]]}}]}, 1)
        await r.step({"type": "credit", "chunks": 2}, 4)
        await r.step({"type": "event", "event_id": 2}, 1)  # stale
        await r.step("not json", 1)
        await r.step({"type": "nope"}, 1)
        await r.step({"type": "credit", "chunks": 0}, 1)
        await r.step({"type": "session.create", "session_id": "again"}, 1)  # one per connection
        await r.step({"type": "event", "event_id": 9,
                      "controls": [{**KEYS, "data": {"mode": "state", "held": ["q"]}}]}, 1)  # bad key
        await r.step({"type": "session.reset"}, 1)
        await r.step({"type": "event", "event_id": 10,
                      "controls": [{**KEYS, "data": {"mode": "state", "held": ["l"]}}]}, 1)
        await r.step({"type": "credit", "chunks": 1}, 2)
        await r.step({"type": "event", "event_id": 11, "prompt": "pending"}, 1)
        await r.step({"type": "session.close"}, 1)
        await r.step({"type": "credit", "chunks": 1}, 1)  # after close: no session
        await r.step(b"\x00binary", 1)  # refused with 1003
        await r.closed()
        return r.log


async def _world_formats(addr: str) -> list[Any]:
    log = []
    for fmt in ("png", "jpeg"):
        async with websockets.connect(f"ws://{addr}/v1/realtime/world", max_size=None) as ws:
            r = _Recorder(ws, fmt)
            await r.step({"type": "session.create", "session_id": f"f-{fmt}", "credits": 2, "format": fmt,
                          "seed": 5}, 5)
            await r.step({"type": "session.close"}, 1)
            log += r.log
    return log


def test_world_transcript():
    with serve(_world_app()) as addr:
        check("world_session", asyncio.run(_world_session(addr)))
        check("world_formats", asyncio.run(_world_formats(addr)))


# --------------------------------------------------------------------------------- tts
async def _tts_session(addr: str) -> list[Any]:
    async with websockets.connect(f"ws://{addr}/v1/realtime/tts", max_size=None) as ws:
        r = _Recorder(ws, "pcm16")
        await r.step(None, 1)  # session.updated
        await r.step({"type": "session.update", "speed": 9}, 1)  # out of range
        await r.step({"type": "session.update", "sample_rate": 8000}, 1)
        await r.step({"type": "bogus"}, 1)
        await r.step({"type": "session.update", "speed": 1.25, "sample_rate": 24000}, 1)
        await ws.send(json.dumps({"type": "input.text", "text": "Hello there. "}))
        await ws.send(json.dumps({"type": "input.text", "text": "Bye"}))
        await ws.send(json.dumps({"type": "input.done"}))
        # Read until response.done: audio.start, PCM frames, audio.done per sentence.
        while not (r.log and isinstance(r.log[-1], dict) and r.log[-1].get("type") == "response.done"):
            await r.step(None, 1)
        await r.step({"type": "session.close"}, 1)
        await r.closed()
        return r.log


def test_tts_transcript():
    tts_adapter = pytest.importorskip("models.tts.piper.adapter")
    from models.tts.piper.availability import TTSUnavailable

    try:
        # float32 products whatever the CPU: the transcript records the audio's length.
        voice = tts_adapter.PiperTTS.load(device="cpu", max_batch=4, products=torch.float32)
    except TTSUnavailable as exc:
        pytest.skip(f"TTS extra not installed: {exc}")
    inventory = Inventory()
    inventory.adapters[voice.name] = voice
    app = build_app(ServerConfig(world=WorldConfig(models=())), inventory)
    with serve(app) as addr:
        check("tts_session", asyncio.run(_tts_session(addr)))


# ------------------------------------------------------------------------------ openpi
SMALL = FlowPolicyConfig(
    action_horizon=4, action_dim=3, image_keys=("cam",), image_resolution=(32, 32), state_dim=2,
    d_model=32, num_heads=2, num_layers=1, num_inference_steps=2, max_batch=4,
)


def _structure(value: Any, key: str = "") -> Any:
    """A decoded msgpack frame with bytes as digests, arrays' data as their values (``approx``)
    and timing floats as ``<ms>``."""
    if isinstance(value, dict) and value.get(b"__ndarray__") is True:
        array = np.frombuffer(value[b"data"], np.dtype(value[b"dtype"])).reshape(value[b"shape"])
        data = {"bytes": len(value[b"data"]), "approx": np.round(array.astype(np.float64), 4).ravel().tolist()}
        return [[_structure(k), data if k == b"data" else _structure(v)] for k, v in value.items()]
    if isinstance(value, dict):
        return [[_structure(k), _structure(v, k if isinstance(k, str) else "")] for k, v in value.items()]
    if isinstance(value, list):
        return [_structure(v, key) for v in value]
    if isinstance(value, bytes):
        return _digest(value)
    if isinstance(value, float) and key.endswith("_ms"):
        return "<ms>"
    return value


def _obs(seed: int) -> bytes:
    from openpi_client import msgpack_numpy

    rng = np.random.default_rng(seed)
    obs = {"cam": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
           "state": rng.standard_normal(2).astype(np.float32), "prompt": "pick", "session_id": "robot-1"}
    return msgpack_numpy.packb(obs)


def _openpi_session(addr: str, path: str) -> list[Any]:
    log: list[Any] = []

    def frame(raw: Any) -> Any:
        if isinstance(raw, str):
            return {"text": raw}
        return {"msgpack": _structure(msgpack.unpackb(raw, raw=False, strict_map_key=False))}

    with websockets.sync.client.connect(f"ws://{addr}{path}", compression=None, max_size=None) as ws:
        log.append(frame(ws.recv(timeout=30)))
        for seed in (0, 1):
            ws.send(_obs(seed))
            log.append(frame(ws.recv(timeout=30)))
        ws.send(msgpack.packb({"endpoint": "reset", "session_id": "robot-1"}))
        log.append(frame(ws.recv(timeout=30)))
        ws.send(b"\xc1garbage")
        log.append(frame(ws.recv(timeout=30)))
        try:
            log.append({"unexpected": frame(ws.recv(timeout=10))})
        except websockets.ConnectionClosed:
            pass
        log.append({"close": ws.close_code})
    return log


def test_openpi_transcript():
    torch.manual_seed(0)
    policy = FlowMatchingPolicy(SMALL)
    inventory = Inventory()
    inventory.adapters[policy.name] = policy
    config = ServerConfig(world=WorldConfig(models=()), policy=PolicyConfig(policy=""), tts=TTSConfig(enabled=False))
    with serve(build_app(config, inventory)) as addr:
        check("openpi_session", _openpi_session(addr, "/v1/realtime/robot/openpi"))
