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

Drain (SIGTERM, ``drain``): the utterance being spoken finishes as far as its text has
come (its queued sentences are spoken; ``response.done`` if its ``input.done`` came), every
other utterance (queued after it, or text not yet flushed) is reported
``response.cancelled``, every message but ``session.close`` is answered ``going_away``,
and the socket closes with 1001.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from starlette.websockets import WebSocket

from models.tts.base import DecodeWindow, SynthesizeSentence, TTSAdapter
from protocols import tts_v1 as wire
from protocols.close_codes import CLOSE_INTERNAL
from realtime.endpoints.connection import Received
from realtime.endpoints.lifecycle import (
    ENGINE_ERRORS,
    Failure,
    Goodbye,
    SessionEndpoint,
    Why,
    engine_failure,
)
from sessions.registry import SessionRecord, new_session_id
from realtime.endpoints.tts_queue import Drained, Sentence, UtteranceEnd, first_of, plan_drain, take_all

log = logging.getLogger(__name__)

KIND = "tts"


class TTSEndpoint(SessionEndpoint):
    kind = KIND
    idle_what = "no message and nothing spoken"

    def __init__(self, ws: WebSocket) -> None:
        super().__init__(ws)
        self.model = ""
        self.session_id = new_session_id(KIND)
        self.entry: SessionRecord | None = None
        self.utterance = 0
        self.sentence = 0  # next sentence index in the current utterance
        self.cancelled: set[int] = set()
        self.samples: dict[int, int] = {}  # utterance -> samples sent, for response.done
        self.current: int | None = None  # the utterance the speaker is speaking
        self.holding: int | None = None  # the utterance of the item the speaker took from the queue
        # (utterance, perf_counter time of its first audio, seconds of audio sent since):
        # when the listener runs out, each window's engine deadline (``_needed_by``).
        self.playback: tuple[int, float, float] | None = None
        # Unbounded as a queue, bounded by what feeds it: at most MAX_PENDING_TEXT_CHARS of
        # sentence text (``queued_chars``) plus one UtteranceEnd per input.done.
        self.queue: asyncio.Queue[Sentence | UtteranceEnd | Drained] = asyncio.Queue()
        self.queued_chars = 0
        self.speaking = asyncio.Lock()  # held by the speaker for one sentence or utterance end
        self.first_audio = self.metrics.tts_first_audio
        self.told_dead = False  # the client heard the engine is dead
        self.synthesizing = False  # a window of this session is in the engine (not idle)
        self.speaker: asyncio.Task | None = None
        self.ended_event = asyncio.Event()  # the reader has finished (the socket is gone)

    @property
    def log_id(self) -> str:
        return self.session_id

    def unavailable(self) -> Goodbye | None:
        state = self.conn.ws.app.state
        names = state.inventory.names(KIND)
        if not names:
            reasons = [m["reason"] for m in state.inventory.unavailable.values() if m["kind"] == KIND]
            why = "; ".join(reasons) or "no voice loaded"
            return Goodbye(wire.TTS_UNAVAILABLE, f"TTS is unavailable: {why}. Install it with pip install "
                           "'realtime-sessions[tts]'")
        if not self.engine.healthy:
            return Goodbye(wire.INTERNAL, f"engine unavailable: {self.engine.dead_reason}")
        self.model = names[0]
        return None

    async def opened(self) -> None:
        self.adapter: TTSAdapter = self.engine.adapter(self.model)  # type: ignore[assignment]
        self.voices = tuple(self.adapter.voices)
        self.config = wire.SessionConfig(voice=self.voices[0])
        self.segmenter = self.adapter.segmenter()
        self.speaker = asyncio.create_task(self._speak())
        self.entry = self.live.add(KIND, self.session_id, self.model, owner=self)
        await self.send(wire.encode(self.config.updated(self.voices)))
        log.info("session %s: tts session opened on %s", self.session_id, self.model)

    def receive(self) -> Any:
        return self.conn.receive(wire.MAX_FRAME_BYTES, wire.MAX_FRAME_BYTES)

    def busy(self) -> bool:
        return self.synthesizing

    async def handle(self, frame: Received) -> bool:
        try:
            parsed = wire.parse_client(frame.text if frame.text is not None else frame.data, self.voices)
        except wire.ProtocolError as exc:
            await self.error(exc.code, exc.message)
            return True
        if isinstance(parsed, wire.SessionClose):
            await self._cancel(notify=False)
            await self.send(wire.encode(wire.SessionClosed()))
            return False
        if self.draining:
            await self.error(wire.GOING_AWAY, "the server is shutting down: nothing more is spoken; "
                                              "the socket closes once the utterance being spoken ends")
            return True
        await self.on_message(parsed)
        return True

    async def tell(self, code: str | None, message: str, timeout: float | None = None) -> None:
        await self.error(code or wire.INTERNAL, message, timeout=timeout)

    def stop_output(self) -> None:
        # A speaker stuck on a client that does not read is stopped before the goodbye.
        if self.speaker is not None:
            self.speaker.cancel()

    async def ended(self) -> None:
        self.ended_event.set()
        if self.speaker is not None:
            self.speaker.cancel()
        if self.entry is not None:
            # Not awaited: behind a long forward the voice state's drop would hold this handler.
            self.engine.post_drop_session(self.model, self.session_id)
            self.live.remove(self.entry)
            log.info("session %s: tts session closed", self.session_id)
        await self.conn.close()

    async def send(self, text: str, timeout: float | None = None) -> None:
        """One message (``timeout``: dropped if not taken by then; the idle timeout by default)."""
        if await self.conn.send(text, timeout=timeout or self.idle.reply_timeout_s):
            self.idle.touch()

    async def error(self, code: str, message: str, timeout: float | None = None) -> None:
        log.info("session %s: error %s: %s", self.session_id, code, message)
        self.metrics.refused(code)  # counted when it is a refusal (too_many_sessions, idle_timeout, ...)
        await self.send(wire.error(code, message), timeout=timeout)

    def dropped(self, reason: str) -> None:
        """A voice keeps nothing across sentences worth reporting; the next window is stale."""
        log.info("session %s: voice state dropped: %s", self.session_id, reason)

    async def engine_dead(self, reason: str) -> None:
        """The engine died: tell the client (once) and close; nothing can be spoken now."""
        async with self.speaking:  # a sentence in flight reports its own failure first
            pass
        if not self.told_dead:
            self.told_dead = True
            await self.error(wire.INTERNAL, f"engine unavailable: {reason}")
        await self.conn.close(CLOSE_INTERNAL)

    async def wind_down(self, why: Why) -> None:
        """At a drain, finish the utterance being spoken (module docstring). It is the
        speaker's, or the one at the head of the queue when the speaker is between two of
        its sentences. An idle or closed session stops where it is."""
        if why is not Why.DRAIN or self.entry is None:
            return
        open_utterance = self.utterance if self.sentence > 0 or self.segmenter.buffered.strip() else None
        finishing, keep, unfinished = plan_drain(take_all(self.queue), self.current, open_utterance, self.cancelled)
        self.cancelled.update(unfinished - {finishing})
        self.segmenter.clear()
        self.queued_chars = sum(len(i.text) for i in keep if isinstance(i, Sentence))
        marker = Drained(tuple(sorted(unfinished)))
        for item in (*keep, marker):
            self.queue.put_nowait(item)
        log.info("session %s: draining: finishing utterance %s, %d items left to speak", self.session_id,
                 finishing, len(keep))
        await first_of(marker.reached.wait(), self.ended_event.wait())

    async def _drop_voice_state(self) -> None:
        try:
            await self.engine.drop_session(self.model, self.session_id)
        except ENGINE_ERRORS:
            pass  # a dead or stopped engine holds no voice state
        except Exception as exc:  # noqa: BLE001 - nothing is kept between sentences; log and go on
            log.warning("session %s: voice release failed: %r", self.session_id, exc)

    async def on_message(self, msg: wire.ClientMessage) -> None:
        if isinstance(msg, wire.SessionUpdate):
            self.config = self.config.apply(msg)
            await self.send(wire.encode(self.config.updated(self.voices)))
        elif isinstance(msg, (wire.InputText, wire.InputDone)) and self.queue.qsize() >= wire.MAX_PENDING_ITEMS:
            await self.error(wire.BUFFER_FULL, f"{self.queue.qsize()} sentences and utterance ends wait to be "
                                               f"spoken; the limit is {wire.MAX_PENDING_ITEMS}")
        elif isinstance(msg, wire.InputText):
            pending = self.queued_chars + len(self.segmenter.buffered) + len(msg.text)
            if pending > wire.MAX_PENDING_TEXT_CHARS:
                await self.error(wire.BUFFER_FULL, f"{pending} characters would wait to be spoken; the limit is "
                                                   f"{wire.MAX_PENDING_TEXT_CHARS}: send more once audio has come")
                return
            before = self.segmenter.buffered
            if not await self._enqueue(self.segmenter.push(msg.text), before):
                return
        elif isinstance(msg, wire.InputDone):
            before = self.segmenter.buffered
            if not await self._enqueue(self.segmenter.flush(), before, end=True):
                return
            self.queue.put_nowait(UtteranceEnd(self.utterance, self.sentence))
            self.utterance += 1
            self.sentence = 0
        elif isinstance(msg, wire.ResponseCancel):
            await self._cancel(notify=True)

    async def _enqueue(self, sentences: list[str], before: str, *, end: bool = False) -> bool:
        """Queue a message's sentences (and, with ``end``, room for its utterance end); False,
        with ``buffer_full`` told and the segmenter as it was ``before``, if they would take
        the queue past MAX_PENDING_ITEMS: the message is refused whole."""
        items = self.queue.qsize() + len(sentences) + end
        if items > wire.MAX_PENDING_ITEMS:
            self.segmenter.restore(before)
            await self.error(wire.BUFFER_FULL, f"this message would make {items} sentences and utterance ends wait "
                                               f"to be spoken; the limit is {wire.MAX_PENDING_ITEMS}")
            return False
        for text in sentences:
            self.queued_chars += len(text)
            self.queue.put_nowait(Sentence(self.utterance, self.sentence, text))
            self.sentence += 1
        return True

    async def _cancel(self, *, notify: bool) -> None:
        """Barge-in: stop the utterance being spoken and everything queued or buffered."""
        items = take_all(self.queue)
        cancelled = {item.utterance_index for item in items if not isinstance(item, Drained)}
        for marker in (item for item in items if isinstance(item, Drained)):
            self.queue.put_nowait(marker)  # a drain waits for it
        self.queued_chars = 0
        if self.current is not None:
            cancelled.add(self.current)
        open_utterance = self.sentence > 0 or bool(self.segmenter.buffered.strip())
        if open_utterance or not cancelled:
            cancelled.add(self.utterance)
        self.cancelled.update(cancelled)
        self.segmenter.clear()
        await self._drop_voice_state()
        async with self.speaking:  # the speaker has let go of the cancelled audio
            pass
        if notify:
            for index in sorted(cancelled):
                await self.send(wire.encode(wire.ResponseCancelled(index)))
        if self.utterance in cancelled:
            # Text after a barge-in starts a new utterance.
            self.utterance += 1
            self.sentence = 0
        if self.holding is None:  # the queue was drained and the speaker holds nothing
            self._forget_before(self.utterance)

    def _forget_before(self, utterance: int) -> None:
        """No item of an utterance before ``utterance`` is queued or held any more: what
        ``cancelled`` and ``samples`` keep of them is never read again (else each cancel
        would grow them for the connection's life)."""
        self.cancelled = {u for u in self.cancelled if u >= utterance}
        for u in [u for u in self.samples if u < utterance]:
            del self.samples[u]

    async def _speak(self) -> None:
        while True:
            item = await self.queue.get()
            if isinstance(item, Drained):
                for index in item.unfinished:
                    await self.send(wire.encode(wire.ResponseCancelled(index)))
                item.reached.set()
                continue
            # Items come in utterance order: nothing before this one's is asked about again.
            self.holding = item.utterance_index
            self._forget_before(item.utterance_index)
            try:
                await self._say(item)
            finally:
                self.holding = None

    async def _say(self, item: "Sentence | UtteranceEnd") -> None:
        """One item the speaker took: a sentence spoken, or an utterance's ``response.done``."""
        if isinstance(item, Sentence):
            self.queued_chars -= len(item.text)
        async with self.speaking:
            if item.utterance_index in self.cancelled:
                return
            if isinstance(item, UtteranceEnd):
                samples = self.samples.pop(item.utterance_index, 0)
                await self.send(wire.encode(wire.ResponseDone(item.utterance_index, item.sentences, samples)))
                return
            self.current = item.utterance_index
            try:
                await self._speak_sentence(item)
            except Exception as exc:  # noqa: BLE001 - a bug: input is validated on arrival
                # The speaker must outlive it: the client hears of this sentence and
                # every later one is still spoken.
                log.exception("session %s: sentence %d.%d failed", self.session_id, item.utterance_index,
                              item.sentence_index)
                await self.error(wire.INTERNAL, f"synthesis failed: {type(exc).__name__}")
            finally:
                self.current = None

    async def _speak_sentence(self, item: Sentence) -> None:
        config = self.config
        utt, k = item.utterance_index, item.sentence_index
        await self.send(wire.encode(wire.AudioStart(utt, k, item.text, config.sample_rate)))
        rate = config.sample_rate
        work = SynthesizeSentence(self.session_id, utt, k, item.text, config.speed, rate)
        samples = 0
        while True:
            self.synthesizing = True
            try:
                audio = await self.engine.submit(self.model, work, session_id=self.session_id,
                                                 deadline=self._needed_by(utt))
            except ENGINE_ERRORS as exc:
                failure = engine_failure(exc)
                if failure is Failure.ENGINE:
                    if self.told_dead:
                        return
                    self.told_dead = True
                if failure is not Failure.CANCELLED:
                    await self.error(wire.INTERNAL, f"synthesis failed: {exc}")
                return
            finally:
                self.synthesizing = False
                self.idle.touch()  # its idleness counts from the window's end, not from the last send
            if utt in self.cancelled or audio.stale:
                return
            if audio.samples:
                if samples == 0:
                    self.first_audio.observe(time.perf_counter() - item.queued_at)
                self._played(utt, audio.samples / rate)
                if await self.conn.send(audio.pcm):
                    self.idle.touch()
            samples = audio.sentence_samples
            if audio.done:
                break
            work = DecodeWindow(self.session_id, utt, k)
        self.samples[utt] = self.samples.get(utt, 0) + samples
        await self.send(wire.encode(wire.AudioDone(utt, k, samples)))

    def _needed_by(self, utt: int) -> float:
        """When the listener runs out of utterance ``utt``'s audio: the engine's deadline for
        its next window (realtime/engine/scheduler.py, deadlines); now, before its first audio."""
        if self.playback is None or self.playback[0] != utt:
            return time.perf_counter()
        return self.playback[1] + self.playback[2]

    def _played(self, utt: int, seconds: float) -> None:
        """``seconds`` more of utterance ``utt``'s audio sent; its first starts the listener's clock."""
        if self.playback is None or self.playback[0] != utt:
            self.playback = (utt, time.perf_counter(), seconds)
        else:
            self.playback = (utt, self.playback[1], self.playback[2] + seconds)


async def tts_endpoint(ws: WebSocket) -> None:
    await TTSEndpoint(ws).serve()
