"""The demo page as one of the sessions of ``bench_serve_cpu``: does it keep pace?

Real Chromium (Debian's, driven by playwright's sync API as in ``tests/e2e/test_web.py``)
opens the server's page, which connects its world panel on its own; the bench picks the
maze model, focuses the canvas, holds W and reads the page's own counters
(``window.demo.world``, ``clients/web/world.js``) before and after ``seconds``:

- ``frames_drawn_per_s``: frames the paced player drew (it draws one per 1/fps when one is
  ready, and gives a credit back once a chunk's last frame is drawn);
- ``chunks_received_per_s``: chunks that reached the page, the server's rate to it;
- ``stalls``: frames that were due with none decoded yet (the page's own count);
- ``queued_max``: the most chunks waiting to be drawn (bounded by the credit window).

The page keeps pace when it draws what the server sends (drawn ≈ received) with few stalls;
both are compared with the Python clients' frames/s at the same load by the caller.
"""

from __future__ import annotations

import os
import time
from typing import Any

# Debian's Chromium and its headless flags, for this bench and the page's tests (tests/e2e/test_web.py).
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
MODEL = "maze"

_COUNTERS = """(() => {
    const w = demo.world;
    return {now: performance.now(), frames: w.framesDrawn, chunks: w.chunksDrawn,
            received: w.receivedChunkIndex, stalls: w.stalls, model: w.model, session: w.sessionId,
            error: w.lastError, queued: demo.panels.world.player.queue.length};
})()"""


def available() -> str | None:
    """Why the page cannot be measured here, or None."""
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} missing (make chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (the dev extra)"
    return None


def measure_page(addr: str, warmup: float, seconds: float, key: str = "w") -> dict[str, Any]:
    """One page on ``http://addr/`` playing the maze with ``key`` held; its counters' rates."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1180, "height": 760})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
            page.goto(f"http://{addr}/")
            page.wait_for_function("window.demo && (window.demo.ready || window.demo.bootError)", timeout=60_000)
            # The panel connects to the first world model by itself; switch once its session is up.
            page.wait_for_function("demo.world.chunkIndex >= 0 || demo.world.lastError !== null", timeout=120_000)
            if page.evaluate("demo.world.model") != MODEL:
                page.select_option("#world-model", MODEL)
                page.click("#world-connect")
            page.wait_for_function(f"demo.world.model === '{MODEL}' && demo.world.chunkIndex >= 0", timeout=120_000)
            page.focus("#world-canvas")
            page.keyboard.down(key)
            time.sleep(warmup)
            queued, a = 0, page.evaluate(_COUNTERS)
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                time.sleep(0.25)
                queued = max(queued, page.evaluate("demo.panels.world.player.queue.length"))
            b = page.evaluate(_COUNTERS)
            page.keyboard.up(key)
            dt = (b["now"] - a["now"]) / 1000
            return {
                "session": b["session"], "model": b["model"], "seconds": dt,
                "frames_drawn_per_s": (b["frames"] - a["frames"]) / dt,
                "chunks_drawn_per_s": (b["chunks"] - a["chunks"]) / dt,
                "chunks_received_per_s": (b["received"] - a["received"]) / dt,
                "stalls": b["stalls"] - a["stalls"], "queued_max": queued,
                "last_error": b["error"], "console_errors": errors,
            }
        finally:
            browser.close()
