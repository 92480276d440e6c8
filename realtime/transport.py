"""What uvicorn does with bytes before an endpoint sees them: bounded request heads and two fixes.

How uvicorn reads a request head here (uvicorn 0.54, websockets 17):

1. The HTTP protocol parses it. ``http="h11"``: h11 refuses a head that is still
   incomplete after ``h11_max_incomplete_event_size`` bytes with 400 and closes, so a
   client trickling an endless header holds at most that much. (httptools, uvicorn's
   default when installed, has no such limit.)
2. An upgrade is re-serialised and handed, in one piece, to the WebSocket protocol
   (websockets' sans-I/O ``ServerProtocol``), which parses it again with its own limits:
   8 KiB per line (``MAX_LINE_LENGTH``) and 128 headers. When one is exceeded it queues
   a 431 response and sets ``handshake_exc``, but uvicorn's ``data_received`` only looks
   for frame-parser errors, so that 431 was never written and the socket never closed
   (one fd held per such client, for as long as the client liked).

``WebSocketProtocol`` writes out what websockets queued and closes whenever the
handshake failed to parse, and refuses a head over ``MAX_HEADER_BYTES`` in total with
431 before parsing it at all (h11 lets a head that arrived complete in one read
through, whatever its size).

3. An endpoint can drop a connection whose client stopped reading: a send or close
   then waits for the client forever (uvicorn's ``send`` awaits a writable transport).
   ``WebSocketProtocol`` puts the transport's ``abort`` in the scope's extensions
   (``ABORT_EXTENSION``); ``Connection.abort`` calls it (the idle timeout does). Beside
   it, ``writable`` tells whether a send would go out at once (``Connection.send`` then
   needs no timer).

4. A text frame that is not UTF-8 is the client's fault (RFC 6455: close 1007), but
   uvicorn logs it with ``logger.exception``, a traceback per frame any client can
   send. ``WebSocketProtocol`` closes with 1007 and logs one INFO line instead.

5. uvicorn stops reading the socket after every complete message and starts again when
   the app takes it (two ``epoll_ctl`` calls and their selector bookkeeping per message,
   several microseconds of a ~0.5 ms OpenPI call). The pause bounds what a client can
   queue while the app is busy; when the app is already waiting in ``receive`` it takes
   the message at once, so ``WebSocketProtocol`` skips the pause then. A client that
   sends faster than the app takes still finds reading paused after the messages of
   the read that completed them, as before.

6. uvicorn closes an idle keep-alive connection after ``timeout_keep_alive``, but a
   connection whose request head never completes (nothing sent, or a head cut short)
   is never closed: one client held every file descriptor of the server with 20,000
   of them, and ``/healthz`` went down with the rest. ``HTTPProtocol`` closes a
   connection whose head is not complete within ``HEAD_TIMEOUT_S`` of its opening, or
   of the previous response on a keep-alive connection.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

log = logging.getLogger(__name__)

# Total size of a request head (request line + headers). Browsers send ~1-2 KiB; the
# usual proxy defaults are 8-16 KiB (nginx large_client_header_buffers 4 x 8k).
MAX_HEADER_BYTES = 16 * 1024

# A request head must be complete this long after the connection opened (or after the
# previous response on a keep-alive connection); item 6.
HEAD_TIMEOUT_S = 10.0

# RFC 6455 section 7.4.1: data inconsistent with the message type (bad UTF-8 in text).
CLOSE_INVALID_DATA = 1007

# scope["extensions"][ABORT_EXTENSION]["abort"](): drop the TCP connection at once.
ABORT_EXTENSION = "realtime.abort"

_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
              b"connection: close\r\ncontent-length: %d\r\n\r\n%s")
_TOO_LARGE_TEXT = b"request head over %d bytes\n" % MAX_HEADER_BYTES


class WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets protocol: every failed handshake answered and closed, bad UTF-8 closed quietly,
    no read pause for a message the app is waiting for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.receivers = 0  # app calls waiting in receive() (item 5)

    async def receive(self) -> Any:
        self.receivers += 1
        try:
            return await super().receive()
        finally:
            self.receivers -= 1

    def data_received(self, data: bytes) -> None:
        if self.handshake_initiated:
            super().data_received(data)
            return
        # Before the handshake, ``data`` is the head that the HTTP protocol re-serialised.
        head = data.find(b"\r\n\r\n")
        if (head if head >= 0 else len(data)) > MAX_HEADER_BYTES:
            log.info("%s: WebSocket upgrade refused: head over %d bytes", _peer(self.client), MAX_HEADER_BYTES)
            self.transport.write(_TOO_LARGE % (len(_TOO_LARGE_TEXT), _TOO_LARGE_TEXT))
            self.transport.close()
            return
        super().data_received(data)
        if not self.handshake_initiated and self.conn.handshake_exc is not None:
            log.info("%s: WebSocket upgrade refused: %s", _peer(self.client), self.conn.handshake_exc)
            self.transport.write(b"".join(self.conn.data_to_send()))
            self.transport.close()


    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        # The app's task is created above but runs only after this returns.
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope.setdefault("extensions", {})[ABORT_EXTENSION] = {"abort": self.transport.abort,
                                                                   "writable": self.writable.is_set}

    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type == "text" and not self.close_sent:
            try:
                b"".join(self.frames).decode()
            except UnicodeDecodeError:
                self.frames = []
                log.info("%s: a text frame that is not UTF-8: closing with %d", _peer(self.client),
                         CLOSE_INVALID_DATA)
                self.conn.send_close(CLOSE_INVALID_DATA, "text frame is not UTF-8")
                self.handle_parser_exception()
                return
        # uvicorn pauses reading unless it is paused already: the app waits for this message
        # (item 5), so it looks paused for the call and is not.
        skip_pause = self.receivers > 0 and not self.read_paused
        if skip_pause:
            self.read_paused = True
        try:
            super().send_receive_event_to_app()
        finally:
            if skip_pause:
                self.read_paused = False


class HTTPProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request head (item 6)."""

    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_timer()  # the next request's head, on a keep-alive connection

    def handle_websocket_upgrade(self, event: Any) -> None:
        self._cancel_head_timer()  # the head came; the WebSocket's own limits take over
        super().handle_websocket_upgrade(event)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_late)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or (self.cycle is not None and not self.cycle.response_complete):
            return  # closed already, or a request is being served (its head came)
        log.info("%s: no complete request head within %g s: closing", _peer(self.client), HEAD_TIMEOUT_S)
        self.transport.close()


async def refuse_upgrade(scope: Any, receive: Any, send: Any, status: int, text: str) -> None:
    """Answer a WebSocket upgrade that an ASGI middleware refuses before the app sees it:
    ``status`` with ``text`` where the server supports denial responses, else a close
    before accept (a 403 to the client, without the reason)."""
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        body = text.encode()
        await send({"type": "websocket.http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})


def uvicorn_options() -> dict[str, Any]:
    """The uvicorn.Config keywords that bound request heads (see the module docstring)."""
    return {"http": HTTPProtocol, "h11_max_incomplete_event_size": MAX_HEADER_BYTES, "ws": WebSocketProtocol}


def _peer(client: tuple[str, int] | None) -> str:
    return "%s:%d" % client if client else "-"
