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
from dataclasses import dataclass, field
from typing import Any, Awaitable

from starlette.websockets import WebSocket

from models.tts.base import DecodeWindow, SynthesizeSentence, TTSAdapter
from protocols import tts_v1 as wire
from protocols.close_codes import CLOSE_IDLE_TIMEOUT, CLOSE_TRY_AGAIN_LATER, IDLE_TIMEOUT_REASON, TOO_MANY_SESSIONS_REASON
from realtime.endpoints.connection import (
    CLOSE_ADMIN,
    CLOSE_INTERNAL,
    ENGINE_ERRORS,
    TTS_CODES,
    Connection,
    Failure,
    LiveSessions,
    TooLarge,
    engine_failure,
    new_session_id,
    run_handler,
)
from realtime.engine import Engine
from realtime.server.limits import GOODBYE_TIMEOUT_S, IDLE, IdleClock, client_address, receive_or_idle

log = logging.getLogger(__name__)

KIND = "tts"


@dataclass(frozen=True)
class _Sentence:
    utterance_index: int
    sentence_index: int
    text: str
    queued_at: float = field(default_factory=time.perf_counter)  # for time to first audio


@dataclass(frozen=True)
class _UtteranceEnd:
    utterance_index: int
    sentences: int


@dataclass(frozen=True)
class _Drained:
    """The drain's marker, behind what is left to speak: report ``unfinished`` cancelled."""

    unfinished: tuple[int, ...]
    reached: asyncio.Event = field(default_factory=asyncio.Event, compare=False)


class TTSConnection:
    def __init__(self, conn: Connection, engine: Engine, model: str, live: LiveSessions, idle: IdleClock) -> None:
        self.conn = conn
        self.engine = engine
        self.model = model
        self.adapter: TTSAdapter = engine.adapter(model)  # type: ignore[assignment]
        self.voices = tuple(self.adapter.voices)
        self.config = wire.SessionConfig(voice=self.voices[0])
        self.session_id = new_session_id(KIND)
        self.live = live
        self.segmenter = self.adapter.segmenter()
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
        # sentence text (``queued_chars``) plus one _UtteranceEnd per input.done.
        self.queue: asyncio.Queue[_Sentence | _UtteranceEnd | _Drained] = asyncio.Queue()
        self.queued_chars = 0
        self.speaking = asyncio.Lock()  # held by the speaker for one sentence or utterance end
        self.first_audio = conn.ws.app.state.metrics.tts_first_audio
        self.told_dead = False  # the client heard the engine is dead
        self.idle = idle  # touched by each client message and each audio frame or event sent
        self.synthesizing = False  # a window of this session is in the engine (not idle)
        self.speaker: asyncio.Task | None = None
        self.draining = False
        self.idle_closing = False  # the idle goodbye is being sent (a drain then does not close)
        self.ended = asyncio.Event()  # the reader has finished (the socket is gone)

    async def send(self, text: str, timeout: float | None = None) -> None:
        """One message (``timeout``: dropped if not taken by then; the idle timeout by default)."""
        if await self.conn.send(text, timeout=timeout or self.idle.reply_timeout_s):
            self.idle.touch()

    async def error(self, code: str, message: str, timeout: float | None = None) -> None:
        log.info("session %s: error %s: %s", self.session_id, code, message)
        await self.send(wire.error(code, message), timeout=timeout)

    def dropped(self, reason: str) -> None:
        """A voice keeps nothing across sentences worth reporting; the next window is stale."""
        log.info("session %s: voice state dropped: %s", self.session_id, reason)

    async def admin_close(self, session_id: str) -> None:
        """An operator closed the session: ``closed_by_admin``, then the socket closes
        with CLOSE_ADMIN (the reader then ends the session as on a disconnect)."""
        await self.error(wire.CLOSED_BY_ADMIN, f"session {session_id} was closed by the server's operator",
                         timeout=GOODBYE_TIMEOUT_S)
        await self.conn.close(CLOSE_ADMIN, "closed by admin")

    async def engine_dead(self, reason: str) -> None:
        """The engine died: tell the client (once) and close; nothing can be spoken now."""
        async with self.speaking:  # a sentence in flight reports its own failure first
            pass
        if not self.told_dead:
            self.told_dead = True
            await self.error(TTS_CODES[Failure.ENGINE], f"engine unavailable: {reason}")
        await self.conn.close(CLOSE_INTERNAL)

    async def drain(self) -> None:
        """Server shutdown: finish the utterance being spoken (module docstring), then
        close with 1001. The utterance being spoken is the speaker's, or the one at the
        head of the queue when the speaker is between two of its sentences."""
        self.draining = True
        self.idle.stop()  # the drain closes this socket, never the idle timeout
        if self.idle_closing:
            return  # the idle close under way closes the socket (4408); one close, not two
        items = _drain(self.queue)
        head = next((i.utterance_index for i in items if not isinstance(i, _Drained)), None)
        finishing = self.current if self.current is not None else head
        keep = [i for i in items if not isinstance(i, _Drained) and i.utterance_index == finishing]
        unfinished = {i.utterance_index for i in items if not isinstance(i, _Drained)}
        if self.sentence > 0 or self.segmenter.buffered.strip():
            unfinished.add(self.utterance)  # its input.done never came
        if finishing is not None and not any(isinstance(i, _UtteranceEnd) for i in keep):
            unfinished.add(finishing)  # cut short after its queued sentences
        unfinished -= {i.utterance_index for i in keep if isinstance(i, _UtteranceEnd)}
        unfinished -= self.cancelled  # the client cancelled these itself and heard so
        self.cancelled.update(unfinished - {finishing})
        self.segmenter.clear()
        self.queued_chars = sum(len(i.text) for i in keep if isinstance(i, _Sentence))
        marker = _Drained(tuple(sorted(unfinished)))
        for item in (*keep, marker):
            self.queue.put_nowait(item)
        log.info("session %s: draining: finishing utterance %s, %d items left to speak", self.session_id,
                 finishing, len(keep))
        await _first(marker.reached.wait(), self.ended.wait())
        await self.conn.close(wire.CLOSE_GOING_AWAY, "server shutting down")

    async def run(self) -> None:
        speaker = self.speaker = asyncio.create_task(self._speak())
        entry = self.live.add(KIND, self.session_id, self.model, owner=self)
        await self.send(wire.encode(self.config.updated(self.voices)))
        log.info("session %s: tts session opened on %s", self.session_id, self.model)
        try:
            while True:
                try:
                    frame = await receive_or_idle(self.idle, self._receive, lambda: self.synthesizing)
                except TooLarge as exc:
                    await self.error(wire.MESSAGE_TOO_LARGE, f"message of {exc.size} bytes; the limit is {exc.limit}")
                    continue
                if frame is IDLE:
                    await self.idle_close()
                    break
                if frame is None:
                    break
                try:
                    parsed = wire.parse_client(frame.text if frame.text is not None else frame.data, self.voices)
                except wire.ProtocolError as exc:
                    await self.error(exc.code, exc.message)
                    continue
                if isinstance(parsed, wire.SessionClose):
                    await self._cancel(notify=False)
                    await self.send(wire.encode(wire.SessionClosed()))
                    break
                if self.draining:
                    await self.error(wire.GOING_AWAY, "the server is shutting down: nothing more is spoken; "
                                                      "the socket closes once the utterance being spoken ends")
                    continue
                await self.handle(parsed)
        finally:
            self.ended.set()
            speaker.cancel()
            # Not awaited: behind a long forward the release would hold this handler.
            self.engine.post_release(self.model, self.session_id)
            self.live.remove(entry)
            self.live.detach(self)
            log.info("session %s: tts session closed", self.session_id)
            await self.conn.close()

    def _receive(self) -> Any:
        return self.conn.receive(wire.MAX_FRAME_BYTES, wire.MAX_FRAME_BYTES)

    async def idle_close(self) -> None:
        """No message and nothing spoken for the idle timeout: ``idle_timeout``, then close
        with CLOSE_IDLE_TIMEOUT (the reader then ends the session as on a disconnect). A
        speaker stuck on a client that does not read is stopped first; such a client takes
        nothing and is dropped after GOODBYE_TIMEOUT_S."""
        self.idle_closing = True  # a drain from now on leaves the close to this one
        timeout = self.idle.timeout_s
        log.info("session %s: idle for %g s (no message, nothing spoken): closing", self.session_id, timeout)
        if self.speaker is not None:
            self.speaker.cancel()
        await self.conn.send(wire.error(wire.IDLE_TIMEOUT, f"no message and nothing spoken for {timeout:g} s (the "
                                        "server's idle timeout, --idle-timeout-s): closing"),
                             timeout=GOODBYE_TIMEOUT_S)
        await self.conn.close(CLOSE_IDLE_TIMEOUT, IDLE_TIMEOUT_REASON, timeout=GOODBYE_TIMEOUT_S)

    async def _release(self) -> None:
        try:
            await self.engine.release(self.model, self.session_id)
        except ENGINE_ERRORS:
            pass  # a dead or stopped engine holds no voice state
        except Exception as exc:  # noqa: BLE001 - nothing is kept between sentences; log and go on
            log.warning("session %s: voice release failed: %r", self.session_id, exc)

    async def handle(self, msg: wire.ClientMessage) -> None:
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
            self.queue.put_nowait(_UtteranceEnd(self.utterance, self.sentence))
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
            self.queue.put_nowait(_Sentence(self.utterance, self.sentence, text))
            self.sentence += 1
        return True

    async def _cancel(self, *, notify: bool) -> None:
        """Barge-in: stop the utterance being spoken and everything queued or buffered."""
        items = _drain(self.queue)
        cancelled = {item.utterance_index for item in items if not isinstance(item, _Drained)}
        for marker in (item for item in items if isinstance(item, _Drained)):
            self.queue.put_nowait(marker)  # a drain waits for it
        self.queued_chars = 0
        if self.current is not None:
            cancelled.add(self.current)
        open_utterance = self.sentence > 0 or bool(self.segmenter.buffered.strip())
        if open_utterance or not cancelled:
            cancelled.add(self.utterance)
        self.cancelled.update(cancelled)
        self.segmenter.clear()
        await self._release()
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
            if isinstance(item, _Drained):
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

    async def _say(self, item: "_Sentence | _UtteranceEnd") -> None:
        """One item the speaker took: a sentence spoken, or an utterance's ``response.done``."""
        if isinstance(item, _Sentence):
            self.queued_chars -= len(item.text)
        async with self.speaking:
            if item.utterance_index in self.cancelled:
                return
            if isinstance(item, _UtteranceEnd):
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
                await self.error(wire.INTERNAL_ERROR, f"synthesis failed: {type(exc).__name__}")
            finally:
                self.current = None

    async def _speak_sentence(self, item: _Sentence) -> None:
        config = self.config
        utt, k = item.utterance_index, item.sentence_index
        await self.send(wire.encode(wire.AudioStart(utt, k, item.text, config.sample_rate)))
        rate = config.sample_rate
        work = SynthesizeSentence(self.session_id, utt, k, item.text, config.speed, rate)
        samples = 0
        while True:
            self.synthesizing = True
            try:
                chunk = await self.engine.submit(self.model, work, session_id=self.session_id,
                                                 deadline=self._needed_by(utt))
            except ENGINE_ERRORS as exc:
                failure = engine_failure(exc)
                if failure is Failure.ENGINE:
                    if self.told_dead:
                        return
                    self.told_dead = True
                if failure is not Failure.CANCELLED:
                    await self.error(TTS_CODES[failure], f"synthesis failed: {exc}")
                return
            finally:
                self.synthesizing = False
                self.idle.touch()  # its idleness counts from the window's end, not from the last send
            if utt in self.cancelled or chunk.stale:
                return
            if chunk.samples:
                if samples == 0:
                    self.first_audio.observe(time.perf_counter() - item.queued_at)
                self._played(utt, chunk.samples / rate)
                if await self.conn.send(chunk.pcm):
                    self.idle.touch()
            samples = chunk.sentence_samples
            if chunk.done:
                break
            work = DecodeWindow(self.session_id, utt, k)
        self.samples[utt] = self.samples.get(utt, 0) + samples
        await self.send(wire.encode(wire.AudioDone(utt, k, samples)))

    def _needed_by(self, utt: int) -> float:
        """When the listener runs out of utterance ``utt``'s audio: the engine's deadline for
        its next window (realtime/engine/loop.py "Deadlines"); now, before its first audio."""
        if self.playback is None or self.playback[0] != utt:
            return time.perf_counter()
        return self.playback[1] + self.playback[2]

    def _played(self, utt: int, seconds: float) -> None:
        """``seconds`` more of utterance ``utt``'s audio sent; its first starts the listener's clock."""
        if self.playback is None or self.playback[0] != utt:
            self.playback = (utt, time.perf_counter(), seconds)
        else:
            self.playback = (utt, self.playback[1], self.playback[2] + seconds)


async def _first(*waits: Awaitable[object]) -> None:
    """Wait until the first of ``waits`` is done; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def _drain(queue: asyncio.Queue) -> list:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


async def tts_endpoint(ws: WebSocket) -> None:
    state = ws.app.state
    conn = Connection(ws)
    if not await conn.accept():
        return
    names = state.inventory.names(KIND)
    if not names:
        reasons = [m["reason"] for m in state.inventory.unavailable.values() if m["kind"] == KIND]
        why = "; ".join(reasons) or "no voice loaded"
        await conn.send(wire.error(wire.TTS_UNAVAILABLE, f"TTS is unavailable: {why}. Install it with pip install "
                                   "'realtime-sessions[tts]'"), timeout=GOODBYE_TIMEOUT_S)
        await conn.close(CLOSE_INTERNAL)
        return
    if not state.engine.healthy:
        await conn.send(wire.error(TTS_CODES[Failure.ENGINE], f"engine unavailable: {state.engine.dead_reason}"),
                        timeout=GOODBYE_TIMEOUT_S)
        await conn.close(CLOSE_INTERNAL)
        return
    client = client_address(ws)
    slot = state.client_slots.take(client)
    if slot is None:
        refusal = state.client_slots.refusal(client)
        log.info("%s: tts session refused: %s", conn.peer, refusal)
        await conn.send(wire.error(wire.TOO_MANY_SESSIONS, refusal), timeout=GOODBYE_TIMEOUT_S)
        await conn.close(CLOSE_TRY_AGAIN_LATER, TOO_MANY_SESSIONS_REASON)
        return
    idle: IdleClock | None = None
    try:
        idle = IdleClock(state.config.limits.idle_timeout_s)
        session = TTSConnection(conn, state.engine, names[0], state.live_sessions, idle)
        state.live_sessions.attach(session)
        await run_handler(session.run(), state.live_sessions)
    finally:
        if idle is not None:
            idle.close()
        slot.release()
