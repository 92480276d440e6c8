"""Which web pages may open WebSockets to this server: an ASGI middleware on ``Origin``.

Browsers send ``Origin`` with every WebSocket handshake and, unlike ``fetch``, apply
no same-origin rule to WebSockets themselves, so without this check any page a user
visits could drive their local server. Python clients and robots send no ``Origin``
and are always allowed. A browser handshake is allowed when its origin is

* the server's own origin (``Origin`` names the same host and port as ``Host``)
  when that host is an IP address or ``localhost``: the demo page the server itself
  serves. A domain name must be listed: a DNS-rebinding page (its own domain made to
  resolve to this machine) sends its domain as ``Host`` and would match itself;
* a loopback origin (``http(s)://localhost``, ``127.x.x.x``, ``[::1]``, any port)
  when the allowed list holds the keyword ``loopback`` (the default);
* listed exactly (``https://app.example.com``), or anything when ``*`` is listed.

Anything else is refused with HTTP 403 before the upgrade.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from typing import Any, Awaitable, Callable, MutableMapping
from urllib.parse import urlsplit

from protocols.echo import clipped
from realtime.server.transport import refuse_upgrade

log = logging.getLogger(__name__)

# The keyword (in ``--allowed-origins``) for every loopback origin on any port.
LOOPBACK = "loopback"
ANY = "*"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]


def parse_allowed(spec: str) -> tuple[str, ...]:
    """``--allowed-origins`` text (comma-separated) as checked entries; ``ValueError``
    names the first entry that is neither an origin nor a keyword."""
    entries = tuple(e.strip() for e in spec.split(",") if e.strip())
    normalise_allowed(entries)
    return entries


def normalise_allowed(entries: Iterable[str]) -> tuple[str, ...]:
    out = []
    for entry in entries:
        normal = entry if entry in (LOOPBACK, ANY) else _normalise(entry)
        if normal is None:
            raise ValueError(f"not an origin: {entry!r} (want scheme://host[:port], {LOOPBACK!r} or {ANY!r})")
        out.append(normal)
    return tuple(out)


def _normalise(origin: str) -> str | None:
    """``scheme://host:port`` with the default port made explicit, or None."""
    try:
        parts = urlsplit(origin.strip().lower())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        return None
    port = port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port}"


def _is_address(host: str) -> bool:
    """An IP literal or a loopback name: a host no DNS answer can rebind."""
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return _is_loopback(host)


def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def origin_allowed(origin: str | None, host_header: str | None, allowed: Iterable[str]) -> bool:
    """The rule of the module docstring; ``origin`` None: no ``Origin`` header;
    ``allowed`` as :func:`normalise_allowed` returns it."""
    if origin is None:
        return True
    allowed = tuple(allowed)
    if ANY in allowed:
        return True
    normal = _normalise(origin)
    if normal is None:  # "null" (file:// pages, sandboxed frames) or garbage
        return False
    if normal in allowed:
        return True
    scheme = normal.split("://", 1)[0]
    hostname = urlsplit(normal).hostname or ""
    if host_header and _normalise(f"{scheme}://{host_header}") == normal and _is_address(hostname):
        return True
    return LOOPBACK in allowed and _is_loopback(hostname)


class OriginGuard:
    """ASGI middleware: refuse WebSocket handshakes from origins not allowed (403)."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str]) -> None:
        self.app = app
        self.allowed = normalise_allowed(allowed)

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())
                   if k in (b"origin", b"host")}
        origin = headers.get("origin")
        if origin_allowed(origin, headers.get("host"), self.allowed):
            await self.app(scope, receive, send)
            return
        shown = clipped(origin, 200)  # a client's text: bounded
        log.warning("refused a WebSocket to %s from origin %r (not in --allowed-origins)",
                    scope.get("path"), shown)
        await refuse_upgrade(scope, receive, send, 403, f"origin {shown!r} is not allowed (see --allowed-origins)\n")
