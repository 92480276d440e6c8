"""A streaming Python client for tts.v1 sessions (asyncio + websockets).

From a shell::

    python -m clients.tts "Hello there. How are you?" --out speech.wav [--rate 24000]

From code::

    async with TTSClient.connect("ws://127.0.0.1:8000/v1/realtime/tts") as client:
        await client.update(sample_rate=24000)
        result = await client.speak("Hello there.")     # streams, returns the audio
        write_wav("speech.wav", result.pcm, result.sample_rate)

Every socket's URL carries a ``?session_id=`` (given, or a random ``tts-XXXXXXXX``), so a proxy
in front of several replicas (deploy/) can route on it; the server ignores the query.

``speak`` sends the text (in pieces when ``piece_chars`` is set, the way a
language model would), then ``input.done``, and collects binary PCM frames until
``response.done``. Time to first audio is measured from ``input.done``, the
moment the text is complete.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import wave
from dataclasses import dataclass, field
from typing import Sequence

import websockets

from clients.cli_args import DEFAULT_HOST, DEFAULT_PORT, add_server_options, count, fresh_id, server_url
from protocols import tts_v1
from protocols.routing import with_session_id

PATH = "/v1/realtime/tts"
DEFAULT_URL = f"ws://{DEFAULT_HOST}:{DEFAULT_PORT}{PATH}"


class ServerError(Exception):
    """An ``error`` message from the server."""

    def __init__(self, err: tts_v1.Error) -> None:
        super().__init__("%s: %s" % (err.code, err.message))
        self.code = err.code
        self.message = err.message


@dataclass
class Sentence:
    utterance_index: int
    sentence_index: int
    text: str
    samples: int = 0  # from audio.done
    received_bytes: int = 0


@dataclass
class SpeechResult:
    pcm: bytes = field(repr=False)
    sample_rate: int
    sentences: list[Sentence]
    time_to_first_audio_s: float | None  # from input.done to the first PCM frame
    total_s: float  # from input.done to response.done

    @property
    def samples(self) -> int:
        return len(self.pcm) // 2

    @property
    def duration_s(self) -> float:
        return self.samples / self.sample_rate


def new_session_id() -> str:
    """A random routing id for one TTS socket (tts.v1 itself has no session id)."""
    return fresh_id("tts")


class TTSClient:
    def __init__(self, ws, timeout: float = 60.0, session_id: str | None = None) -> None:
        self._ws = ws
        self.timeout = timeout
        self.session_id = session_id  # the routing id in the socket's URL
        self.session: tts_v1.SessionUpdated | None = None

    @classmethod
    def connect(cls, url: str = DEFAULT_URL, timeout: float = 60.0, session_id: str | None = None) -> "_Connect":
        """Open a socket whose URL carries ``?session_id=`` (a random one when not given)."""
        return _Connect(url, timeout, session_id or new_session_id())

    async def _recv(self):
        async with asyncio.timeout(self.timeout):  # not wait_for: on 3.11 it can swallow a cancellation
            frame = await self._ws.recv()
        if isinstance(frame, bytes):
            return frame
        msg = tts_v1.parse_server(frame)
        if isinstance(msg, tts_v1.Error):
            raise ServerError(msg)
        return msg

    async def send(self, message: tts_v1.ClientMessage) -> None:
        await self._ws.send(tts_v1.encode(message))

    async def update(
        self, *, voice: str | None = None, sample_rate: int | None = None, speed: float | None = None
    ) -> tts_v1.SessionUpdated:
        await self.send(tts_v1.SessionUpdate(voice=voice, sample_rate=sample_rate, format="pcm16", speed=speed))
        while True:
            msg = await self._recv()
            if isinstance(msg, tts_v1.SessionUpdated):
                self.session = msg
                return msg

    async def speak(self, text: str, piece_chars: int | None = None, piece_delay_s: float = 0.0) -> SpeechResult:
        """Stream ``text`` in, ``input.done``, and collect the utterance's audio."""
        pieces = [text] if not piece_chars else [text[i : i + piece_chars] for i in range(0, len(text), piece_chars)]
        for piece in pieces:
            await self.send(tts_v1.InputText(piece))
            if piece_delay_s:
                await asyncio.sleep(piece_delay_s)
        await self.send(tts_v1.InputDone())
        t_done = time.perf_counter()
        first: float | None = None
        audio = bytearray()
        sentences: list[Sentence] = []
        rate = self.session.sample_rate if self.session else tts_v1.DEFAULT_SAMPLE_RATE
        while True:
            msg = await self._recv()
            if isinstance(msg, bytes):
                if first is None:
                    first = time.perf_counter() - t_done
                audio += msg
                if sentences:
                    sentences[-1].received_bytes += len(msg)
            elif isinstance(msg, tts_v1.AudioStart):
                rate = msg.sample_rate
                sentences.append(Sentence(msg.utterance_index, msg.sentence_index, msg.text))
            elif isinstance(msg, tts_v1.AudioDone):
                if sentences and sentences[-1].sentence_index == msg.sentence_index:
                    sentences[-1].samples = msg.samples
            elif isinstance(msg, (tts_v1.ResponseDone, tts_v1.ResponseCancelled, tts_v1.SessionClosed)):
                break
        return SpeechResult(bytes(audio), rate, sentences, first, time.perf_counter() - t_done)

    async def cancel(self) -> None:
        await self.send(tts_v1.ResponseCancel())

    async def close(self) -> None:
        """``session.close`` and wait (briefly) for ``session.closed``."""
        try:
            await self.send(tts_v1.SessionClose())
            while not isinstance(await self._recv(), tts_v1.SessionClosed):
                pass
        except (websockets.ConnectionClosed, asyncio.TimeoutError):
            pass


class _Connect:
    def __init__(self, url: str, timeout: float, session_id: str) -> None:
        self._url, self._timeout, self._ws = with_session_id(url, session_id), timeout, None
        self._session_id = session_id

    async def __aenter__(self) -> TTSClient:
        self._ws = await websockets.connect(self._url, max_size=None, open_timeout=self._timeout)
        return TTSClient(self._ws, self._timeout, self._session_id)

    async def __aexit__(self, *exc) -> None:
        await self._ws.close()


def write_wav(path: str, pcm: bytes, sample_rate: int) -> None:
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm)


async def synthesize(
    text: str,
    url: str = DEFAULT_URL,
    *,
    sample_rate: int | None = None,
    voice: str | None = None,
    speed: float | None = None,
    piece_chars: int | None = None,
    timeout: float = 60.0,
    session_id: str | None = None,
) -> SpeechResult:
    """Connect, configure, speak ``text`` and close."""
    async with TTSClient.connect(url, timeout, session_id) as client:
        await client.update(voice=voice, sample_rate=sample_rate, speed=speed)
        result = await client.speak(text, piece_chars=piece_chars)
        await client.close()
        return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m clients.tts",
        description="Speak TEXT on a tts.v1 server: stream it, print the time to first audio, write a WAV.",
        epilog='example: python -m clients.tts "Hello there. How are you?" --out speech.wav')
    p.add_argument("text", help="what to say: any length, split into sentences by the server")
    add_server_options(p, PATH)
    p.add_argument("--out", default="speech.wav", help="the WAV file to write (default: %(default)s)")
    p.add_argument("--rate", type=int, default=None, choices=tts_v1.SAMPLE_RATES,
                   help="sample rate in Hz (default: the voice's own)")
    p.add_argument("--voice", default=None, help="voice name, as GET /v1/models lists (default: the server's)")
    p.add_argument("--speed", type=float, default=None,
                   help="speaking rate, 1.0 the voice's own (the server's bounds apply; default: 1.0)")
    p.add_argument("--piece-chars", type=count, default=None,
                   help="send the text in pieces of this many characters, as a language model streams it "
                        "(default: all at once)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for the server at each step (default: %(default)s)")
    p.add_argument("--session", default=None,
                   help="routing id sent as ?session_id= for a proxy in front of replicas (default: a fresh tts-XXXXXXXX)")
    args = p.parse_args(argv)
    args.url = server_url(args, PATH)
    try:
        result = asyncio.run(
            synthesize(
                args.text,
                args.url,
                sample_rate=args.rate,
                voice=args.voice,
                speed=args.speed,
                piece_chars=args.piece_chars,
                timeout=args.timeout,
                session_id=args.session,
            )
        )
    except ServerError as exc:
        print("server error: %s" % exc, file=sys.stderr)
        return 1
    except (OSError, websockets.InvalidURI, websockets.InvalidHandshake, asyncio.TimeoutError) as exc:
        print("cannot talk to %s: %s" % (args.url, exc), file=sys.stderr)
        return 2
    write_wav(args.out, result.pcm, result.sample_rate)
    ttfa = "n/a" if result.time_to_first_audio_s is None else "%.1f ms" % (result.time_to_first_audio_s * 1e3)
    print(
        "time to first audio %s; %d sentences, %.2f s of audio at %d Hz in %.2f s -> %s"
        % (ttfa, len(result.sentences), result.duration_s, result.sample_rate, result.total_s, args.out)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
