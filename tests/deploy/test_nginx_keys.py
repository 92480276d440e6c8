"""API keys through the replica nginx (deploy/nginx/realtime.conf.template): its access log
never holds a key given in the query, routing on ``?session_id=`` still works beside one, and
the ``Authorization`` and ``Sec-WebSocket-Protocol`` headers reach the replicas untouched.

Two real replicas with one API key behind real nginx on loopback."""

from __future__ import annotations

import asyncio
import time
from typing import Iterator

import httpx
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from clients.world import WorldClient
from deploy.replicas import Deployment
from tests.deploy.conftest import SERVE_ARGS, requires_nginx

pytestmark = requires_nginx

KEY = "sk-nginx-3f9a1c7e5b2d4608"
WRONG = "sk-nginx-wrong-000000000"
WORLD = "/v1/realtime/world"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory) -> Iterator[Deployment]:
    # A key file, not --api-key: a flag shows in ps.
    key_file = tmp_path_factory.mktemp("keys") / "keys"
    key_file.write_text(f"{KEY}\n")
    with Deployment(2, serve_args=[*SERVE_ARGS, "--api-key-file", str(key_file)]) as deployment:
        yield deployment


def upstream(response_headers) -> str:
    """The replica that answered ($upstream_addr lists every one tried, the last answered)."""
    return response_headers["X-Upstream"].split(",")[-1].strip()


def access_log_after(deployment: Deployment, lines: int, timeout_s: float = 10.0) -> str:
    """The access log once it has ``lines`` lines (a WebSocket's is written when it closes)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = deployment.nginx.access_log()
        if text.count("\n") >= lines or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def test_the_access_log_holds_no_query_key_and_session_id_routing_still_works(keyed: Deployment):
    addr = keyed.addr
    before = keyed.nginx.access_log().count("\n")
    where: dict[str, set[str]] = {}
    with httpx.Client(base_url=f"http://{addr}", timeout=10) as http:
        for n in range(16):
            sid = f"logged-{n}"
            for query in (f"api_key={KEY}&session_id={sid}", f"session_id={sid}&api_key={KEY}",
                          f"api%5Fkey={KEY}&session_id={sid}"):  # the replicas decode the name too
                r = http.get(f"/v1/models?{query}")
                assert r.status_code == 200, (query, r.text)
                where.setdefault(sid, set()).add(upstream(r.headers))
        refused = http.get(f"/v1/models?api_key={WRONG}&session_id=logged-0",
                           headers={"Referer": f"http://{addr}/?api_key={KEY}&x=1"})
        assert refused.status_code == 401
        assert upstream(refused.headers) in where["logged-0"]
    # Every request of a session reached one replica, and the sessions spread over both.
    assert all(len(replicas) == 1 for replicas in where.values()), where
    assert set.union(*where.values()) == {r.addr for r in keyed.replicas}

    async def socket() -> str:
        url = f"ws://{addr}{WORLD}?session_id=logged-0&api_key={KEY}"
        async with WorldClient.connect(url, session_id="logged-0") as client:
            assert (await client.create(credits=1, format="rgb8"))["type"] == "session.created"
            assert (await client.next_chunk(credit=False)).chunk_index == 0
            return upstream(client.ws.response.headers)

    assert asyncio.run(asyncio.wait_for(socket(), 30)) in where["logged-0"]

    log = access_log_after(keyed, before + 16 * 3 + 2)
    new = log.splitlines()[before:]
    assert len(new) == 16 * 3 + 2, new
    for secret in (KEY, WRONG, KEY[-8:], WRONG[-8:], "api_key", "api%5Fkey"):
        assert secret not in log, secret
    first = new[0]
    assert '"GET /v1/models HTTP/1.1" 200 ' in first and 'session_id="logged-0"' in first, first
    assert f'upstream={next(iter(where["logged-0"]))}' in first, first
    assert '"GET /v1/models HTTP/1.1" 401 ' in new[-2] and f'"http://{addr}/"' in new[-2], new[-2]
    assert f'"GET {WORLD} HTTP/1.1" 101 ' in new[-1] and 'session_id="logged-0"' in new[-1], new[-1]


def test_authorization_and_subprotocol_headers_reach_the_replicas(keyed: Deployment):
    addr = keyed.addr
    models = f"http://{addr}/v1/models"
    refused = httpx.get(models, timeout=10)
    assert (refused.status_code, refused.headers["WWW-Authenticate"]) == (401, "Bearer")
    assert refused.json()["error"]["code"] == "unauthorized"
    assert httpx.get(models, headers={"Authorization": f"Bearer {WRONG}"}, timeout=10).status_code == 401
    assert httpx.get(models, headers={"Authorization": f"Bearer {KEY}"}, timeout=10).status_code == 200
    assert httpx.get(models, headers={"Authorization": f"Api-Key {KEY}"}, timeout=10).status_code == 200
    assert httpx.get(f"http://{addr}/healthz", timeout=10).status_code == 200  # open without a key

    async def main() -> None:
        url = f"ws://{addr}{WORLD}?session_id=hdr"
        for kwargs in ({}, {"additional_headers": {"Authorization": f"Bearer {WRONG}"}},
                       {"subprotocols": ["realtime", f"realtime.api-key.{WRONG}"]}):
            with pytest.raises(InvalidStatus) as info:
                async with websockets.connect(url, **kwargs):
                    pass
            assert info.value.response.status_code == 401, kwargs
            assert info.value.response.body.startswith(b"unauthorized: ")
        for n, kwargs in enumerate(({"additional_headers": {"Authorization": f"Bearer {KEY}"}},
                                    {"subprotocols": ["realtime", f"realtime.api-key.{KEY}"]})):
            async with WorldClient.connect(f"ws://{addr}{WORLD}?session_id=hdr-{n}", session_id=f"hdr-{n}",
                                           **kwargs) as client:
                assert (await client.create(credits=1, format="rgb8"))["type"] == "session.created"
                assert (await client.next_chunk(credit=False)).chunk_index == 0
                assert client.ws.subprotocol == ("realtime" if "subprotocols" in kwargs else None)

    asyncio.run(asyncio.wait_for(main(), 60))
    # Neither header form is in nginx's log.
    assert KEY not in keyed.nginx.access_log() and KEY not in keyed.nginx.error_log()
