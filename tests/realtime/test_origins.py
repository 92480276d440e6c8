"""realtime/server/origins.py: the Origin rule, and the guard on a real server with a real client."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from models.world.tiny import TinyWorld
from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.origins import LOOPBACK, normalise_allowed, origin_allowed, parse_allowed
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve

OWN = "127.0.0.1:8000"


@pytest.mark.parametrize(
    ("origin", "allowed", "ok"),
    [
        (None, (), True),  # Python clients and robots send no Origin
        ("http://127.0.0.1:8000", (), True),  # the server's own page
        ("HTTP://127.0.0.1:8000/", (), True),
        ("http://127.0.0.1:8001", (), False),
        ("http://localhost:5173", (LOOPBACK,), True),
        ("https://127.0.0.9", (LOOPBACK,), True),
        ("http://[::1]:3000", (LOOPBACK,), True),
        ("http://app.localhost", (LOOPBACK,), True),
        ("http://localhost:5173", (), False),
        ("https://evil.example", (LOOPBACK,), False),
        ("http://127.0.0.1.evil.example", (LOOPBACK,), False),
        ("null", (LOOPBACK,), False),  # file:// pages and sandboxed frames
        ("https://app.example.com", ("https://app.example.com",), True),
        ("https://app.example.com:443", ("https://app.example.com",), True),
        ("http://app.example.com", ("https://app.example.com",), False),
        ("https://evil.example", ("*",), True),
    ],
)
def test_origin_rule(origin, allowed, ok):
    assert origin_allowed(origin, OWN, normalise_allowed(allowed)) is ok


@pytest.mark.parametrize(
    ("origin", "host", "ok"),
    [
        ("http://192.168.1.5:8000", "192.168.1.5:8000", True),  # the page, reached over the LAN
        ("http://[fe80::1]:8000", "[fe80::1]:8000", True),
        ("http://localhost:8000", "localhost:8000", True),
        # DNS rebinding: a page on evil.example, resolved to this machine, sends its own Host.
        ("http://evil.example:8000", "evil.example:8000", False),
        ("https://demo.example.com", "demo.example.com", False),  # behind a proxy: list it
    ],
)
def test_own_origin_needs_an_address_as_host(origin, host, ok):
    assert origin_allowed(origin, host, ()) is ok
    assert origin_allowed(origin, host, normalise_allowed([origin])) is True


def test_parse_allowed():
    assert parse_allowed(" loopback, https://a.example ,") == ("loopback", "https://a.example")
    assert normalise_allowed(parse_allowed("https://a.example")) == ("https://a.example:443",)
    with pytest.raises(ValueError, match="not an origin: 'a.example'"):
        parse_allowed("loopback,a.example")


def app_with(allowed: tuple[str, ...] | None = None):
    model = TinyWorld()
    inventory = Inventory()
    inventory.adapters[model.name] = model
    kw = {} if allowed is None else {"allowed_origins": allowed}
    return build_app(ServerConfig(world=WorldConfig(models=("tiny",)), **kw), inventory)


async def handshake(addr: str, origin: str | None, session_id: str) -> int:
    """The HTTP status of a world.v1 handshake (101 when the socket opened and works)."""
    url = f"ws://{addr}/v1/realtime/world"
    try:
        async with websockets.connect(url, origin=origin) as ws:
            await ws.send(json.dumps({"type": "session.create", "session_id": session_id, "credits": 0}))
            assert json.loads(await ws.recv())["type"] == "session.created"
            return 101
    except websockets.InvalidStatus as exc:
        assert b"is not allowed" in exc.response.body
        return exc.response.status_code


def statuses(addr: str, origins: list[str | None]) -> list[int]:
    async def main():
        return [await handshake(addr, o, f"o{i}") for i, o in enumerate(origins)]

    return asyncio.run(asyncio.wait_for(main(), 60))


def test_default_allows_own_loopback_and_no_origin_and_refuses_others(caplog):
    with serve(app_with()) as addr:
        got = statuses(addr, [None, f"http://{addr}", "http://localhost:5173",
                              "https://evil.example", "null"])
    assert got == [101, 101, 101, 403, 403]
    refused = [r for r in caplog.records if r.name == "realtime.server.origins"]
    assert [r.getMessage() for r in refused] == [
        "refused a WebSocket to /v1/realtime/world from origin 'https://evil.example' (not in --allowed-origins)",
        "refused a WebSocket to /v1/realtime/world from origin 'null' (not in --allowed-origins)",
    ]


def test_an_explicit_list_replaces_loopback_but_keeps_the_own_origin():
    with serve(app_with(("https://app.example.com",))) as addr:
        got = statuses(addr, ["https://app.example.com", f"http://{addr}", "http://localhost:5173", None])
    assert got == [101, 101, 403, 101]
