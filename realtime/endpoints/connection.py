"""One accepted WebSocket: a bounded receive, one locked send that tolerates a vanished
peer, and a close that does the same.

The client may close first at any moment (after its own ``session.close``, in the middle
of a chunk): nothing a client does on its side of the socket reaches the server log as a
traceback. What a session does over the socket is ``lifecycle.py``'s and its kind's.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from protocols.close_codes import CLOSE_NORMAL
from realtime.endpoints.idle import GOODBYE_TIMEOUT_S
from realtime.server.transport import ABORT_EXTENSION

log = logging.getLogger(__name__)

# What a send or close raises once the peer has gone: starlette's WebSocketDisconnect,
# its "Cannot call send once a close message has been sent" RuntimeError, a socket error.
_PEER_GONE = (WebSocketDisconnect, RuntimeError, OSError)


@dataclass(frozen=True)
class Received:
    """One client frame: exactly one of ``text`` and ``data`` is set."""

    text: str | None = None
    data: bytes | None = None


class TooLarge(Exception):
    """A client frame over the endpoint's limit (the frame is dropped)."""

    def __init__(self, size: int, limit: int, binary: bool) -> None:
        super().__init__(f"{'binary' if binary else 'text'} frame of {size} bytes over the limit of {limit}")
        self.size, self.limit, self.binary = size, limit, binary


class Connection:
    """One accepted WebSocket: bounded receive, locked sends, a tolerant close."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self._lock = asyncio.Lock()
        self._open = True
        # realtime/server/transport.py: whether a send would go out without waiting (None: unknown).
        self._writable = ws.scope.get("extensions", {}).get(ABORT_EXTENSION, {}).get("writable")

    @property
    def open(self) -> bool:
        """False once the peer is gone or the server closed the socket."""
        return self._open

    @property
    def stalled(self) -> bool:
        """A send is under way and the transport takes no more writes: the peer has stopped
        reading (False where the transport does not tell)."""
        return self._lock.locked() and self._writable is not None and not self._writable()

    async def accept(self) -> bool:
        """Complete the handshake; False (the upgrade answered 503, nothing to do) while
        the server drains: a socket opened now would only be closed again."""
        live = getattr(self.ws.app.state, "live_sessions", None)
        if live is not None and live.draining:
            self._open = False
            await self.ws.send_denial_response(PlainTextResponse("server is shutting down\n", status_code=503))
            return False
        await self.ws.accept()
        return True

    async def receive(self, max_text: int | None, max_binary: int | None = None) -> Received | None:
        """The next client frame, or None once the peer has gone. ``TooLarge`` for a
        text frame over ``max_text`` UTF-8 bytes or a binary one over ``max_binary``
        (None: only uvicorn's ``ws_max_size`` bounds it, for protocols that answer an
        oversized body with their own error)."""
        try:
            msg = await self.ws.receive()
        except _PEER_GONE:
            self._open = False
            return None
        if msg["type"] == "websocket.disconnect":
            self._open = False
            return None
        data = msg.get("bytes")
        if data is not None:
            if max_binary is not None and len(data) > max_binary:
                raise TooLarge(len(data), max_binary, binary=True)
            return Received(data=data)
        text = msg.get("text") or ""
        # UTF-8 never has fewer bytes than characters: encode only when it might not fit.
        if max_text is not None and (len(text) > max_text or
                                     (4 * len(text) > max_text and len(text.encode("utf-8")) > max_text)):
            raise TooLarge(len(text.encode("utf-8")), max_text, binary=False)
        return Received(text=text)

    async def send(self, *frames: str | bytes, timeout: float | None = None) -> bool:
        """Send ``frames`` back to back (no other send comes between them). False if
        the peer has gone: nobody is left to tell, the reader sees the disconnect.
        ``timeout``: a client that has not taken them by then is dropped (``abort``)."""
        if not self._open:
            return False
        # One frame, no other send under way and a transport that takes writes: the send
        # cannot wait, so it needs no timer (asyncio.timeout costs ~13 us; OpenPI replies).
        if timeout is not None and len(frames) == 1 and not self._lock.locked() and self._writable is not None \
                and self._writable():
            timeout = None
        try:
            if timeout is None:
                async with self._lock:
                    await self._send_frames(frames)
            else:
                async with asyncio.timeout(timeout), self._lock:
                    await self._send_frames(frames)
        except TimeoutError:  # before _PEER_GONE: TimeoutError is an OSError
            log.info("%s: a send not taken within %.1f s: dropping the connection", self.peer, timeout)
            self.abort()
            return False
        except _PEER_GONE as exc:
            self._open = False
            log.debug("send on a closed socket: %r", exc)
            return False
        return True

    async def _send_frames(self, frames: tuple[str | bytes, ...]) -> None:
        for frame in frames:
            if isinstance(frame, str):
                await self.ws.send_text(frame)
            else:
                await self.ws.send_bytes(frame)

    async def close(self, code: int = CLOSE_NORMAL, reason: str = "", timeout: float = GOODBYE_TIMEOUT_S) -> None:
        """Close from the server side, unless the peer closed first (then: nothing).
        ``timeout``: a client that does not read cannot take the close frame; it is
        dropped (``abort``) after that long. Every close is bounded: a later close (an
        operator's, the drain's) finds this one under way and returns at once."""
        was_open, self._open = self._open, False
        if not was_open or self.ws.application_state is not WebSocketState.CONNECTED:
            return
        try:
            async with asyncio.timeout(timeout), self._lock:
                await self.ws.close(code, reason)
        except TimeoutError:  # before _PEER_GONE: TimeoutError is an OSError
            log.info("%s: the close frame not taken within %.1f s: dropping the connection", self.peer, timeout)
            self.abort()
        except _PEER_GONE as exc:
            log.debug("close raced the peer's close: %r", exc)

    def abort(self) -> None:
        """Drop the TCP connection now (realtime/server/transport.py): for a client that stopped
        reading, whose sends and close frame would wait forever. The reader then sees
        the disconnect and ends the session as usual."""
        self._open = False
        abort = self.ws.scope.get("extensions", {}).get(ABORT_EXTENSION, {}).get("abort")
        if abort is not None:
            abort()

    @property
    def peer(self) -> str:
        client = self.ws.client
        return f"{client.host}:{client.port}" if client is not None else "-"
