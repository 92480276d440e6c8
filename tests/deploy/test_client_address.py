"""Behind nginx the per-client session limit counts the client nginx names, not nginx.

One real replica with ``--max-sessions-per-client 1`` behind real nginx. nginx connects to
the replica from loopback (a trusted proxy by default, ``--forwarded-allow-ips``) and sets
``X-Forwarded-For`` (``$proxy_add_x_forwarded_for``): it appends the peer it saw. The test
clients all run on loopback, so clients on other hosts are played by a first hop that already
names them in ``X-Forwarded-For`` (as a load balancer in front of nginx would).
"""

from __future__ import annotations

import asyncio
import json
from typing import Iterator

import pytest
import websockets

from deploy.replicas import Deployment
from tests.deploy.conftest import SERVE_ARGS, requires_nginx

pytestmark = requires_nginx


@pytest.fixture(scope="module")
def one_per_client() -> Iterator[Deployment]:
    with Deployment(1, serve_args=[*SERVE_ARGS, "--max-sessions-per-client", "1"]) as deployment:
        yield deployment


async def create(addr: str, sid: str, forwarded_for: str | None) -> tuple[websockets.ClientConnection, dict]:
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else None
    ws = await websockets.connect(f"ws://{addr}/v1/realtime/world?session_id={sid}", additional_headers=headers)
    await ws.send(json.dumps({"type": "session.create", "session_id": sid, "format": "rgb8", "credits": 0}))
    return ws, json.loads(await ws.recv())


def test_clients_behind_nginx_are_counted_apart(one_per_client: Deployment):
    async def main() -> None:
        addr = one_per_client.addr
        a, first = await create(addr, "xff-a", "198.51.100.7")
        b, second = await create(addr, "xff-b", "198.51.100.8")
        local, third = await create(addr, "xff-local", None)  # nginx names the loopback client itself
        assert [m["type"] for m in (first, second, third)] == ["session.created"] * 3
        again, refused = await create(addr, "xff-a2", "198.51.100.7")
        assert refused["type"] == "error" and refused["code"] == "too_many_sessions"
        assert "client 198.51.100.7 already holds 1" in refused["message"]
        assert "--max-sessions-per-client 1" in refused["message"]
        for ws in (a, b, local, again):
            await ws.close()

    asyncio.run(asyncio.wait_for(main(), 60))
