"""What one client may hold: live sessions and open sockets per client address.

* ``ClientSlots``: every live session takes a slot of its client address (a world
  session from ``session.create`` to its close, a tts.v1 or OpenPI connection for its
  whole life, batch and explicit ids included); past ``LimitsConfig.max_sessions_per_client``
  a new one is refused before anything is created. The address is the peer's as uvicorn
  gives it: behind a proxy listed in ``ServerConfig.forwarded_allow_ips`` (loopback, where
  the shipped nginx runs) the X-Forwarded-For client, so clients behind nginx are counted
  apart and not as one.
* ``SocketGuard``: an ASGI middleware that bounds the WebSocket connections a client
  address holds open at once, sessions or not, at ``SOCKETS_PER_SESSION_SLOT`` per session
  slot; past it an upgrade is answered 429. A world connection without a session takes
  no session slot and is bounded by the idle timeout only, so without this one client
  could open sockets faster than the timeout closes them until no file descriptor is left.

Event loop only, like ``LiveSessions``. How long a session may idle is
``realtime/endpoints/idle.py``'s.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Awaitable, Callable

from starlette.types import ASGIApp, Message, Scope
from starlette.websockets import WebSocket

from realtime.server.transport import refuse_upgrade

log = logging.getLogger(__name__)

# Open WebSocket connections a client address may hold per session slot
# (``--max-sessions-per-client``): 128 at the default 32; none while that limit is off.
SOCKETS_PER_SESSION_SLOT = 4


def client_address(ws: WebSocket) -> str:
    """The client's address as the per-client limit counts it."""
    return ws.client.host if ws.client is not None else "unknown"


class Slot:
    """One live session's hold on its client's count; ``give_back`` is idempotent."""

    def __init__(self, slots: ClientSlots, client: str) -> None:
        self._slots, self.client = slots, client
        self._held = True

    def give_back(self) -> None:
        if self._held:
            self._held = False
            self._slots._give_back(self.client)


class ClientSlots:
    """Live sessions per client address, at most ``limit`` each (0: no limit)."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"max sessions per client must be >= 0, got {limit}")
        self.limit = limit
        self._held: Counter[str] = Counter()

    def take(self, client: str) -> Slot | None:
        """A slot for one more session of ``client``, or None (then nothing changed)."""
        if self.limit and self._held[client] >= self.limit:
            return None
        self._held[client] += 1
        return Slot(self, client)

    def held(self, client: str) -> int:
        return self._held[client]

    def refusal(self, client: str) -> str:
        """The message for a refused session: the limit, by its option's name."""
        return (f"client {client} already holds {self._held[client]} live sessions, the limit per client "
                f"address (--max-sessions-per-client {self.limit}); close one first")

    def _give_back(self, client: str) -> None:
        self._held[client] -= 1
        if self._held[client] <= 0:
            del self._held[client]


class SocketGuard:
    """ASGI middleware: at most ``limit`` open WebSocket connections per client address
    (0: no limit); one over it is answered 429 before the app sees it."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.sockets = ClientSlots(limit)

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "websocket" or not self.sockets.limit:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        address = client[0] if client else "unknown"
        slot = self.sockets.take(address)
        if slot is None:
            limit = self.sockets.limit
            log.info("refused a WebSocket to %s from %s: %d connections open, the limit per client address",
                     scope.get("path"), address, limit)
            await refuse_upgrade(scope, receive, send, 429, f"client {address} already holds {limit} open WebSocket "
                                 f"connections, the limit per client address ({SOCKETS_PER_SESSION_SLOT} x "
                                 "--max-sessions-per-client); close one first\n")
            return
        try:
            await self.app(scope, receive, send)
        finally:
            slot.give_back()
