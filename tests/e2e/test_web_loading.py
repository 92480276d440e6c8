"""The demo page against a server still loading its models (realtime/server/loading.py), in a
real headless Chromium: a progress line instead of a page that hangs, then the world plays once
the model is in. The slow model is a tiny world whose build waits for the test."""

from __future__ import annotations

import os
import threading
from typing import Any, Iterator

import pytest

from models.world.tiny import TinyWorld
from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.inventory import Planned
from realtime.server.loading import Loading
from tests.e2e.conftest import serve
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = [
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} missing: apt-get install chromium"),
    pytest.mark.timeout(120),
]

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")

GB = 1_000_000_000


@pytest.fixture
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def test_the_page_shows_the_load_then_plays_when_the_model_is_in(browser):
    release = threading.Event()

    def slow(progress) -> TinyWorld:
        progress("reading checkpoint", 2 * GB, 8 * GB)
        if not release.wait(60):
            raise RuntimeError("the test never released the build")
        return TinyWorld()

    app = build_app(ServerConfig(world=WorldConfig(models=("tiny",))),
                    loading=Loading([Planned("slow-world", "world", slow)]))
    with serve(app) as addr:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            page.goto(f"http://{addr}/")
            page.wait_for_function("window.demo && window.demo.loading.length > 0", timeout=30_000)
            assert page.locator("#loading").is_visible()
            assert page.locator("#loading").text_content() == "loading slow-world: reading checkpoint, 2.0 of 8.0 GB …"
            assert page.evaluate("window.demo.ready") is False  # no panel has tried to connect
            page.wait_for_function("document.getElementById('health').textContent.startsWith('server: loading')",
                                   timeout=30_000)

            release.set()
            page.wait_for_function("window.demo.ready || window.demo.bootError", timeout=60_000)
            assert page.evaluate("window.demo.bootError") is None
            page.wait_for_function("window.demo.world.connected && window.demo.world.chunkIndex >= 1", timeout=60_000)
            assert not page.locator("#loading").is_visible()
            assert page.evaluate("window.demo.loading") == ["loading slow-world: reading checkpoint, 2.0 of 8.0 GB …"]
            assert page.evaluate("window.demo.world.model") == "tiny"
            assert page.locator("#health").text_content() == "server: ok"
            assert errors == []
        finally:
            release.set()
            page.close()
