"""``WS /v1/realtime/tts``: streaming speech (tts.v1), one voice session per connection.

The reader parses client frames and feeds ``input.text`` into a sentence
segmenter; every complete sentence goes on a queue. One speaker task takes the
sentences in order and streams each one through the engine, one decoder window
at a time (``SynthesizeSentence``, then ``DecodeWindow`` until ``done``), so
windows of concurrent sessions meet in the engine and share a HiFi-GAN forward.

Barge-in (``response.cancel``): the utterance is marked cancelled, its queued
sentences are dropped, the voice state is released through the engine's control
lane (a queued window of it comes back cancelled), and ``response.cancelled`` is
sent only once the speaker has let go of the utterance, so no audio of it can
follow. At most one window is in flight per session, so audio stops within one
decoder window.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass

from starlette.websockets import WebSocket, WebSocketDisconnect

from models.base import EngineDeadError, ModelError
from models.tts.adapter import DecodeWindow, SynthesizeSentence
from models.tts.segmenter import SentenceSegmenter
from protocols import tts_v1 as wire
from realtime.engine import Engine, EngineStopped, TickCancelled

log = logging.getLogger(__name__)

_ids = itertools.count()


@dataclass(frozen=True)
class _Sentence:
    utterance_index: int
    sentence_index: int
    text: str


@dataclass(frozen=True)
class _UtteranceEnd:
    utterance_index: int
    sentences: int


class TTSConnection:
    def __init__(self, ws: WebSocket, model: str) -> None:
        self.ws = ws
        self.engine: Engine = ws.app.state.engine
        self.model = model
        self.adapter = self.engine.adapter(model)
        self.voices = tuple(self.adapter.voices)
        self.config = wire.SessionConfig(voice=self.voices[0])
        self.session_id = f"tts-{next(_ids)}"
        self.segmenter = SentenceSegmenter()
        self.utterance = 0
        self.sentence = 0  # next sentence index in the current utterance
        self.cancelled: set[int] = set()
        self.samples: dict[int, int] = {}  # utterance -> samples sent, for response.done
        self.current: int | None = None  # the utterance the speaker is speaking
        self.queue: asyncio.Queue[_Sentence | _UtteranceEnd] = asyncio.Queue()
        self.speaking = asyncio.Lock()  # held by the speaker for one sentence or utterance end
        self._send_lock = asyncio.Lock()
        self._open = True

    async def send(self, text: str) -> None:
        if not self._open:
            return
        try:
            async with self._send_lock:
                await self.ws.send_text(text)
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:
            # The client closed first (starlette's WebSocketDisconnected is a RuntimeError):
            # nobody is left to tell; the reader sees the disconnect and cleans up.
            self._open = False
            log.debug("session %s: send on a closed socket: %r", self.session_id, exc)

    async def send_audio(self, pcm: bytes) -> None:
        if not self._open:
            return
        try:
            async with self._send_lock:
                await self.ws.send_bytes(pcm)
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:
            self._open = False  # as in send(): the reader cleans up
            log.debug("session %s: audio on a closed socket: %r", self.session_id, exc)

    async def error(self, code: str, message: str) -> None:
        log.info("session %s: error %s: %s", self.session_id, code, message)
        await self.send(wire.error(code, message))

    async def run(self) -> None:
        speaker = asyncio.create_task(self._speak())
        await self.send(wire.encode(self.config.updated(self.voices)))
        log.info("session %s: tts session opened on %s", self.session_id, self.model)
        try:
            while True:
                msg = await self.ws.receive()
                if msg["type"] == "websocket.disconnect":
                    break
                raw = msg.get("text") if msg.get("text") is not None else msg.get("bytes")
                try:
                    parsed = wire.parse_client(raw, self.voices)
                except wire.ProtocolError as exc:
                    await self.error(exc.code, exc.message)
                    continue
                if isinstance(parsed, wire.SessionClose):
                    await self._cancel(notify=False)
                    await self.send(wire.encode(wire.SessionClosed()))
                    break
                await self.handle(parsed)
        except WebSocketDisconnect:
            pass
        finally:
            self._open = False
            speaker.cancel()
            try:
                await self.engine.control(self.engine.release_session(self.model, self.session_id))
            except (EngineStopped, EngineDeadError):
                pass
            log.info("session %s: tts session closed", self.session_id)
            if self.ws.client_state.name == "CONNECTED":
                try:
                    await self.ws.close()
                except (WebSocketDisconnect, RuntimeError, OSError):
                    pass  # the client closed first (e.g. right after session.close)

    async def handle(self, msg: wire.ClientMessage) -> None:
        if isinstance(msg, wire.SessionUpdate):
            self.config = self.config.apply(msg)
            await self.send(wire.encode(self.config.updated(self.voices)))
        elif isinstance(msg, wire.InputText):
            self._enqueue(self.segmenter.push(msg.text))
        elif isinstance(msg, wire.InputDone):
            self._enqueue(self.segmenter.flush())
            self.queue.put_nowait(_UtteranceEnd(self.utterance, self.sentence))
            self.utterance += 1
            self.sentence = 0
        elif isinstance(msg, wire.ResponseCancel):
            await self._cancel(notify=True)

    def _enqueue(self, sentences: list[str]) -> None:
        for text in sentences:
            self.queue.put_nowait(_Sentence(self.utterance, self.sentence, text))
            self.sentence += 1

    async def _cancel(self, *, notify: bool) -> None:
        """Barge-in: stop the utterance being spoken and everything queued or buffered."""
        cancelled = {item.utterance_index for item in _drain(self.queue)}
        if self.current is not None:
            cancelled.add(self.current)
        open_utterance = self.sentence > 0 or bool(self.segmenter.buffered.strip())
        if open_utterance or not cancelled:
            cancelled.add(self.utterance)
        self.cancelled.update(cancelled)
        self.segmenter.clear()
        try:
            await self.engine.control(self.engine.release_session(self.model, self.session_id))
        except (EngineStopped, EngineDeadError):
            pass
        async with self.speaking:  # the speaker has let go of the cancelled audio
            pass
        if notify:
            for index in sorted(cancelled):
                await self.send(wire.encode(wire.ResponseCancelled(index)))
        if self.utterance in cancelled:
            # Text after a barge-in starts a new utterance.
            self.utterance += 1
            self.sentence = 0

    async def _speak(self) -> None:
        while True:
            item = await self.queue.get()
            async with self.speaking:
                if item.utterance_index in self.cancelled:
                    continue
                if isinstance(item, _UtteranceEnd):
                    samples = self.samples.pop(item.utterance_index, 0)
                    await self.send(wire.encode(wire.ResponseDone(item.utterance_index, item.sentences, samples)))
                    continue
                self.current = item.utterance_index
                try:
                    await self._speak_sentence(item)
                except Exception as exc:  # noqa: BLE001 - a bug: input is validated on arrival
                    # The speaker must outlive it: the client hears of this sentence and
                    # every later one is still spoken.
                    log.exception("session %s: sentence %d.%d failed", self.session_id, item.utterance_index,
                                  item.sentence_index)
                    await self.error(wire.INTERNAL_ERROR, f"synthesis failed: {type(exc).__name__}")
                finally:
                    self.current = None

    async def _speak_sentence(self, item: _Sentence) -> None:
        config = self.config
        utt, k = item.utterance_index, item.sentence_index
        await self.send(wire.encode(wire.AudioStart(utt, k, item.text, config.sample_rate)))
        work = SynthesizeSentence(self.session_id, utt, k, item.text, config.speed, config.sample_rate)
        samples = 0
        while True:
            try:
                chunk = await self.engine.submit(self.model, work, session_id=self.session_id)
            except TickCancelled:
                return
            except (ModelError, EngineDeadError, EngineStopped) as exc:
                await self.error(wire.INTERNAL_ERROR, f"synthesis failed: {exc}")
                return
            if utt in self.cancelled or chunk.stale:
                return
            if chunk.samples:
                await self.send_audio(chunk.pcm)
            samples = chunk.sentence_samples
            if chunk.done:
                break
            work = DecodeWindow(self.session_id, utt, k)
        self.samples[utt] = self.samples.get(utt, 0) + samples
        await self.send(wire.encode(wire.AudioDone(utt, k, samples)))


def _drain(queue: asyncio.Queue) -> list:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


async def tts_endpoint(ws: WebSocket) -> None:
    names = ws.app.state.inventory.names("tts")
    await ws.accept()
    if not names:
        reasons = [m["reason"] for m in ws.app.state.inventory.unavailable.values() if m["kind"] == "tts"]
        await ws.send_text(wire.error(wire.TTS_UNAVAILABLE, "TTS is unavailable: " + ("; ".join(reasons) or
                                      "no voice loaded") + ". Install it with pip install 'realtime-sessions[tts]'"))
        await ws.close(1011)
        return
    await TTSConnection(ws, names[0]).run()
