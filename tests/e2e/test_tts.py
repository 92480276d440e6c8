"""tts.v1 end to end: the real joe voice behind a real uvicorn server and WebSocket clients."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import websockets

from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve

tts_adapter = pytest.importorskip("models.tts.piper.adapter")

LONG = ("The quick brown fox jumps over the lazy dog near the riverbank. " * 6).strip()


@pytest.fixture(scope="module")
def voice():
    from models.tts.piper.availability import TTSUnavailable

    try:
        return tts_adapter.PiperTTS.load(device="cpu", max_batch=8)
    except TTSUnavailable as exc:
        pytest.skip(f"TTS extra not installed: {exc}")


@pytest.fixture(scope="module")
def server(voice):
    inventory = Inventory()
    inventory.adapters[voice.name] = voice
    app = build_app(ServerConfig(world=WorldConfig(models=())), inventory)
    with serve(app) as addr:
        yield addr, app


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


async def connect(addr: str):
    ws = await websockets.connect(f"ws://{addr}/v1/realtime/tts", max_size=None)
    first = json.loads(await ws.recv())
    assert first["type"] == "session.updated"
    return ws, first


async def collect(ws, until: str = "response.done"):
    """Messages and PCM bytes until a message of type ``until``."""
    messages, audio = [], bytearray()
    while True:
        msg = await ws.recv()
        if isinstance(msg, bytes):
            audio += msg
            continue
        data = json.loads(msg)
        messages.append(data)
        if data["type"] == until:
            return messages, bytes(audio)


def test_streams_sentences_as_they_complete(server):
    addr, _ = server

    async def main():
        ws, first = await connect(addr)
        assert (first["voice"], first["sample_rate"], first["format"], first["voices"]) == (
            "en_US-joe-medium", 22050, "pcm16", ["en_US-joe-medium"])
        for piece in ["Hello there", ". How are", " you today? I am", " fine"]:
            await ws.send(json.dumps({"type": "input.text", "text": piece}))
        # The first sentence is spoken before the text is finished.
        start = json.loads(await ws.recv())
        assert start == {"type": "audio.start", "utterance_index": 0, "sentence_index": 0,
                         "text": "Hello there.", "sample_rate": 22050}
        await ws.send(json.dumps({"type": "input.done"}))
        messages, audio = await collect(ws)
        kinds = [m["type"] for m in messages]
        assert kinds == ["audio.done", "audio.start", "audio.done", "audio.start", "audio.done", "response.done"]
        texts = [m["text"] for m in messages if m["type"] == "audio.start"]
        assert texts == ["How are you today?", "I am fine"]
        done = [m for m in messages if m["type"] == "audio.done"]
        assert [m["sentence_index"] for m in done] == [0, 1, 2]
        assert sum(m["samples"] for m in done) * 2 == len(audio)
        assert messages[-1] == {"type": "response.done", "utterance_index": 0, "sentences": 3,
                                "samples": len(audio) // 2}
        pcm = np.frombuffer(audio, "<i2").astype(np.float32)
        assert len(pcm) > 22050  # over a second of speech
        assert np.sqrt(np.mean(pcm ** 2)) > 300  # not silence
        await ws.send(json.dumps({"type": "session.close"}))
        assert json.loads(await ws.recv()) == {"type": "session.closed"}
        await ws.close()

    run(main())


def test_resampled_to_24k_on_request(server):
    addr, _ = server

    async def main():
        ws, _ = await connect(addr)
        await ws.send(json.dumps({"type": "session.update", "sample_rate": 24000}))
        updated = json.loads(await ws.recv())
        assert updated["sample_rate"] == 24000
        await ws.send(json.dumps({"type": "input.text", "text": "Testing the higher rate."}))
        await ws.send(json.dumps({"type": "input.done"}))
        messages, audio = await collect(ws)
        assert messages[0]["sample_rate"] == 24000
        assert messages[-1]["samples"] * 2 == len(audio)
        await ws.close()

    run(main())


def test_bad_input_gets_an_error_and_the_session_stays_usable(server):
    addr, _ = server
    cases = [
        ("{not json", "bad_request"),
        (json.dumps({"type": "input.text", "text": ""}), "empty_text"),
        (json.dumps({"type": "input.text", "text": "x" * 5000}), "text_too_long"),
        (json.dumps({"type": "session.update", "voice": "nobody"}), "unknown_voice"),
        (json.dumps({"type": "session.update", "sample_rate": 16000}), "unsupported_rate"),
        (json.dumps({"type": "session.update", "format": "mp3"}), "unsupported_format"),
        (json.dumps({"type": "sing"}), "unknown_type"),
    ]

    async def main():
        ws, _ = await connect(addr)
        for raw, code in cases:
            await ws.send(raw)
            err = json.loads(await ws.recv())
            assert (err["type"], err["code"]) == ("error", code), raw
        await ws.send(b"\x00")
        assert json.loads(await ws.recv())["code"] == "bad_request"
        await ws.send(json.dumps({"type": "input.text", "text": "Still here."}))
        await ws.send(json.dumps({"type": "input.done"}))
        messages, audio = await collect(ws)
        assert messages[0]["sample_rate"] == 22050 and len(audio) > 0
        await ws.close()

    run(main())


def test_cancel_stops_audio_within_a_window(server):
    addr, _ = server

    async def main():
        ws, _ = await connect(addr)
        await ws.send(json.dumps({"type": "input.text", "text": LONG}))
        await ws.send(json.dumps({"type": "input.done"}))
        assert json.loads(await ws.recv())["type"] == "audio.start"
        first = await ws.recv()
        assert isinstance(first, bytes)
        await ws.send(json.dumps({"type": "response.cancel"}))
        after_cancel = 0
        while True:
            msg = await ws.recv()
            if isinstance(msg, bytes):
                after_cancel += 1
                continue
            data = json.loads(msg)
            if data["type"] == "response.cancelled":
                assert data["utterance_index"] == 0
                break
            assert data["type"] in ("audio.done", "audio.start")
        assert after_cancel <= 1  # the window already in flight, at most
        # Nothing of the cancelled utterance follows; a new one plays normally.
        await ws.send(json.dumps({"type": "input.text", "text": "Next one."}))
        await ws.send(json.dumps({"type": "input.done"}))
        messages, audio = await collect(ws)
        assert messages[0]["type"] == "audio.start" and messages[0]["utterance_index"] == 1
        assert messages[-1]["utterance_index"] == 1 and len(audio) > 0
        await ws.close()

    run(main())


def test_concurrent_sessions_share_decoder_batches(server):
    addr, app = server

    async def speak(text: str) -> bytes:
        ws, _ = await connect(addr)
        await ws.send(json.dumps({"type": "input.text", "text": text}))
        await ws.send(json.dumps({"type": "input.done"}))
        _, audio = await collect(ws)
        await ws.close()
        return audio

    async def main():
        return await asyncio.gather(*(speak(LONG) for _ in range(4)))

    before = dict(app.state.engine.stats.batch_sizes)
    audios = run(main())
    after = app.state.engine.stats.batch_sizes
    assert all(len(a) == len(audios[0]) for a in audios)
    assert any(size > 1 and after[size] > before.get(size, 0) for size in after)
