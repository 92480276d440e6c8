"""tts.v1 memory bounds through a real server and the real voice: a client that sends
``input.text`` as fast as it can and never reads is refused with ``buffer_full`` past
MAX_PENDING_TEXT_CHARS of unspoken text, and the session still works afterwards."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from protocols import tts_v1
from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve

tts_adapter = pytest.importorskip("models.tts.piper.adapter")

SENTENCE = "The quick brown fox jumps over the lazy dog near the riverbank. "
MESSAGE = (SENTENCE * (tts_v1.MAX_TEXT_CHARS // len(SENTENCE)))[: tts_v1.MAX_TEXT_CHARS]


@pytest.fixture(scope="module")
def addr():
    from models.tts.piper.availability import TTSUnavailable

    try:
        voice = tts_adapter.PiperTTS.load(device="cpu", max_batch=1)
    except TTSUnavailable as exc:
        pytest.skip(f"TTS extra not installed: {exc}")
    inventory = Inventory()
    inventory.adapters[voice.name] = voice
    with serve(build_app(ServerConfig(world=WorldConfig(models=())), inventory)) as addr:
        yield addr


def test_a_flood_of_text_is_bounded_and_refused(addr):
    sent = 3 * tts_v1.MAX_PENDING_TEXT_CHARS // len(MESSAGE)

    async def main():
        ws = await websockets.connect(f"ws://{addr}/v1/realtime/tts", max_size=None)
        await ws.recv()  # session.updated
        for _ in range(sent):  # as fast as the socket takes them, reading nothing
            await ws.send(json.dumps({"type": "input.text", "text": MESSAGE}))
        await ws.send(json.dumps({"type": "response.cancel"}))
        refused = 0
        while True:
            msg = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(msg, bytes):
                continue
            data = json.loads(msg)
            if data["type"] == "error":
                assert data["code"] == tts_v1.BUFFER_FULL, data
                refused += 1
            if data["type"] == "response.cancelled":
                break
        # What was accepted is at most the bound (plus what the speaker took meanwhile,
        # one sentence at a time on CPU): most of three bounds' worth is refused.
        accepted = sent - refused
        assert accepted * len(MESSAGE) <= tts_v1.MAX_PENDING_TEXT_CHARS + 8 * len(MESSAGE), (accepted, refused)
        assert refused >= sent // 2
        # The session still speaks.
        await ws.send(json.dumps({"type": "input.text", "text": "Hello there."}))
        await ws.send(json.dumps({"type": "input.done"}))
        audio = 0
        while True:
            msg = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(msg, bytes):
                audio += len(msg)
            elif json.loads(msg)["type"] == "response.done":
                break
        assert audio > 0
        await ws.close()

    asyncio.run(asyncio.wait_for(main(), 120))


def test_endless_utterance_ends_are_bounded(addr):
    async def main():
        ws = await websockets.connect(f"ws://{addr}/v1/realtime/tts", max_size=None)
        await ws.recv()
        await ws.send(json.dumps({"type": "input.text", "text": SENTENCE * 8}))
        for _ in range(tts_v1.MAX_PENDING_ITEMS + 200):
            await ws.send(json.dumps({"type": "input.done"}))
        await ws.send(json.dumps({"type": "response.cancel"}))
        codes = []
        while True:
            msg = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(msg, str):
                data = json.loads(msg)
                if data["type"] == "error":
                    codes.append(data["code"])
                if data["type"] == "response.cancelled":
                    break
        assert codes and set(codes) == {tts_v1.BUFFER_FULL}
        await ws.close()

    asyncio.run(asyncio.wait_for(main(), 120))
