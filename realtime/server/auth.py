"""Who may use the server: API keys, checked by an ASGI middleware (``ApiKeyGuard``).

With ``ServerConfig.api_keys`` set, every WebSocket handshake (any path) and every HTTP
request (``/v1/...`` and anything else) must carry one of the keys, except the open
paths: ``/healthz``, ``/livez``, ``/version``, the page (``/``, ``/web/...``) and
``/metrics`` (unless ``ServerConfig.metrics_require_key``). A key comes as any of

* ``Authorization: Bearer KEY`` (OpenAI-style clients; vLLM's ``--api-key`` checks this);
* ``Authorization: Api-Key KEY`` (what openpi-client's ``WebsocketClientPolicy(api_key=...)`` sends);
* the query parameter ``?api_key=KEY``;
* the WebSocket subprotocol ``realtime.api-key.KEY``, for browsers, whose ``WebSocket``
  cannot set headers: ``new WebSocket(url, ["realtime", "realtime.api-key." + key])``.
  Unlike the query string it stays out of proxies' access logs. A browser fails a
  handshake whose answer names none of the subprotocols it offered, so the accept
  names the first offered one that carries no key (``realtime`` above) or, when the
  key's is the only one, that one.

Without a valid key the request is answered 401 before the app sees it (a WebSocket: a
denial response instead of the upgrade), with ``WWW-Authenticate: Bearer`` and the code
``unauthorized``; ``on_refused`` counts it. A key mismatch is simply a 401, whatever
the bytes sent (empty, not ASCII, extra spaces): nothing is decoded that could fail.

Each offered key is compared with every configured one, without an early exit, by
``hmac.compare_digest`` on their SHA-256 digests: the time taken tells neither which
key matched nor how long the keys are. No log line holds any part of a key. uvicorn's
access lines print the query string, so the guard replaces an ``api_key`` value in the
scope itself (``api_key=redacted``) before anything is logged: the scope is the dict
uvicorn logs from, which is why it is changed in place rather than copied.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
from collections.abc import Iterable
from typing import Callable
from urllib.parse import unquote_plus

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from realtime.server.transport import refuse_upgrade

log = logging.getLogger(__name__)

UNAUTHORIZED = "unauthorized"
QUERY_PARAM = "api_key"
SUBPROTOCOL_PREFIX = "realtime.api-key."
# Authorization schemes that carry a key (compared in lower case, as RFC 9110 asks).
SCHEMES = (b"bearer", b"api-key")
OPEN_PATHS = frozenset({"/", "/healthz", "/livez", "/version"})
OPEN_PREFIXES = ("/web/",)
METRICS_PATH = "/metrics"
REDACTED = b"redacted"
# Keys one request may offer (headers, query values, subprotocols); more are not looked at.
MAX_OFFERED = 8

_CHALLENGE = ((b"www-authenticate", b"Bearer"),)
_HOW = ("a valid API key is required: Authorization: Bearer KEY (or Api-Key KEY), "
        f"?{QUERY_PARAM}=KEY, or the WebSocket subprotocol {SUBPROTOCOL_PREFIX}KEY")


def check_keys(keys: Iterable[str]) -> tuple[str, ...]:
    """``keys`` as given; ``ValueError`` for an empty one or one with whitespace or control
    characters (which no header carries intact). The error never quotes the key."""
    keys = tuple(keys)
    for n, key in enumerate(keys, 1):
        if not isinstance(key, str) or not key or any(c.isspace() or not c.isprintable() for c in key):
            raise ValueError(f"API key {n} of {len(keys)} is empty or holds whitespace or control characters")
    return keys


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def _is_key_param(name: bytes) -> bool:
    return unquote_plus(name.decode("latin-1")) == QUERY_PARAM


def query_keys(query: bytes) -> tuple[list[bytes], bytes]:
    """The ``api_key`` values of a raw query string (percent-decoded, UTF-8), and the query
    string with each of them replaced by ``redacted``."""
    if not query:
        return [], query
    keys, parts = [], []
    for part in query.split(b"&"):
        name, eq, value = part.partition(b"=")
        if eq and _is_key_param(name):
            keys.append(unquote_plus(value.decode("latin-1")).encode("utf-8", "replace"))
            part = name + b"=" + REDACTED
        parts.append(part)
    return keys, b"&".join(parts)


def offered_keys(scope: Scope) -> list[bytes]:
    """The keys a request offers, in every accepted form (at most ``MAX_OFFERED``). Redacts
    the query string's in ``scope`` (module docstring)."""
    offered = []
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            scheme, _, credential = value.partition(b" ")
            if scheme.lower() in SCHEMES and credential:
                offered.append(credential)
    in_query, redacted = query_keys(scope.get("query_string", b""))
    if in_query:
        scope["query_string"] = redacted
        offered += in_query
    if scope["type"] == "websocket":
        offered += [p[len(SUBPROTOCOL_PREFIX):].encode("utf-8", "replace") for p in scope.get("subprotocols", ())
                    if p.startswith(SUBPROTOCOL_PREFIX) and len(p) > len(SUBPROTOCOL_PREFIX)]
    return [key for key in offered if key][:MAX_OFFERED]


def _answering_subprotocol(offered: list[str], send: Send) -> Send:
    """``send`` whose accept names a subprotocol the client offered (module docstring)."""
    answer = next((p for p in offered if not p.startswith(SUBPROTOCOL_PREFIX)), offered[0])

    async def answering(message: Message) -> None:
        if message["type"] == "websocket.accept" and not message.get("subprotocol"):
            message = {**message, "subprotocol": answer}
        await send(message)

    return answering


class ApiKeyGuard:
    """ASGI middleware: refuse requests without one of ``keys`` (module docstring); no keys:
    everyone may, and the guard only redacts query keys and answers key subprotocols.
    ``on_refused`` is called with ``UNAUTHORIZED`` for each refusal (a metrics counter)."""

    def __init__(self, app: ASGIApp, keys: Iterable[str] = (), metrics_require_key: bool = False,
                 on_refused: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.digests = tuple(_digest(key.encode("utf-8")) for key in check_keys(keys))
        self.metrics_require_key = metrics_require_key
        self.on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        offered = offered_keys(scope)
        subprotocols = scope.get("subprotocols", ()) if scope["type"] == "websocket" else ()
        if any(p.startswith(SUBPROTOCOL_PREFIX) for p in subprotocols):
            send = _answering_subprotocol(list(subprotocols), send)
        if not self.digests or not self.needs_key(scope) or self.valid(offered):
            await self.app(scope, receive, send)
            return
        await self._refuse(scope, receive, send, len(offered))

    def needs_key(self, scope: Scope) -> bool:
        """Whether the request must carry a key (any WebSocket; HTTP off the open paths)."""
        if scope["type"] == "websocket":
            return True
        path, root = scope.get("path", ""), scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        if path == METRICS_PATH:
            return self.metrics_require_key
        return not (path in OPEN_PATHS or path.startswith(OPEN_PREFIXES))

    def valid(self, offered: list[bytes]) -> bool:
        """Whether any offered key is a configured one: every pair compared, no early exit."""
        ok = False
        for key in offered:
            digest = _digest(key)
            for known in self.digests:
                ok |= hmac.compare_digest(digest, known)
        return ok

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, offered: int) -> None:
        client = scope.get("client")
        peer = client[0] if client else "-"
        kind = "WebSocket" if scope["type"] == "websocket" else scope.get("method", "HTTP")
        if offered:
            log.warning("refused %s %s from %s: unauthorized (%d API key(s) offered, none valid)",
                        kind, scope.get("path"), peer, offered)
        else:
            log.info("refused %s %s from %s: unauthorized (no API key)", kind, scope.get("path"), peer)
        if self.on_refused is not None:
            self.on_refused(UNAUTHORIZED)
        if scope["type"] == "websocket":
            await refuse_upgrade(scope, receive, send, 401, f"{UNAUTHORIZED}: {_HOW}\n", headers=_CHALLENGE)
            return
        body = json.dumps({"error": {"code": UNAUTHORIZED, "message": _HOW}}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()), *_CHALLENGE]})
        await send({"type": "http.response.body", "body": body})


def warn_if_exposed(host: str, api_keys: Iterable[str]) -> bool:
    """Log one WARNING when the server listens beyond loopback (``host``) with no API key;
    True when it did."""
    if tuple(api_keys) or _is_loopback(host):
        return False
    log.warning("listening on %s with no API key: anyone who can reach this port can open sessions "
                "and run the models; set API keys (ServerConfig.api_keys) or listen on 127.0.0.1", host or "*")
    return True


def _is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
