"""The demo page opens its world and speech connections again by itself (clients/web/reconnect.js).

Real Chromium against real uvicorn servers: one is stopped (it drains, closing every socket
with 1001) and a new one started on the same port, as a restart does; the page must be back
without a click. Closes that a retry cannot fix (an operator's 1008, an idle 4408) and the
close button leave it disconnected with its reconnect button.
"""

from __future__ import annotations

import contextlib
import re
import time
from typing import Any, Sequence

import httpx

from models.tts.base import TTSAdapter, TTSWork, WindowAudio
from models.world.tiny import TinyWorld
from realtime.server.app import build_app
from realtime.server.config import LimitsConfig, ServerConfig, WorldConfig
from realtime.server.inventory import Inventory
from realtime.server.server import free_port, serve_in_thread
from tests.e2e.conftest import serve
from tests.e2e.test_web import Page, browser, pytestmark  # noqa: F401 - the shared fixture

RATE = 22050
# From a server's stop to the page's next working session: the waits of the first retries
# (0.5 + 1 + 2 + 4 s at most) cover a restart of several seconds on a busy machine.
BACK_WITHIN_S = 20.0
# Chromium reports each refused connection of a retry on the console; nothing else may be there.
REFUSED = re.compile(r"WebSocket connection to 'ws://127\.0\.0\.1:\d+/v1/realtime/(world|tts)\?session_id=[\w-]+' "
                     r"failed")


class SilentVoice(TTSAdapter):
    """A voice that says nothing (one short silent window a sentence). These tests watch the
    speech socket, not the audio, and the joe voice takes ~30 s to load on two cores."""

    name = "silent"
    voices = ("silent",)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "voices": [{"name": "silent", "sample_rate": RATE}],
                "sample_rates": list(self.sample_rates), "formats": ["pcm16"], "max_batch": self.max_batch}

    def synthesize_batch(self, works: Sequence[TTSWork]) -> list[WindowAudio]:
        n = RATE // 10
        return [WindowAudio(w.session_id, w.utterance_index, w.sentence_index, 0, bytes(2 * n), n, RATE, True, n)
                for w in works]


def voiced_app(**limits: Any) -> Any:
    """The tiny world and the silent voice."""
    inventory = Inventory()
    for model in (TinyWorld(), SilentVoice()):
        inventory.adapters[model.name] = model
    config = ServerConfig(world=WorldConfig(models=("tiny",)), limits=LimitsConfig(**limits))
    return build_app(config, inventory)


def serve_at(app: Any, port: int) -> Any:
    """Serve on a given port, so that a second server can take the first one's place
    (asyncio's listener sets SO_REUSEADDR: the old connections' TIME_WAIT does not block it).
    Leaving the block stops the server as SIGTERM does: drain, then exit."""
    return serve_in_thread(app, port=port)


def other_console_errors(p: Page) -> list[str]:
    return [e for e in p.console_errors if not REFUSED.match(e)]


BOTH_UP = ("demo.world.connected && demo.world.sessionId !== null && demo.world.chunkIndex >= 2"
           " && demo.tts.connected && demo.tts.voice === 'silent'")


def test_world_and_speech_come_back_by_themselves_after_a_restart(browser):
    port = free_port()
    with contextlib.ExitStack() as cleanup:
        with serve_at(voiced_app(), port) as addr:
            p = Page(browser, addr)
            cleanup.callback(p.close)
            p.wait(BOTH_UP)
            first = p.js("demo.world.sessionId")
        # The old server drained (1001 on both sockets) and is gone: the page counts down.
        status = "document.getElementById('hud-status').textContent"
        speech_status = "document.getElementById('speech-status').textContent"
        counting = "/^reconnecting in \\d+\\.\\d s…$/"
        p.wait(f"{counting}.test({status}) && {counting}.test({speech_status})")
        assert p.shown("#world-reconnect") and p.shown("#speech-reconnect")
        world = p.js("demo.world")
        assert "connection lost (close code 1001: server shutting down)" in [e["message"] for e in world["errors"]]
        assert (world["connected"], world["sessionId"], world["retryStopped"]) == (False, None, None)
        with serve_at(voiced_app(), port):
            p.wait(BOTH_UP, timeout_s=BACK_WITHIN_S)  # no click
            world, tts = p.js("demo.world"), p.js("demo.tts")
            # A new session under a fresh id, as the reconnect button makes.
            assert world["sessionId"] != first and world["sessionId"].startswith("web-")
            assert world["retries"] >= 1 and tts["retries"] >= 1
            assert world["lastError"] is None and tts["lastError"] is None
            assert p.js(status) == f"session {world['sessionId']} on tiny"
            assert p.js(speech_status) == f"ready: silent @ {RATE} Hz"
            assert [p.shown(s) for s in ("#world-reconnect", "#speech-reconnect", "#world-error", "#speech-error")] \
                == [False, False, False, False]
            assert other_console_errors(p) == []


def test_the_close_button_stops_the_world_panel_reconnecting(browser):
    port = free_port()
    with contextlib.ExitStack() as cleanup:
        with serve_at(voiced_app(), port) as addr:
            p = Page(browser, addr)
            cleanup.callback(p.close)
            p.wait(BOTH_UP)
        # Clicked while a retry waits or is connecting (the button works in both).
        p.wait("demo.panels.world.retry.pending || demo.panels.world.ws?.readyState === WebSocket.CONNECTING")
        p.page.click("#world-close")
        assert p.js("document.getElementById('hud-status').textContent") == "disconnected"
        assert p.js("demo.panels.world.retry.pending") is False
        assert p.shown("#world-reconnect")
        retries = p.js("demo.world.retries")
        with serve_at(voiced_app(), port):
            # The speech panel (no close button) comes back; the world panel stays closed.
            p.wait("demo.tts.connected && demo.tts.voice === 'silent'", timeout_s=BACK_WITHIN_S)
            time.sleep(1.0)
            assert p.js("[demo.world.connected, demo.world.sessionId, demo.world.retries]") == [False, None, retries]
            assert p.js("demo.panels.world.ws === null || demo.panels.world.ws.readyState === WebSocket.CLOSED")
            # The button still reconnects at once.
            p.page.click("#world-reconnect")
            p.wait("demo.world.connected && demo.world.sessionId !== null && demo.world.chunkIndex >= 2")
            assert p.js("demo.world.retries") == retries
            assert other_console_errors(p) == []


def test_an_operator_close_is_not_retried(browser, tiny_server):
    p = Page(browser, tiny_server)
    try:
        p.wait("demo.world.chunkIndex >= 2")
        sid = p.js("demo.world.sessionId")
        assert httpx.delete(f"http://{tiny_server}/v1/sessions/world/{sid}").status_code == 200
        p.wait("demo.world.connected === false")
        time.sleep(1.0)  # twice the first retry's longest wait
        world = p.js("demo.world")
        assert (world["closeCode"], world["retries"], world["retryStopped"]) == (
            1008, 0, "closed by the server's operator (1008)")
        assert [e["code"] for e in world["errors"]] == ["closed_by_admin", "connection"]
        assert p.js("document.getElementById('hud-status').textContent") == (
            "disconnected: closed by the server's operator (1008)")
        assert p.js("demo.panels.world.retry.pending") is False
        assert p.shown("#world-reconnect") and p.shown("#world-error")
        p.page.click("#world-reconnect")
        p.wait("demo.world.connected && demo.world.sessionId !== null && demo.world.chunkIndex >= 2")
        assert p.js("demo.world.sessionId") != sid
        assert p.js("demo.world.retryStopped") is None
        assert p.console_errors == []
    finally:
        p.close()


def test_an_idle_timeout_is_not_retried(browser):
    # The speech socket says nothing, so the server closes it (4408) after the idle timeout;
    # the world panel keeps taking chunks, so it is never idle.
    with serve(voiced_app(idle_timeout_s=1.0)) as addr:
        p = Page(browser, addr)
        try:
            p.wait("demo.tts.closeCode === 4408")
            time.sleep(1.0)  # twice the first retry's longest wait
            tts = p.js("demo.tts")
            assert (tts["connected"], tts["retries"], tts["retryStopped"]) == (False, 0, "closed after idling (4408)")
            assert [e["code"] for e in tts["errors"]] == ["idle_timeout", "connection"]
            assert p.js("document.getElementById('speech-status').textContent") == (
                "disconnected: closed after idling (4408)")
            assert p.shown("#speech-reconnect") and p.shown("#speech-error")
            p.page.click("#speech-reconnect")
            p.wait("demo.panels.speech.greeted")  # session.updated on the new socket
            assert p.js("demo.tts.retryStopped") is None
            assert p.console_errors == []
        finally:
            p.close()


def test_backoff_and_retry_rules(browser, tiny_server):
    """The waits and the close codes (clients/web/reconnect.js), in the page's own JS."""
    p = Page(browser, tiny_server)
    try:
        got = p.page.evaluate("""async () => {
            const m = await import("/web/reconnect.js");
            const attempts = [0, 1, 2, 3, 4, 5, 6, 40];
            return {
                low: attempts.map((a) => m.backoffDelay(a, 0)),
                high: attempts.map((a) => m.backoffDelay(a, 0.999999)),
                mid: m.backoffDelay(2, 0.5),
                codes: Object.fromEntries([1000, 1001, 1002, 1003, 1006, 1007, 1008, 1009, 1011, 1012, 1013, 4408]
                    .map((c) => [c, m.noRetryReason(c)])),
                noVoice: m.noRetryReason(1011, "tts_unavailable"),
            };
        }""")
        assert got["low"] == [250, 500, 1000, 2000, 4000, 5000, 5000, 5000]
        assert got["high"] == [500, 1000, 2000, 4000, 8000, 10000, 10000, 10000]
        assert got["mid"] == 1500
        refused = "the server refused what the page sent"
        assert got["codes"] == {
            "1000": None, "1001": None, "1002": f"{refused} (1002)", "1003": f"{refused} (1003)", "1006": None,
            "1007": f"{refused} (1007)", "1008": "closed by the server's operator (1008)", "1009": f"{refused} (1009)",
            "1011": None, "1012": None, "1013": None, "4408": "closed after idling (4408)"}
        assert got["noVoice"] == "the server has no voice"
    finally:
        p.close()
