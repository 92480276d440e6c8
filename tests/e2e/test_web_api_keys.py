"""The demo page (clients/web/) against a server with API keys, in a real headless Chromium:
it asks for the key when ``/v1/models`` answers 401, refuses one that a subprotocol cannot
carry, says so when the server refuses one, and plays (world and speech) with the right one,
offering it as the subprotocol ``realtime.api-key.KEY``; a key in the fragment is used and
taken out of the address bar."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from models.policy import DummyPolicy
from models.world.tiny import TinyWorld
from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = [
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} missing: apt-get install chromium"),
    pytest.mark.timeout(120),
]

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "web"
KEY = "sk-web-7c41e0b9d2a35f68"
WRONG = "sk-web-0000000000000000"
STORED = "sessionStorage.getItem('realtime.api_key')"
REFUSED = "the server refused this key (HTTP 401 unauthorized): check it and try again"
CANNOT_SEND = "this key cannot be sent from a browser: a WebSocket subprotocol (RFC 6455) may hold only "
# Chromium's own console line for each 401 the page reads (a fetch answered 401 is not a failure here).
HTTP_401 = "Failed to load resource: the server responded with a status of 401 (Unauthorized)"


ROBOT_SOCKETS = """async () => {
  const openpi = await import("/web/openpi.js");
  const worldLink = await import("/web/world_link.js");
  const policy = await openpi.OpenPIClient.connect("robot-keyed");
  const camera = await worldLink.WorldLink.open("camera-keyed", {model: "tiny", seed: 0});
  const got = [policy.ws.protocol, policy.metadata !== null, camera.ws.protocol, camera.created.type];
  policy.close();
  camera.close();
  return got;
}"""


def _piper() -> tuple[Any, str | None]:
    try:
        from models.tts.piper.adapter import PiperTTS
        return PiperTTS.load(device="cpu", max_batch=4), None
    except Exception as exc:  # noqa: BLE001 - ImportError, TTSUnavailable (extra or voice missing) and friends
        return None, f"TTS voice unavailable: {type(exc).__name__}: {exc}"


@pytest.fixture(scope="module")
def keyed() -> Iterator[tuple[str, str | None]]:
    """A server with one API key: the tiny world, a dummy policy and, when it loads, the Piper voice."""
    inventory = Inventory()
    for adapter in (TinyWorld(max_batch=8), DummyPolicy(max_batch=2)):
        inventory.adapters[adapter.name] = adapter
    tts, why_no_tts = _piper()
    if tts is not None:
        inventory.adapters[tts.name] = tts
    app = build_app(ServerConfig(world=WorldConfig(models=("tiny",)), api_keys=(KEY,)), inventory)
    with serve(app) as addr:
        yield addr, why_no_tts


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Tab:
    """One page, recording console errors other than Chromium's line for each 401."""

    def __init__(self, browser: Any, url: str) -> None:
        self.page = browser.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text)
                     if m.type == "error" and m.text != HTTP_401 else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.goto(url)

    def js(self, expression: str) -> Any:
        return self.page.evaluate(f"() => {expression}")

    def wait(self, expression: str, timeout_s: float = 30.0) -> None:
        self.page.wait_for_function(expression, timeout=timeout_s * 1000)

    def wait_for_the_key_field(self) -> None:
        self.wait("window.demo && demo.auth.required && !document.getElementById('key-form').hidden")

    def submit_key(self, key: str) -> None:
        self.page.fill("#key-input", key)
        self.page.press("#key-input", "Enter")

    def key_error(self) -> str | None:
        return self.js("document.getElementById('key-error').hidden ? null "
                       ": document.getElementById('key-error').textContent")


def test_the_page_asks_for_the_key_refuses_a_wrong_one_and_plays_with_the_right_one(browser, keyed):
    addr, why_no_tts = keyed
    tab = Tab(browser, f"http://{addr}/")
    try:
        tab.wait_for_the_key_field()
        assert tab.page.locator("#key-form").is_visible()
        assert tab.page.locator("label[for=key-input]").text_content() == "This server needs an API key"
        assert tab.js("[demo.ready, demo.bootError, demo.auth.refusals, demo.world]") == [False, None, 0, None]
        assert tab.key_error() is None
        assert tab.js("document.activeElement.id") == "key-input"
        assert tab.js("document.getElementById('key-input').type") == "password"

        # Keys no subprotocol token can carry: refused in the page, no request made.
        for bad in ("sk web", "sk-ключ", 'sk"x', "sk,x", "sk/x", "sk=x", "sk:x"):
            tab.submit_key(bad)
            tab.wait("!document.getElementById('key-error').hidden")
            assert tab.key_error().startswith(CANNOT_SEND), bad
            assert tab.js(f"[demo.auth.refusals, {STORED}, demo.ready]") == [0, None, False]
            tab.js("document.getElementById('key-error').hidden = true")
        tab.submit_key("   ")
        tab.wait("!document.getElementById('key-error').hidden")
        assert tab.key_error() == "the key is empty"

        # A wrong key: the server's 401, said plainly; the field stays for another try.
        tab.submit_key(WRONG)
        tab.wait("demo.auth.refusals === 1")
        tab.wait_for_the_key_field()
        assert tab.key_error() == REFUSED
        assert tab.js("demo.auth.error") == REFUSED
        assert tab.js(f"[{STORED}, demo.ready, document.getElementById('key-input').value]") == [None, False, ""]
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        tab.page.locator("#key-form").screenshot(path=str(ARTIFACTS / "key-refused.png"))

        # The right key (pasted with a trailing newline's worth of space): the world plays over
        # a socket that offered it as a subprotocol, and the server answered `realtime`.
        tab.submit_key(f"{KEY} ")
        tab.wait("demo.ready && demo.world.chunkIndex >= 3")
        assert tab.page.locator("#key-form").is_hidden()
        assert tab.js("[demo.auth.refusals, demo.auth.error, demo.bootError]") == [1, None, None]
        assert tab.js("[demo.world.model, demo.world.lastError, demo.world.retries]") == ["tiny", None, 0]
        assert tab.js("demo.panels.world.ws.protocol") == "realtime"
        # Kept for this tab only: in sessionStorage, nothing in localStorage.
        assert tab.js(f"[{STORED}, localStorage.length]") == [KEY, 0]

        if why_no_tts is None:  # the speech panel too, when this machine has the voice
            tab.wait("demo.tts.connected && demo.tts.voice !== null")
            assert tab.js("demo.panels.speech.ws.protocol") == "realtime"
            tab.page.click("#speech-text")
            tab.page.keyboard.type("Keys work. ", delay=5)
            tab.wait("demo.tts.sentencesDone === 1")
            assert tab.js("demo.tts.chunks") >= 1 and tab.js("demo.tts.lastError") is None

        # A reload of the same tab keeps the key: no question this time.
        tab.page.reload()
        tab.wait("window.demo && demo.ready && demo.world.chunkIndex >= 0")
        assert tab.js("[demo.auth.required, demo.panels.world.ws.protocol]") == [False, "realtime"]
        assert tab.errors == []
    finally:
        tab.page.close()


def test_a_key_in_the_fragment_is_used_and_taken_out_of_the_address_bar(browser, keyed):
    addr, _ = keyed
    tab = Tab(browser, f"http://{addr}/?view=1#api_key={KEY}")
    try:
        tab.wait("window.demo && demo.ready && demo.world.chunkIndex >= 2")
        # Replaced, not pushed: the tab's history is about:blank and this page, neither with the key.
        assert tab.js("[location.href, location.hash, history.length]") == [f"http://{addr}/?view=1", "", 2]
        assert tab.js(f"[demo.auth.required, {STORED}, demo.panels.world.ws.protocol]") == [False, KEY, "realtime"]
        # The robot panel's two sockets (the policy over OpenPI, its camera world) carry it too.
        assert tab.page.evaluate(ROBOT_SOCKETS) == ["realtime", True, "realtime", "session.created"]
        assert tab.errors == []
    finally:
        tab.page.close()


def test_a_fragment_key_the_server_refuses_or_the_page_cannot_send(browser, keyed):
    addr, _ = keyed
    for fragment, message in ((f"api_key={WRONG}&x=1", REFUSED),
                              ("api_key=sk%20web", "the key in the address (#api_key=) was not used: " + CANNOT_SEND)):
        tab = Tab(browser, f"http://{addr}/#{fragment}")
        try:
            tab.wait_for_the_key_field()
            assert tab.key_error().startswith(message)
            # Taken out of the address bar either way; the fragment's other parameters stay.
            assert tab.js("location.hash") == ("#x=1" if "x=1" in fragment else "")
            assert tab.js(STORED) is None
            tab.submit_key(KEY)
            tab.wait("demo.ready && demo.world.chunkIndex >= 0")
            assert tab.errors == []
        finally:
            tab.page.close()
