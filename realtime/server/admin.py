"""Operator endpoints over the live sessions of every kind (``realtime/endpoints/connection.py``).

* ``GET /v1/sessions``: ``{"object": "list", "data": [{kind, session_id, model, state,
  chunk_index, last_tick}]}`` for every live session of this server process.
* ``DELETE /v1/sessions/{kind}/{session_id}``: close one session. Its client gets the
  protocol's ``closed_by_admin`` error (OpenPI: a text frame, which the real client
  raises) and then the socket closes with ``CLOSE_ADMIN`` (1008). 200 with the closed
  session's entry, 404 for no such live session.

Both answer only clients whose address ``ServerConfig.admin_from`` allows (loopback by
default: session ids let a caller close sessions, so they are not for the public);
others get 403. Behind a trusted proxy (``ServerConfig.forwarded_allow_ips``, loopback by
default) the address checked is the client the proxy names in X-Forwarded-For; the shipped
nginx config answers these paths 403 on its public side besides (deploy/nginx/).
"""

from __future__ import annotations

import functools
import ipaddress
import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from protocols.echo import shown
from realtime.endpoints.live import LiveSessions

log = logging.getLogger(__name__)

LOOPBACK = "loopback"  # any 127.0.0.0/8 or ::1 client
ANYONE = "*"


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _network(entry: str) -> IPNetwork | None:
    """The network an entry names (an address is its own /32 or /128), None for a keyword
    or anything else."""
    if entry in (LOOPBACK, ANYONE):
        return None
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return None


def admin_entry_valid(entry: str) -> bool:
    """Whether ``entry`` is something ``admin_allowed`` can match: an IP address, a network
    (``10.0.0.0/8``), ``LOOPBACK`` or ``ANYONE``."""
    return entry in (LOOPBACK, ANYONE) or _network(entry) is not None


@functools.lru_cache(maxsize=8)
def _networks(allowed: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    """The networks of an ``admin_from`` (parsed once per config, not per request)."""
    return tuple(n for n in map(_network, allowed) if n is not None)


def admin_allowed(host: str | None, allowed: tuple[str, ...]) -> bool:
    """Whether a client at ``host`` may use the admin endpoints."""
    if ANYONE in allowed:
        return True
    if host is None:
        return False
    if host in allowed:  # also a host name, as a test client has
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if LOOPBACK in allowed and address.is_loopback:
        return True
    return any(address in network for network in _networks(allowed))


def _forbidden(request: Request) -> Response | None:
    host = request.client.host if request.client else None
    if admin_allowed(host, request.app.state.config.admin_from):
        return None
    return JSONResponse({"error": {"code": "forbidden", "message": f"admin endpoints are not open to {host}"}},
                        status_code=403)


async def list_sessions(request: Request) -> Response:
    if (refused := _forbidden(request)) is not None:
        return refused
    live: LiveSessions = request.app.state.live_sessions
    return JSONResponse({"object": "list", "data": live.sessions()})


async def close_session(request: Request) -> Response:
    if (refused := _forbidden(request)) is not None:
        return refused
    live: LiveSessions = request.app.state.live_sessions
    kind, sid = request.path_params["kind"], request.path_params["session_id"]
    entry = live.find(kind, sid)
    owner = entry.owner if entry is not None else None
    if entry is None or owner is None:
        return JSONResponse({"error": {"code": "no_session", "message": f"no live {kind} session {shown(sid)}"}},
                            status_code=404)
    log.info("session %s: closed by admin (%s)", sid, request.client.host if request.client else "?")
    await owner.admin_close(sid)
    return JSONResponse(entry.to_json())


ROUTES = [
    Route("/v1/sessions", list_sessions, methods=["GET"]),
    Route("/v1/sessions/{kind}/{session_id:path}", close_session, methods=["DELETE"]),
]
