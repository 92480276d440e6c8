"""API keys (realtime/server/auth.py) through a real uvicorn server: HTTP, a real websockets
client, the real ``openpi-client`` with ``api_key=``, a headless Chromium offering the key
as a subprotocol, the log lines and the refusal counter."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Iterator

import httpx
import numpy as np
import pytest
import websockets
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import InvalidStatus

from clients.world import WorldClient
from models.policy import DummyPolicy
from models.world.tiny import TinyWorld
from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS

KEY = "sk-e2e-5d1c9f3a7b2e4680"
WRONG = "sk-e2e-0000000000000000"
WORLD = "/v1/realtime/world"


def keyed_app(**config: object):
    inventory = Inventory()
    for adapter in (TinyWorld(), DummyPolicy(max_batch=2)):
        inventory.adapters[adapter.name] = adapter
    return build_app(ServerConfig(world=WorldConfig(models=("tiny",)), api_keys=(KEY,), **config), inventory)


@pytest.fixture(scope="module")
def addr() -> Iterator[str]:
    # log_level info: uvicorn's access and WebSocket lines are emitted, for the log checks.
    with serve(keyed_app(), log_level="info") as addr:
        yield addr


def refusals(addr: str) -> float:
    text = httpx.get(f"http://{addr}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "realtime_refusals_total" and sample.labels == {"code": "unauthorized"}:
                return sample.value
    raise KeyError("realtime_refusals_total")


def robot_obs(policy: DummyPolicy) -> dict:
    meta = policy.metadata
    h, w = meta.image_resolution
    obs: dict = {key: np.zeros((h, w, 3), np.uint8) for key in meta.image_keys}
    obs[meta.state_key] = np.zeros(meta.state_dim, np.float32)
    obs[meta.prompt_key] = "go"
    return obs


def test_http_paths(addr):
    assert httpx.get(f"http://{addr}/healthz").text == "OK"
    assert httpx.get(f"http://{addr}/livez").status_code in (200, 404)  # open either way, never 401
    assert httpx.get(f"http://{addr}/metrics").status_code == 200
    assert httpx.get(f"http://{addr}/").status_code == 200
    refused = httpx.get(f"http://{addr}/v1/models")
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert refused.json()["error"]["code"] == "unauthorized"
    assert httpx.get(f"http://{addr}/v1/models", headers={"Authorization": f"Bearer {WRONG}"}).status_code == 401
    ok = httpx.get(f"http://{addr}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and {m["id"] for m in ok.json()["data"]} >= {"tiny"}
    assert httpx.get(f"http://{addr}/v1/models", params={"api_key": KEY}).status_code == 200


def test_websocket_refused_401_before_the_upgrade_then_served_with_a_key(addr):
    async def main() -> None:
        for kwargs in ({}, {"additional_headers": {"Authorization": f"Bearer {WRONG}"}},
                       {"subprotocols": [f"realtime.api-key.{WRONG}"]}):
            with pytest.raises(InvalidStatus) as info:
                async with websockets.connect(f"ws://{addr}{WORLD}", **kwargs):
                    pass
            response = info.value.response
            assert response.status_code == 401 and response.headers["WWW-Authenticate"] == "Bearer"
            assert response.body.startswith(b"unauthorized: ")
        base = f"ws://{addr}{WORLD}"
        keyed = [(base, {"additional_headers": {"Authorization": f"Bearer {KEY}"}}),
                 (base, {"additional_headers": {"Authorization": f"Api-Key {KEY}"}}),
                 (f"{base}?api_key={KEY}", {}),
                 (base, {"subprotocols": ["realtime", f"realtime.api-key.{KEY}"]})]
        for n, (url, kwargs) in enumerate(keyed):
            async with WorldClient.connect(url, session_id=f"keyed-{n}", **kwargs) as client:
                created = await client.create(credits=1, format="rgb8")
                assert created["type"] == "session.created"
                assert (await client.next_chunk(credit=False)).chunk_index == 0
                if "subprotocols" in kwargs:
                    assert client.ws.subprotocol == "realtime"

    before = refusals(addr)
    asyncio.run(asyncio.wait_for(main(), 60))
    assert refusals(addr) == before + 3


def test_openpi_client_with_api_key(addr):
    host, port = addr.rsplit(":", 1)
    policy = DummyPolicy()
    with pytest.raises(InvalidStatus) as info:
        WebsocketClientPolicy(host, int(port), api_key=WRONG)
    assert info.value.response.status_code == 401
    with pytest.raises(InvalidStatus):
        WebsocketClientPolicy(host, int(port))
    robot = WebsocketClientPolicy(host, int(port), api_key=KEY)  # "/" as the reference server; Api-Key header
    try:
        assert robot.get_server_metadata()["action_horizon"] == policy.metadata.action_horizon
        assert np.asarray(robot.infer(robot_obs(policy))["actions"]).shape == (
            policy.metadata.action_horizon, policy.metadata.action_dim)
    finally:
        robot._ws.close()
    robot = WebsocketClientPolicy(f"ws://{addr}/v1/realtime/robot/openpi", api_key=KEY)
    try:
        assert "actions" in robot.infer(robot_obs(policy))
    finally:
        robot._ws.close()


def test_no_key_reaches_a_log_line(addr, caplog):
    caplog.set_level(logging.INFO)

    async def main() -> None:
        with pytest.raises(InvalidStatus):
            async with websockets.connect(f"ws://{addr}{WORLD}?session_id=a&api_key={WRONG}"):
                pass
        async with websockets.connect(f"ws://{addr}{WORLD}?session_id=b&api_key={KEY}"):
            pass

    asyncio.run(asyncio.wait_for(main(), 30))
    httpx.get(f"http://{addr}/v1/models", params={"api_key": KEY})
    httpx.get(f"http://{addr}/v1/models", params={"api_key": WRONG})
    # The server's lines (the clients' own, httpx's request line, show what they sent).
    text = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith(("uvicorn", "realtime")))
    # uvicorn's own lines (WebSocket accepted / 401, the HTTP access line) show the query, redacted.
    assert "/v1/realtime/world?session_id=a&api_key=redacted" in text
    assert "/v1/realtime/world?session_id=b&api_key=redacted" in text
    assert "GET /v1/models?api_key=redacted" in text
    assert "unauthorized" in text
    for piece in (KEY, WRONG, KEY[-8:], WRONG[-8:], "5d1c9f3a"):
        assert piece not in text, piece


def test_metrics_behind_the_key_when_asked():
    with serve(keyed_app(metrics_require_key=True)) as addr:
        assert httpx.get(f"http://{addr}/metrics").status_code == 401
        assert httpx.get(f"http://{addr}/metrics", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert httpx.get(f"http://{addr}/healthz").status_code == 200


# ---------------------------------------------------------------------------- a real browser
OPEN_SOCKET = """async ([url, protocols]) => await new Promise((resolve) => {
  const ws = protocols === null ? new WebSocket(url) : new WebSocket(url, protocols);
  ws.onopen = () => { resolve({open: true, protocol: ws.protocol}); ws.close(); };
  ws.onerror = () => resolve({open: false, protocol: null});
})"""


@pytest.mark.timeout(120)
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} missing: apt-get install chromium")
def test_a_browser_connects_with_the_key_as_a_subprotocol(addr):
    """Chromium fails a handshake whose answer names none of the subprotocols it offered:
    the guard's accept names one, and the page's own origin passes the Origin check."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    url = f"ws://{addr}{WORLD}"
    cases = [
        ([url, ["realtime", f"realtime.api-key.{KEY}"]], {"open": True, "protocol": "realtime"}),
        ([url, [f"realtime.api-key.{KEY}"]], {"open": True, "protocol": f"realtime.api-key.{KEY}"}),
        ([f"{url}?api_key={KEY}", None], {"open": True, "protocol": ""}),
        ([url, ["realtime", f"realtime.api-key.{WRONG}"]], {"open": False, "protocol": None}),
        ([url, None], {"open": False, "protocol": None}),
    ]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"http://{addr}/healthz")  # the server's own origin, no key needed
            got = [page.evaluate(OPEN_SOCKET, args) for args, _ in cases]
        finally:
            browser.close()
    assert got == [want for _, want in cases]
