"""The browser demo page (clients/web/) in a real headless Chromium against a real server.

Playwright's sync API drives Debian's Chromium (``playwright install`` cannot
download browsers here). The page is read through its own test hooks
(``window.demo``, see clients/web/app.js) and through the canvas pixels.
Screenshots of each panel go to test-artifacts/web/.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from models.policy import DummyPolicy
from models.world.tiny import TinyWorld
from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve, tiny_app
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "web"

pytestmark = [
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} missing: apt-get install chromium"),
    pytest.mark.timeout(120),
]

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")


# ---------------------------------------------------------------------------- servers
def _tts_adapter() -> tuple[Any, str | None]:
    """The real Piper adapter, or why the speech tests must skip."""
    try:
        from models.tts.piper.adapter import PiperTTS
        import realtime.endpoints.tts  # noqa: F401 - the endpoint must exist too
    except ImportError as exc:
        return None, f"TTS endpoint or adapter not importable: {exc}"
    try:
        return PiperTTS.load(device="cpu", max_batch=8), None
    except Exception as exc:  # noqa: BLE001 - TTSUnavailable (extra or voice missing) and friends
        return None, f"TTS voice unavailable: {type(exc).__name__}: {exc}"


def full_app():
    """Tiny world + a dummy policy + the Piper voice when it can load."""
    inventory = Inventory()
    world = TinyWorld(max_batch=16)
    policy = DummyPolicy(max_batch=4)
    inventory.adapters[world.name] = world
    inventory.adapters[policy.name] = policy
    tts, why = _tts_adapter()
    if tts is not None:
        inventory.adapters[tts.name] = tts
    return build_app(ServerConfig(world=WorldConfig(models=("tiny",))), inventory), why


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def tiny_addr() -> Iterator[str]:
    """The tiny world alone; TTS listed as unavailable the way the registry lists it."""
    app = tiny_app()
    app.state.inventory.skip("piper-joe-medium", "tts", "TTS unavailable: missing onnx")
    with serve(app) as addr:
        yield addr


@pytest.fixture(scope="module")
def full_server() -> Iterator[tuple[str, str | None]]:
    app, why_no_tts = full_app()
    with serve(app) as addr:
        yield addr, why_no_tts


class Page:
    """One browser page on the demo, recording console errors and page exceptions."""

    def __init__(self, browser: Any, addr: str) -> None:
        self.addr = addr
        self.page = browser.new_page(viewport={"width": 1180, "height": 760})
        self.console_errors: list[str] = []
        self.page.on("console", lambda m: self.console_errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.console_errors.append(f"pageerror: {e}"))
        self.page.goto(f"http://{addr}/")
        self.page.wait_for_function("window.demo && (window.demo.ready || window.demo.bootError)")
        assert self.js("demo.bootError") is None

    def js(self, expression: str, arg: Any = None) -> Any:
        return self.page.evaluate(f"(arg) => {expression}", arg)

    def wait(self, expression: str, timeout_s: float = 30.0) -> None:
        # Generous: other jobs on a 2-core machine have been seen to slow ticks to 0.8 s.
        self.page.wait_for_function(expression, timeout=timeout_s * 1000)

    def canvas(self) -> tuple[int, np.ndarray]:
        """The drawn chunk index and the canvas pixels [H, W, 4], read in one step."""
        got = self.js("""(() => {
            const c = document.getElementById("world-canvas");
            const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
            return {chunk: demo.world.chunkIndex, h: c.height, w: c.width, px: Array.from(d)};
        })()""")
        return got["chunk"], np.array(got["px"], np.uint8).reshape(got["h"], got["w"], 4)

    def shown(self, selector: str) -> bool:
        """Whether Chromium renders ``selector`` (a box on the page), whatever its attributes say."""
        return self.page.locator(selector).is_visible()

    def hidden_but_rendered(self) -> list[str]:
        """Elements with the ``hidden`` attribute that Chromium still lays out (a stylesheet's
        ``display`` overriding it): the page means none."""
        return self.js("""[...document.querySelectorAll("[hidden]")]
            .filter((el) => el.getClientRects().length > 0).map((el) => el.id || el.tagName)""")

    def focus_page(self) -> None:
        # Keys only drive the world when the page (not a text box) has focus.
        self.page.focus("#world-canvas")

    def hold(self, key: str, seconds: float) -> None:
        self.page.keyboard.down(key)
        time.sleep(seconds)
        self.page.keyboard.up(key)

    def screenshot(self, selector: str, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / name
        if selector == "page":
            self.page.screenshot(path=str(path))
        else:
            self.page.locator(selector).screenshot(path=str(path))
        return path

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def tiny_page(browser, tiny_addr) -> Iterator[Page]:
    page = Page(browser, tiny_addr)
    page.wait("demo.world.chunkIndex >= 0")
    yield page
    page.close()


# ---------------------------------------------------------------------------- world
def test_page_loads_and_plays_without_console_errors(tiny_page: Page):
    p = tiny_page
    assert p.js("[...document.querySelectorAll('#world-model option')].map(o => [o.value, o.disabled])") == [
        ["tiny", False]]
    world = p.js("demo.world")
    assert (world["connected"], world["model"], world["height"], world["width"]) == (True, "tiny", 64, 64)
    assert world["sessionId"].startswith("web-")
    assert world["lastError"] is None
    p.wait("demo.world.chunkIndex >= 5")
    # Frames are drawn 1:1 into a 64x64 canvas that CSS scales up without smoothing.
    assert p.js("getComputedStyle(document.getElementById('world-canvas')).imageRendering") == "pixelated"
    assert p.js("[document.getElementById('world-canvas').width, document.getElementById('world-canvas').height]") \
        == [64, 64]
    # Paced at the model's 15 fps (fewer when the machine is busy), never more than 4
    # chunks ahead of the drawing.
    time.sleep(1.0)
    fps = p.js("demo.world.fps")
    assert 1 <= fps <= 16, fps
    world = p.js("demo.world")
    assert world["framesDrawn"] == world["chunksDrawn"]  # the tiny world makes 1 frame per chunk
    # Both read in one evaluation: between two reads the player may draw and return credits.
    assert p.js("demo.panels.world.player.queue.length + demo.world.serverCredits") <= 4
    assert p.js("document.getElementById('hud-chunk').textContent") != "–"
    # This server's TTS model could not load, and it has no policy.
    assert p.js("document.getElementById('speech-unavailable').textContent") == "TTS unavailable: missing onnx"
    assert p.js("document.getElementById('speech-text').disabled") is True
    assert (p.js("demo.tts.available"), p.js("demo.tts.reason")) == (False, "missing onnx")
    assert p.js("[demo.robot.policies, demo.robot.placeholder, demo.robot.canDrive]") == [[], True, False]
    # What is on screen, as Chromium lays it out (not the attributes the page sets).
    shown = {sel: p.shown(sel) for sel in (
        "#speech-unavailable", "#robot-placeholder", "#robot-drive", "#world-image-row", "#world-trajectory-form",
        "#world-reconnect", "#speech-reconnect", "#world-error", "#speech-error", "#robot-error", "#boot-error")}
    assert shown == {"#speech-unavailable": True, "#robot-placeholder": True, "#robot-drive": False,
                     "#world-image-row": False, "#world-trajectory-form": False, "#world-reconnect": False,
                     "#speech-reconnect": False, "#world-error": False, "#speech-error": False,
                     "#robot-error": False, "#boot-error": False}
    assert p.hidden_but_rendered() == []
    p.screenshot("#world-panel", "world.png")
    p.screenshot("#speech-panel", "speech-unavailable.png")
    p.screenshot("#robot-panel", "robot-placeholder.png")
    assert p.console_errors == []


class PromptedTiny(TinyWorld):
    """The tiny world under another name, listed as reading prompts: the page's other case
    (no built-in world reads prompts yet; the page only looks at ``uses_prompts``)."""

    def describe(self):
        return {**super().describe(), "uses_prompts": True}


def test_the_prompt_box_says_when_the_model_ignores_prompts(browser):
    inventory = Inventory()
    for model in (TinyWorld(), PromptedTiny(name="prompted")):
        inventory.adapters[model.name] = model
    app = build_app(ServerConfig(world=WorldConfig(models=("tiny", "prompted"))), inventory)
    box = "document.getElementById('world-prompt')"
    with serve(app) as addr:
        p = Page(browser, addr)
        try:
            p.wait("demo.world.chunkIndex >= 0")
            assert p.js("demo.world.model") == "tiny"
            assert p.js(f"[{box}.placeholder, {box}.title, demo.world.usesPrompts]") == [
                "tiny ignores prompts: steer it with the keys",
                "tiny ignores prompts: they are accepted and have no effect", False]
            p.screenshot("#world-prompt-form", "world-prompt-ignored.png")
            p.page.select_option("#world-model", "prompted")
            p.wait("demo.world.model === 'prompted' && demo.world.chunkIndex >= 0")
            assert p.js(f"[{box}.placeholder, {box}.title, demo.world.usesPrompts]") == [
                "prompt, e.g. a foggy harbour at dawn", "", True]
            assert p.console_errors == []
        finally:
            p.close()


def test_holding_w_advances_chunks_and_changes_pixels(tiny_page: Page):
    p = tiny_page
    p.focus_page()
    first_event = p.js("demo.world.lastEventId")
    before_chunk, before = p.canvas()
    p.page.keyboard.down("w")
    p.page.keyboard.down("w")  # auto-repeat: no new event
    assert p.js("demo.world.held") == ["w"]
    time.sleep(1.0)
    p.wait(f"demo.world.chunkIndex >= {before_chunk + 5}")  # 15 in a second on an idle machine
    p.page.keyboard.up("w")
    p.wait("demo.world.held.length === 0")
    after_chunk, after = p.canvas()
    assert not np.array_equal(before, after)
    # Exactly two state events: W down ({"held": ["w"]}) and W up ({"held": []}).
    assert p.js("demo.world.lastEventId") == first_event + 2
    p.wait(f"demo.world.appliedEventIds.includes({first_event + 2})")
    assert p.js("demo.world.rttMs") > 0 and p.js("demo.world.tickMs") > 0
    # Typing W in a text box does not drive the world.
    p.page.click("#world-prompt")
    p.page.keyboard.down("w")
    assert p.js("demo.world.held") == []
    p.page.keyboard.up("w")
    assert p.js("demo.world.lastEventId") == first_event + 2
    # The on-screen buttons do.
    button = p.page.locator("#world-panel [data-key='d']")
    box = button.bounding_box()
    p.page.mouse.move(box["x"] + 5, box["y"] + 5)
    p.page.mouse.down()
    assert p.js("demo.world.held") == ["d"]
    p.page.mouse.up()
    assert p.js("demo.world.held") == []
    assert p.js("demo.world.lastEventId") == first_event + 4
    assert p.console_errors == []


def test_a_tab_that_stops_drawing_stops_the_server(tiny_page: Page):
    p = tiny_page
    p.wait("demo.world.chunkIndex >= 3")
    # What a hidden tab does: requestAnimationFrame stops, so nothing is drawn.
    p.js("demo.panels.world.player.stop()")
    time.sleep(1.0)
    stalled = p.js("[demo.world.chunkIndex, demo.world.receivedChunkIndex, demo.world.serverCredits]")
    time.sleep(1.0)
    assert p.js("[demo.world.chunkIndex, demo.world.receivedChunkIndex, demo.world.serverCredits]") == stalled
    drawn, received, held = stalled
    assert held == 0 and 1 <= received - drawn <= 4  # at most one credit window ahead
    p.js("demo.panels.world.player.start()")
    p.wait(f"demo.world.chunkIndex >= {received + 3}")
    assert p.console_errors == []


def _turn(p: Page, key: str) -> np.ndarray:
    """Reset to chunk 0 of the same seed, hold ``key`` from there, the frame at chunk >= 12."""
    p.focus_page()
    resets = p.js("demo.world.resets")
    p.page.keyboard.down(key)
    p.page.click("#world-reset")
    p.focus_page()
    p.wait(f"demo.world.resets === {resets + 1} && demo.world.chunkIndex >= 12")
    _, pixels = p.canvas()
    p.page.keyboard.up(key)
    return pixels


def test_j_and_l_from_the_same_seed_differ(tiny_page: Page):
    p = tiny_page
    _, start = p.canvas()
    j = _turn(p, "j")
    l_ = _turn(p, "l")
    assert not np.array_equal(j, l_)
    # Far apart, not a rounding difference: mean absolute difference over 2 levels of 255.
    assert np.abs(j[..., :3].astype(int) - l_[..., :3].astype(int)).mean() > 2.0
    assert not np.array_equal(j, start) and not np.array_equal(l_, start)
    assert p.console_errors == []


def test_reset_returns_chunk_index_to_zero(tiny_page: Page):
    p = tiny_page
    p.wait("demo.world.chunkIndex >= 6")
    p.page.click("#world-reset")
    p.wait("demo.world.resets === 1 && demo.world.sinceReset.length >= 4")
    # The first chunks drawn after the reset are 0, 1, 2, 3 (the queue from before was dropped).
    assert p.js("demo.world.sinceReset.slice(0, 4)") == [0, 1, 2, 3]
    # Credits are still flowing: the dropped chunks' credits were handed back.
    p.wait("demo.world.sinceReset.length >= 12")
    assert p.js("demo.world.lastError") is None
    assert p.console_errors == []


def test_server_errors_are_shown_on_the_page(tiny_page: Page):
    p = tiny_page
    error = p.page.locator("#world-error")
    assert error.is_hidden()
    # A prompt over the 2000-character limit: bad_request, the session goes on.
    p.page.fill("#world-prompt", "x" * 2500)
    p.page.click("#world-prompt-form button[type=submit]")
    event_id = p.js("demo.world.lastEventId")
    p.wait("demo.world.lastError !== null")
    assert error.is_visible()
    assert error.text_content() == f"bad_request: prompt: 2500 characters, at most 2000 (event {event_id})"
    assert p.js("demo.world.lastError.code") == "bad_request"
    chunk = p.js("demo.world.chunkIndex")
    p.wait(f"demo.world.chunkIndex > {chunk + 2}")
    p.screenshot("#world-panel", "world-error.png")
    p.page.fill("#world-prompt", "")  # new sessions start with the prompt box's text

    # A session id already in use elsewhere: session_exists, and no session on this socket.
    other = Page(p.page.context.browser, p.addr)
    try:
        other.wait("demo.world.chunkIndex >= 0")
        taken = other.js("demo.world.sessionId")
        p.page.fill("#world-session", taken)
        p.page.click("#world-connect")
        p.wait("demo.world.lastError && demo.world.lastError.code === 'session_exists'")
        assert error.text_content().startswith(f"session_exists: ")
        assert taken in error.text_content()
        assert p.js("demo.world.sessionId") is None
        assert p.js("document.getElementById('world-reset').disabled") is True
        assert other.console_errors == []
    finally:
        other.close()

    # A new id works again (on a socket of its own: the URL carries the routing id).
    p.page.fill("#world-session", "web-second")
    p.page.click("#world-connect")
    p.wait("demo.world.sessionId === 'web-second' && demo.world.chunkIndex >= 2")
    assert p.js("demo.panels.world.ws.url").endswith("/v1/realtime/world?session_id=web-second")
    assert error.is_hidden()
    assert p.console_errors == []


def test_connect_clicked_again_while_a_create_is_on_its_way(tiny_page: Page):
    """Two clicks on Connect before the server answers the first create: the second
    waits for the first session, closes it and starts its own; the server refuses nothing."""
    p = tiny_page
    p.page.click("#world-close")
    p.wait("demo.world.sessionId === null && !demo.panels.world.closing")
    errors = len(p.js("demo.world.errors"))
    # One evaluation: the second click lands while the first create is unanswered.
    assert p.js("""(() => {
        const connect = document.getElementById("world-connect");
        connect.click();
        const inFlight = demo.panels.world.creating;
        document.getElementById("world-seed").value = "7";
        connect.click();
        return inFlight;
    })()""") is True
    p.wait("demo.world.sessionId !== null && !demo.panels.world.creating && !demo.panels.world.pendingCreate"
           " && demo.world.chunkIndex >= 2")
    assert len(p.js("demo.world.errors")) == errors, p.js("demo.world.errors")
    assert p.js("demo.world.lastError") is None
    assert p.console_errors == []


def test_dropped_connection_offers_reconnect(tiny_page: Page):
    p = tiny_page
    reconnect = p.page.locator("#world-reconnect")
    assert reconnect.is_hidden()
    # A frame over the 64 KiB limit makes the server answer and close the socket (1009).
    p.page.fill("#world-prompt", "y" * 70_000)
    p.page.click("#world-prompt-form button[type=submit]")
    p.wait("demo.world.connected === false")
    world = p.js("demo.world")
    assert world["closeCode"] == 1009
    assert [e["code"] for e in world["errors"]] == ["message_too_large", "connection"]
    assert p.page.locator("#world-error").text_content() == "connection: connection lost (close code 1009)"
    assert reconnect.is_visible()
    # The page sent what the server refuses: it would send it again, so it does not retry.
    assert world["retryStopped"] == "the server refused what the page sent (1009)"
    assert p.js("document.getElementById('hud-status').textContent") == (
        "disconnected: the server refused what the page sent (1009)")
    assert p.hidden_but_rendered() == []
    p.screenshot("#world-panel", "world-disconnected.png")
    p.page.fill("#world-prompt", "")
    reconnect.click()
    p.wait("demo.world.connected && demo.world.sessionId !== null && demo.world.chunkIndex >= 3")
    assert reconnect.is_hidden()
    assert p.js("demo.world.sessionId") != world["sessionId"]
    assert p.console_errors == []


def test_sentence_streaming_rules(tiny_page: Page):
    """The text box -> input.text splitting (clients/web/sentences.js), in the page's own JS."""
    got = tiny_page.js("""(async () => {
        const { TextStreamer, completedLength } = await import("/web/sentences.js");
        const s = new TextStreamer();
        const steps = ["Hello", "Hello there.", "Hello there. ", "Hello there. Pi is 3.14 ok? Yes",
                       "Hello there. Pi is 3.14 ok? Yes! ", "Hello there. Pi is 3.14 ok? Yes! \\"Quoted.\\" Fin"];
        const out = steps.map((v) => s.update(v));
        out.push(s.flush(steps[steps.length - 1] + "al"));
        out.push(s.flush("   "));
        const edited = new TextStreamer();
        out.push(edited.update("One. Two. "));
        out.push(edited.update("One. Too. Three. "));
        return { out, lengths: ["a. b", "a.b", "end?!) x", "none"].map(completedLength) };
    })()""")
    assert got["out"] == [
        [], [], ["Hello there. "], ["Pi is 3.14 ok? "], ["Yes! "], ['"Quoted." '], ["Final"], [],
        ["One. ", "Two. "],
        ["Too. ", "Three. "],
    ]
    assert got["lengths"] == [3, 0, 7, 0]


def test_credit_window_rules(tiny_page: Page):
    """The adaptive credit window (clients/web/credits.js), in the page's own JS."""
    got = tiny_page.js("""(async () => {
        const { CreditWindow, SHRINK_AFTER } = await import("/web/credits.js");
        const log = [];
        const a = new CreditWindow();
        log.push([a.size, a.drawn(0, 3), a.drawn(3, 0)]);  // one back per draw while under the window
        const b = new CreditWindow();
        for (let i = 1; i < SHRINK_AFTER; i++) b.drawn(2, 1);
        log.push(b.size);                                    // 29 deep draws: still 4
        log.push([b.drawn(2, 1), b.size]);                   // the 30th shrinks it; 3 - 2 - 1 = 0 back
        for (let i = 0; i < 3 * SHRINK_AFTER; i++) b.drawn(2, 0);
        log.push([b.size, b.drawn(1, 0)]);                   // floor of 2; tops up to 2
        b.stalled(); b.stalled(); b.stalled();
        log.push([b.size, b.topUp(0, 1)]);                   // stalls grow it back to 4 at most
        const c = new CreditWindow();
        for (let i = 1; i < SHRINK_AFTER; i++) c.drawn(2, 0);
        c.stalled();                                         // a stall restarts the count
        for (let i = 1; i < SHRINK_AFTER; i++) c.drawn(2, 0);
        log.push(c.size);
        return log;
    })()""")
    assert got == [[4, 1, 1], 4, [0, 3], [2, 1], [4, 3], 4]


# ---------------------------------------------------------------------------- robot and speech
def test_robot_panel_shows_policy_metadata(browser, full_server):
    addr, _ = full_server
    p = Page(browser, addr)
    try:
        assert p.js("[demo.robot.policies, demo.robot.placeholder, demo.robot.canDrive]") == [
            ["dummy-policy"], False, False]
        # The dummy policy's actions are not the maze's keys: the panel says so, drives nothing.
        assert p.js("document.getElementById('robot-placeholder').textContent").startswith(
            "Policy dummy-policy is served at /v1/realtime/robot/openpi (OpenPI), but its actions are not")
        assert (p.shown("#robot-placeholder"), p.shown("#robot-drive")) == (True, False)
        assert p.hidden_but_rendered() == []
        p.page.click("#robot-metadata summary")
        facts = p.js("""Object.fromEntries([...document.querySelectorAll('#robot-policies dt')]
                                .map(dt => [dt.textContent, dt.nextElementSibling.textContent]))""")
        assert p.js("document.querySelector('#robot-policies h3').textContent") == "dummy-policy"
        assert {k: facts[k] for k in ("max_batch", "action_horizon", "action_dim", "image_resolution",
                                      "state_dim", "infer_ms")} == {
            "max_batch": "4", "action_horizon": "50", "action_dim": "32", "image_resolution": "224×224",
            "state_dim": "32", "infer_ms": "0"}
        p.screenshot("#robot-panel", "robot-policy.png")
        assert p.console_errors == []
    finally:
        p.close()


def test_speech_panel_streams_audio_and_stop_cuts_it(browser, full_server):
    addr, why_no_tts = full_server
    if why_no_tts:
        pytest.skip(why_no_tts)
    p = Page(browser, addr)
    try:
        p.wait("demo.tts.connected && demo.tts.voice !== null")
        assert p.js("demo.tts.available") is True
        assert p.js("demo.tts.sampleRate") in (22050, 24000)
        # The socket's URL carries a routing id for a proxy (docs/deploy.md).
        assert re.search(r"/v1/realtime/tts\?session_id=tts-[0-9a-f]{6}$", p.js("demo.panels.speech.ws.url"))
        # One sentence typed: it goes out when it ends, and audio comes back.
        p.page.click("#speech-text")
        p.page.keyboard.type("Hello from the browser. ", delay=5)
        assert p.js("demo.tts.textsSent") == ["Hello from the browser. "]
        p.wait("demo.tts.sentencesDone === 1", )
        tts = p.js("demo.tts")
        assert tts["chunks"] >= 1 and tts["bytes"] == 2 * tts["samples"] and tts["samples"] > 0
        assert tts["ttfaMs"] > 0
        assert tts["lastError"] is None
        p.wait("document.getElementById('speech-ttfa').textContent.endsWith(' ms')")
        p.screenshot("#speech-panel", "speech.png")

        # A long utterance, stopped after its first audio: the chunks stop coming.
        long_text = " ".join(f"This is sentence number {i} of a long paragraph that keeps going." for i in range(12))
        started = tts["sentencesStarted"]
        p.page.fill("#speech-text", "")
        p.page.keyboard.type(long_text[:60], delay=0)
        p.page.keyboard.insert_text(long_text[60:])
        p.page.keyboard.press("Enter")
        p.wait(f"demo.tts.sentencesStarted > {started} && demo.tts.chunks > {tts['chunks']}", )
        p.page.click("#speech-stop")
        p.wait("demo.tts.cancelled === 1", )
        cut = p.js("demo.tts")
        time.sleep(1.0)
        later = p.js("demo.tts")
        assert (later["chunks"], later["bytes"]) == (cut["chunks"], cut["bytes"])
        assert later["sentencesDone"] < started + 12  # cut short, not spoken to the end
        assert later["playing"] == 0
        assert p.js("document.getElementById('speech-text').value") == ""
        # A server error is shown in the panel; the session goes on.
        assert p.page.locator("#speech-error").is_hidden()
        p.page.fill("#speech-speed", "3")
        p.page.dispatch_event("#speech-speed", "change")
        p.wait("demo.tts.lastError !== null")
        assert p.page.locator("#speech-error").text_content() == "bad_speed: speed must be between 0.5 and 2.0"
        assert p.js("demo.tts.connected") is True
        assert p.console_errors == []
    finally:
        p.close()


def test_full_page_screenshot(browser, full_server):
    """The whole page mid-use (test-artifacts/web/page.png; docs/demo.png is a copy of one)."""
    addr, why_no_tts = full_server
    p = Page(browser, addr)
    try:
        if not why_no_tts:
            p.wait("demo.tts.connected && demo.tts.voice !== null")
            p.page.click("#speech-text")
            p.page.keyboard.type("Hello from the browser. ", delay=0)
            p.page.keyboard.insert_text("The world on the left follows your keys.")
            p.page.keyboard.press("Enter")
            p.wait("demo.tts.sentencesDone >= 2", )
        p.page.fill("#world-prompt", "a foggy harbour at dawn")
        p.focus_page()
        p.page.keyboard.down("w")
        p.page.click("#world-reset")
        p.focus_page()
        p.wait("demo.world.resets === 1 && demo.world.chunkIndex >= 6")
        p.screenshot("page", "page.png")
        p.page.keyboard.up("w")
        assert p.console_errors == []
    finally:
        p.close()


class LingBotLikeTiny(TinyWorld):
    """The tiny world listed as taking a first image and named trajectories. The page reads
    only ``takes_image`` and ``control_schemas`` of a model's /v1/models entry, and LingBot's
    entry says both (tests/e2e/test_lingbot.py); a LingBot, even a tiny one, takes seconds
    to build and its ticks seconds of this machine's two cores."""

    def describe(self):
        return {**super().describe(), "takes_image": True,
                "control_schemas": ["keys.v1", "lingbot.camera_trajectory.v1"]}


def test_image_upload_and_named_trajectories_show_only_for_models_that_take_them(browser):
    inventory = Inventory()
    for model in (TinyWorld(), LingBotLikeTiny(name="lingbot-like")):
        inventory.adapters[model.name] = model
    app = build_app(ServerConfig(world=WorldConfig(models=("tiny", "lingbot-like"))), inventory)
    rows = ("#world-image-row", "#world-trajectory-form")
    with serve(app) as addr:
        p = Page(browser, addr)
        try:
            p.wait("demo.world.chunkIndex >= 0")
            models = p.js("Object.fromEntries(demo.models.map((m) => [m.name, [m.takes_image, m.control_schemas]]))")
            assert models == {"tiny": [False, ["keys.v1"]],
                              "lingbot-like": [True, ["keys.v1", "lingbot.camera_trajectory.v1"]]}
            # tiny takes neither: both rows take no room on the page.
            assert [p.shown(r) for r in rows] == [False, False]
            assert [p.page.locator(r).bounding_box() for r in rows] == [None, None]
            p.page.select_option("#world-model", "lingbot-like")
            p.wait("demo.world.model === 'lingbot-like' && demo.world.chunkIndex >= 0")
            assert [p.shown(r) for r in rows] == [True, True]
            assert p.shown("#world-image") and p.shown("#world-trajectory-form button")
            p.screenshot("#world-panel", "world-image-and-trajectory.png")
            p.page.select_option("#world-model", "tiny")
            p.wait("demo.world.model === 'tiny' && demo.world.chunkIndex >= 0")
            assert [p.shown(r) for r in rows] == [False, False]
            assert p.hidden_but_rendered() == []
            assert p.console_errors == []
        finally:
            p.close()
