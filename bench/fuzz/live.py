"""Fuzz cases on live sockets: send one frame, read every answer, check it is documented.

A probe keeps one connection per protocol and reconnects when the server closed it
(a documented close) or after ``reconnect_every`` cases (so ``session.create`` and
fresh settings keep being exercised). After each case the world and TTS probes send
a sentinel (a message of an unknown type) and read until its ``unknown_type`` error:
everything before it answers the case. Each probe returns outcome labels
(``ok:<type>``, ``error:<code>``, ``close:<code>``) or raises ``Crash``.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import msgpack
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from bench.fuzz.cases import Frame
from bench.fuzz.decoders import Crash
from protocols import openpi, tts_v1, world_v1

SENTINEL = '{"type":"fuzz.sentinel"}'
ANSWER_TIMEOUT_S = 30.0

WORLD_SERVER_TYPES = frozenset({"session.created", "event.accepted", "chunk", "session.reset", "session.closed",
                                "error"})
# Closes the world endpoint documents: 1003 (binary frame), 1009 (frame over 64 KiB).
WORLD_CLOSES = frozenset({world_v1.CLOSE_UNSUPPORTED_DATA, world_v1.CLOSE_TOO_BIG})
TTS_SERVER_TYPES = frozenset(m.type for m in (tts_v1.SessionUpdated, tts_v1.AudioStart, tts_v1.AudioDone,
                                              tts_v1.ResponseDone, tts_v1.ResponseCancelled, tts_v1.SessionClosed,
                                              tts_v1.Error))
TTS_CLOSES = frozenset({1000})  # after session.closed
# A text frame that is not UTF-8 (a lone surrogate cannot be encoded): the WebSocket
# layer closes with 1007 before any endpoint sees it (RFC 6455 section 8.1).
CLOSE_INVALID_UTF8 = 1007


def _open(url: str) -> tuple[contextlib.ExitStack, ClientConnection]:
    """A connection as openpi-client opens one (no compression, no size limit), entered
    as the context manager websockets wants, closed by closing the stack."""
    stack = contextlib.ExitStack()
    return stack, stack.enter_context(connect(url, max_size=None, compression=None, open_timeout=10))


def _invalid_utf8(data: str | bytes) -> bool:
    if not isinstance(data, str):
        return False
    try:
        data.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _send(ws: ClientConnection, data: str | bytes) -> None:
    """Send as a client would put it on the wire: a str the client cannot encode goes out
    as a text frame of its raw (invalid) UTF-8 bytes."""
    if isinstance(data, str) and _invalid_utf8(data):
        ws.send(data.encode("utf-8", "surrogatepass"), text=True)
    else:
        ws.send(data)


class _JSONProbe:
    path: str
    server_types: frozenset[str]
    error_codes: frozenset[str]
    closes: frozenset[int]

    def __init__(self, addr: str, reconnect_every: int = 50) -> None:
        self.url = f"ws://{addr}{self.path}"
        self.reconnect_every = reconnect_every
        self.ws: ClientConnection | None = None
        self._stack: contextlib.ExitStack | None = None
        self.on_connection = 0

    def _connect(self) -> None:
        self.close()
        self._stack, self.ws = _open(self.url)
        self.on_connection = 0
        self.binary_ok = 0
        self._opened()

    def _opened(self) -> None:
        pass

    def close(self) -> None:
        if self._stack is not None:
            self._stack.close()  # also after the server closed: releases the client's thread
        self._stack, self.ws = None, None

    def case(self, frame: Frame) -> list[str]:
        if self.ws is None or self.on_connection >= self.reconnect_every:
            self._connect()
        assert self.ws is not None
        self.on_connection += 1
        outcomes: list[str] = []
        try:
            try:
                _send(self.ws, frame.data)
                self.ws.send(SENTINEL)
            except ConnectionClosed:
                pass  # the server answered and closed first; the answers are still to be read
            while True:
                try:
                    msg = self.ws.recv(timeout=ANSWER_TIMEOUT_S)
                except TimeoutError:
                    raise Crash(f"no answer in {ANSWER_TIMEOUT_S} s to {frame.label} {str(frame.data)[:80]!r}")
                if isinstance(msg, bytes):
                    self._binary()
                    continue
                label = self._text(msg)
                if label is None:
                    return outcomes
                outcomes.append(label)
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
            self.ws = None
            if code not in self.closes and not (code == CLOSE_INVALID_UTF8 and _invalid_utf8(frame.data)):
                raise Crash(f"closed with {code} after {frame.label} {str(frame.data)[:80]!r}") from None
            outcomes.append(f"close:{code}")
            return outcomes

    def _text(self, text: str) -> str | None:
        try:
            msg = json.loads(text)
        except ValueError:
            raise Crash(f"server text frame is not JSON: {text[:80]!r}") from None
        kind = msg.get("type") if isinstance(msg, dict) else None
        if kind not in self.server_types:
            raise Crash(f"undocumented server message {text[:120]!r}")
        if kind == "error":
            if msg.get("code") not in self.error_codes:
                raise Crash(f"undocumented error code in {text[:160]!r}")
            if msg["code"] == "unknown_type" and "fuzz.sentinel" in msg.get("message", ""):
                return None
            return f"error:{msg['code']}"
        self._message(msg)
        return f"ok:{kind}"

    def _message(self, msg: dict[str, Any]) -> None:
        pass

    def _binary(self) -> None:
        if self.binary_ok <= 0:
            raise Crash("a binary frame the protocol did not announce")


class WorldProbe(_JSONProbe):
    path = world_v1.PATH
    server_types = WORLD_SERVER_TYPES
    error_codes = frozenset(world_v1.ERROR_CODES)
    closes = WORLD_CLOSES

    def _message(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "chunk":
            self.binary_ok += msg["frames"]  # exactly that many frames follow

    def _binary(self) -> None:
        super()._binary()
        self.binary_ok -= 1


class TTSProbe(_JSONProbe):
    path = "/v1/realtime/tts"
    server_types = TTS_SERVER_TYPES
    error_codes = frozenset(tts_v1.ERROR_CODES)
    closes = TTS_CLOSES

    def _opened(self) -> None:
        assert self.ws is not None
        first = json.loads(self.ws.recv(timeout=ANSWER_TIMEOUT_S))
        if first.get("type") != "session.updated":
            raise Crash(f"the TTS session opened with {first!r}")

    def _message(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "audio.start":
            self.binary_ok = 1  # PCM frames of the announced sentence, any number of them


class OpenPIProbe:
    """One request, one answer: a binary reply, or an error text and close 1011."""

    path = "/v1/realtime/robot/openpi"

    def __init__(self, addr: str) -> None:
        self.url = f"ws://{addr}{self.path}"
        self.ws: ClientConnection | None = None
        self._stack: contextlib.ExitStack | None = None
        self.metadata: dict[str, Any] = {}

    def _connect(self) -> None:
        self.close()
        self._stack, self.ws = _open(self.url)
        self.metadata = msgpack.unpackb(self.ws.recv(timeout=ANSWER_TIMEOUT_S))

    def close(self) -> None:
        if self._stack is not None:
            self._stack.close()  # also after the server closed: releases the client's thread
        self._stack, self.ws = None, None

    def case(self, frame: Frame) -> list[str]:
        if self.ws is None:
            self._connect()
        assert self.ws is not None
        try:
            _send(self.ws, frame.data)
            reply = self.ws.recv(timeout=ANSWER_TIMEOUT_S)
        except TimeoutError:
            raise Crash(f"no answer in {ANSWER_TIMEOUT_S} s to {frame.label}") from None
        except ConnectionClosed as exc:
            self.ws = None
            code = exc.rcvd.code if exc.rcvd else None
            if code == CLOSE_INVALID_UTF8 and _invalid_utf8(frame.data):
                return [f"close:{code}"]
            raise Crash(f"closed with {code} and no answer to {frame.label}") from None
        if isinstance(reply, bytes):
            body = openpi.unpack(reply)
            if not isinstance(body, dict) or not ({"actions", "batch", "status"} & set(body)):
                raise Crash(f"undocumented reply {body!r:.120}")
            return [f"ok:{'actions' if 'actions' in body else next(iter({'batch', 'status'} & set(body)))}"]
        if not reply.startswith("invalid request: "):
            raise Crash(f"undocumented error text {reply[:120]!r} for {frame.label}")
        try:
            self.ws.recv(timeout=ANSWER_TIMEOUT_S)
            raise Crash("a message after the error text")
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
        except TimeoutError:
            raise Crash("no close after the error text") from None
        self.ws = None
        if code != openpi.CLOSE_ERROR:
            raise Crash(f"closed with {code} after the error text")
        return ["error:invalid_request", f"close:{code}"]
