"""What uvicorn does with bytes before an endpoint sees them: bounded request heads, bounded
replies to a client that does not read, and fixes.

How uvicorn reads a request here (uvicorn 0.55, h11 0.16, websockets 17):

1. The HTTP protocol parses each head with h11. h11 refuses a head that is still
   incomplete after ``max_incomplete_event_size`` bytes, but lets one that arrived
   complete in one read through whatever its size (a 100 KB header line was answered
   200), and waits for the rest of a first line that can never be HTTP (an SSH banner,
   binary junk) until the head timeout (item 6). ``HTTPProtocol`` holds every head,
   plain request or upgrade, complete or not, to ``MAX_HEADER_BYTES`` (431), answers
   400 as soon as the bytes received cannot start a request line
   (``could_start_request``), and refuses a request with both Content-Length and
   Transfer-Encoding (a smuggling shape, RFC 9112 section 6.1); each then closes.

   When h11 refuses a request's body (a bad chunk size, a chunk cut short, a bad
   trailer), uvicorn answers 400, but the app is already running for that request: its
   response then raised in h11 (a traceback per 80-byte request, on any path), or
   uvicorn's 400 raised after the app had answered. ``HTTPProtocol`` drops that request's sends (the app's
   ``receive`` sees ``http.disconnect``), answers only while no response has started,
   and closes.

2. An upgrade is re-serialised and handed, in one piece, to the WebSocket protocol
   (websockets' sans-I/O ``ServerProtocol``), which parses it again with its own limits:
   8 KiB per line (``MAX_LINE_LENGTH``) and 128 headers; past one it answers 431 and
   uvicorn (from 0.55, the lowest release pyproject allows) writes it and closes. Before
   0.55 that answer was never written and the socket never closed, one fd held per such
   client: tests/e2e/test_handshake.py keeps the behaviour.

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

7. websockets queues a pong for every ping and uvicorn writes it whether or not the
   client reads: a client that sent 750 MiB of pings and read nothing added 720 MB to
   the server's memory in 26 s, held until the idle timeout. Once the write buffer is
   over its high-water mark and pongs past ``MAX_UNSENT_PONG_BYTES`` went into it,
   ``WebSocketProtocol`` stops reading until the buffer drains (``resume_writing``), so
   the pongs a connection holds are bounded by the high-water mark, that allowance and
   one read of pings. The allowance keeps a client's keepalive pings from pausing its
   reads while the app's output waits for it; a ping is the only frame answered without
   the app (a close is answered once, and the socket closes). On HTTP, uvicorn answers
   one pipelined request at a time and awaits a writable transport before each response.
"""

from __future__ import annotations

import asyncio
import logging
import re
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

log = logging.getLogger(__name__)

# Total size of a request head (request line + headers), plain or upgrade, as received.
# Browsers send ~1-2 KiB; the usual proxy defaults are 8-16 KiB (nginx
# large_client_header_buffers 4 x 8k). Item 1.
MAX_HEADER_BYTES = 16 * 1024

# A request head must be complete this long after the connection opened (or after the
# previous response on a keep-alive connection); item 6.
HEAD_TIMEOUT_S = 10.0

# Pong bytes that may go into a write buffer already over its high-water mark before
# reading stops (item 7): ~2,700 keepalive pongs of a 4-byte payload, 129 of the largest.
MAX_UNSENT_PONG_BYTES = 16 * 1024

# RFC 6455 section 7.4.1: data inconsistent with the message type (bad UTF-8 in text).
CLOSE_INVALID_DATA = 1007

# scope["extensions"][ABORT_EXTENSION]["abort"](): drop the TCP connection at once.
ABORT_EXTENSION = "realtime.abort"

_HEAD_TOO_LARGE = "request head over %d bytes" % MAX_HEADER_BYTES

# A request line as h11 parses it (h11/_abnf.py, RFC 9112 section 3): a method token, one
# space, a target of visible characters, one space, HTTP/d.d; then CRLF (or a bare LF).
_TOKEN = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]"
_REQUEST_LINE = re.compile(_TOKEN + rb"+ [\x21-\x7e]+ HTTP/[0-9]\.[0-9]\r?")
# Every prefix of one: "", "G", "GET /", "GET / HT", "GET / HTTP/1.1\r", ...
_REQUEST_LINE_START = re.compile(
    _TOKEN + rb"*|" + _TOKEN + rb"+ [\x21-\x7e]*|" + _TOKEN + rb"+ [\x21-\x7e]+ "
    rb"(?:H(?:T(?:T(?:P(?:/(?:[0-9](?:\.(?:[0-9]\r?)?)?)?)?)?)?)?)?")


def could_start_request(received: bytes) -> bool:
    """Whether ``received`` (the bytes of a request head so far) can still become an HTTP
    request: its first line is a request line, or, while that line is incomplete, the
    start of one. ``b"GET / HT"`` can; ``b"SSH-2.0-OpenSSH_9.6\r\n"`` (no target, no
    version) and ``b"\x80\x01"`` cannot."""
    end = received.find(b"\n")
    if end < 0:
        return _REQUEST_LINE_START.fullmatch(received) is not None
    return _REQUEST_LINE.fullmatch(received, 0, end) is not None


class _Refused(h11.RemoteProtocolError):
    """A refusal of item 1's checks; its text holds none of the client's bytes."""


class _BoundedHeads(h11.Connection):
    """h11's server side with item 1's checks on every request head. A refusal is raised as
    h11 raises its own (uvicorn answers it through ``HTTPProtocol.send_400_response``) and
    kept in ``refusal`` with the status it asks for."""

    refusal: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            if self.their_state is not h11.IDLE:
                return super().next_event()
            # How much of h11's receive buffer the head takes: the bytes as received, so a
            # head padded with whitespace is counted as sent. (h11 has no public length.)
            buffered = len(self._receive_buffer)
            event = super().next_event()
            if type(event) is h11.Request:
                if buffered - len(self._receive_buffer) > MAX_HEADER_BYTES:
                    raise _Refused(_HEAD_TOO_LARGE, error_status_hint=431)
                names = {name for name, _ in event.headers}
                if b"content-length" in names and b"transfer-encoding" in names:
                    raise _Refused("both Content-Length and Transfer-Encoding")
            elif event is h11.NEED_DATA and not could_start_request(self.trailing_data[0]):
                # h11 keeps at most MAX_HEADER_BYTES of an incomplete head: a bounded look.
                raise _Refused("not an HTTP request line")
            return event
        except h11.RemoteProtocolError as exc:
            self.refusal = exc
            raise


class WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets protocol: every failed handshake answered and closed, bad UTF-8 closed quietly,
    no read pause for a message the app is waiting for, pongs bounded for a client that does not read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.receivers = 0  # app calls waiting in receive() (item 5)
        self.unsent_pongs = 0  # pong bytes written while the buffer was over its high-water mark (item 7)
        self.pongs_paused = False  # reading stopped for them
        self.pong_pauses = 0

    async def receive(self) -> Any:
        self.receivers += 1
        try:
            return await super().receive()
        finally:
            self.receivers -= 1
            # uvicorn resumed reading for the message taken: not while pongs wait (item 7). One
            # attribute test per message.
            if self.pongs_paused:
                self.transport.pause_reading()

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        # The app's task is created above but runs only after this returns.
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope.setdefault("extensions", {})[ABORT_EXTENSION] = {"abort": self.transport.abort,
                                                                   "writable": self.writable.is_set}

    def handle_ping(self) -> None:
        # The pongs of every ping in the last read (websockets queued them as it parsed).
        pongs = b"".join(self.conn.data_to_send())
        if not pongs:
            return  # written with an earlier ping of the same read
        self.transport.write(pongs)
        if not self.writable.is_set():
            self.unsent_pongs += len(pongs)
            if self.unsent_pongs > MAX_UNSENT_PONG_BYTES:
                # Also after uvicorn resumed reading for a close: each time, one read at most.
                if not self.pongs_paused:
                    self.pong_pauses += 1
                    if self.pong_pauses == 1:
                        log.info("%s: pings while not reading: reading paused until the client reads",
                                 _peer(self.client))
                self.pongs_paused = True
                self.transport.pause_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.unsent_pongs = 0
        if self.pongs_paused:
            self.pongs_paused = False
            if not self.read_paused:  # uvicorn's own pause (item 5) resumes when the app takes
                self.transport.resume_reading()

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
    """uvicorn's h11 protocol: bounded request heads, refused requests answered without the
    app (item 1), and a deadline for each head (item 6)."""

    _head_timer: asyncio.TimerHandle | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _BoundedHeads(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer when h11 refuses the client's bytes (it logged a warning)."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # The app may be running for this request (the head was fine, its body was not):
            # what it sends now goes nowhere, and its receive sees http.disconnect.
            cycle.disconnected = True
            cycle.message_event.set()
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # else a response began: it cannot be followed
            refusal = self.conn.refusal
            status = refusal.error_status_hint if refusal is not None else 400
            # Written past h11 (its state is left as it was: shutdown below), which would refuse
            # a body in the answer to a HEAD request.
            text = (str(refusal) if isinstance(refusal, _Refused) else _HEAD_TOO_LARGE if status == 431
                    else msg).encode() + b"\n"
            self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
                                 b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
                                 % (status, HTTPStatus(status).phrase.encode(), len(text), text))
        self.transport.close()

    def shutdown(self) -> None:
        if not self.transport.is_closing():  # else refused and answered: h11 cannot close from there
            super().shutdown()

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


async def refuse_upgrade(scope: Any, receive: Any, send: Any, status: int, text: str,
                         headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """Answer a WebSocket upgrade that an ASGI middleware refuses before the app sees it:
    ``status`` with ``text`` (and ``headers``) where the server supports denial responses,
    else a close before accept (a 403 to the client, without the reason)."""
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        body = text.encode()
        await send({"type": "websocket.http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode()), *headers]})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})


def uvicorn_options() -> dict[str, Any]:
    """The uvicorn.Config keywords that bound request heads (see the module docstring)."""
    return {"http": HTTPProtocol, "ws": WebSocketProtocol}


def _peer(client: tuple[str, int] | None) -> str:
    return "%s:%d" % client if client else "-"
