#!/usr/bin/env python3
"""Key press to canvas on the demo page in real Chromium: world.v1 ``h264`` against ``jpeg``.

    python -m bench.world.bench_page_latency --out bench/results/page_latency_cpu.json
    python -m bench.world.bench_page_latency --quick --out /tmp/page_latency.json      # smoke test

``realtime serve`` runs as a subprocess on a free loopback port (CPU, the ``maze-sim`` world at
``--size``, no policy, no voice) and headless Chromium (Debian's, driven by playwright as in
tests/e2e/test_web.py) opens its page. For each format the page's format menu starts a new
session; then, ``--presses`` times per format, the bench waits until the picture has settled
(no drawn frame differing from the one before for ``--settle-ms``), presses a turn key (L and J
by turns, so the camera swings back and forth) and holds it until the turn is on the canvas.

The clock is the page's own (``performance.now()``), on both ends:

- the key press: a capture-phase ``keydown`` listener on the window, which runs before the
  page's own (clients/web/keys.js), reads the time and the canvas's pixels (the settled picture);
- the paint: the player's ``drawImage`` (clients/web/frames.js draws every frame of every format
  through it) is wrapped; after each draw the canvas is read back, and the first draw after the
  key press whose pixels differ from the settled picture ends the measurement. A frame differs
  when at least ``SHARE`` of its pixels moved by more than ``LEVEL`` in some channel: one 6-degree
  turn step moves 20-40% of the maze's pixels that much, codec noise on a still picture none
  (the settled draws' largest share is recorded as ``still_noise_share_max``).

Both formats alternate in blocks of ``--block`` presses (jpeg, h264, h264, jpeg, ...), so
slow drift in the machine's load falls on both. Besides the latency, each press records what
explains it: the chunks queued in the page at the key press, the event's round trip as the
page measures it (``rttMs``: event sent to the chunk that applied it arriving), and whether
the first changed frame is the chunk that applied the key's event. The goal: h264's median at
most one frame interval (the world's fps) above jpeg's. The JSON holds the hardware, versions
(Chromium, playwright, Python, torch, PyAV) and the command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.machine import cpu_name, package_version
from bench.maze.bench_serve_cpu import free_port, start_server
from bench.maze.page_pace import CHROMIUM, CHROMIUM_ARGS, available

FORMATS = ("jpeg", "h264")
KEYS = ("l", "j")  # turn right, turn left: by turns, so the view swings back and forth
LEVEL = 32  # a pixel moved: some channel differs by more than this
SHARE = 0.02  # a frame differs: at least this share of its pixels moved
PAINT_TIMEOUT_S = 10.0

# Installed once: the player, its canvas and its 2-D context live as long as the page.
_HOOK = """([level, share]) => {
    const player = demo.panels.world.player;
    const ctx = player.ctx, canvas = player.canvas;
    const m = {armed: false, keyAt: null, ref: null, paintAt: null, paintMoved: null, paintChunk: null,
               paintApplied: null, eventId: null, queuedAtKey: null, drawnChunkAtKey: null,
               receivedChunkAtKey: null, draws: 0, prev: null, lastChangeAt: performance.now(), stillMax: 0};
    window.__latency = m;
    const pixels = () => ctx.getImageData(0, 0, canvas.width, canvas.height).data;
    // The share of pixels where some channel differs by more than `level`.
    const moved = (a, b) => {
        if (!b || a.length !== b.length) return 1;
        let n = 0;
        for (let i = 0; i < a.length; i += 4) {
            if (Math.abs(a[i] - b[i]) > level || Math.abs(a[i + 1] - b[i + 1]) > level
                || Math.abs(a[i + 2] - b[i + 2]) > level) n += 1;
        }
        return n / (a.length / 4);
    };
    const draw = ctx.drawImage;
    ctx.drawImage = function (...args) {
        draw.apply(this, args);
        const now = performance.now();  // the paint's time: before the read-back and the comparison
        const px = pixels();
        m.draws += 1;
        const step = moved(px, m.prev);
        m.prev = px;
        if (step >= share) m.lastChangeAt = now;
        else m.stillMax = Math.max(m.stillMax, step);
        if (m.keyAt !== null && m.paintAt === null) {
            const d = moved(px, m.ref);
            if (d >= share) {
                const head = player.queue[0];
                m.paintAt = now;
                m.paintMoved = d;
                m.paintChunk = head ? head.header.chunk_index : null;
                m.paintApplied = head ? head.header.applied_event_ids.includes(m.eventId) : null;
            }
        }
    };
    window.addEventListener("keydown", (e) => {
        if (!m.armed || e.repeat) return;
        m.armed = false;
        m.keyAt = performance.now();
        m.ref = pixels();
        const panel = demo.panels.world;
        m.eventId = panel.nextEventId;  // the id the page's own handler (after this one) sends the keys under
        m.queuedAtKey = player.queue.length;
        m.drawnChunkAtKey = panel.state.chunkIndex;
        m.receivedChunkAtKey = panel.state.receivedChunkIndex;
    }, {capture: true});
}"""

_ARM = """() => {
    const m = window.__latency;
    Object.assign(m, {armed: true, keyAt: null, ref: null, paintAt: null, paintMoved: null, paintChunk: null,
                      paintApplied: null, eventId: null});
}"""

_SETTLED = "(ms) => window.__latency.draws > 0 && performance.now() - window.__latency.lastChangeAt >= ms"

_PRESS = """() => {
    const m = window.__latency;
    return {latency_ms: m.paintAt - m.keyAt, moved_share: m.paintMoved, chunk_painted: m.paintChunk,
            painted_chunk_applied_the_event: m.paintApplied, event_id: m.eventId, queued_at_key: m.queuedAtKey,
            drawn_chunk_at_key: m.drawnChunkAtKey, received_chunk_at_key: m.receivedChunkAtKey,
            rtt_ms: demo.world.rttMs};
}"""


# ------------------------------------------------------------------ figures
def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(presses: list[dict[str, Any]]) -> dict[str, Any]:
    seen = [p for p in presses if p["latency_ms"] is not None]
    lat = [p["latency_ms"] for p in seen]
    out: dict[str, Any] = {"n": len(lat), "missed": len(presses) - len(seen)}
    if not lat:
        return out
    rtt = [p["rtt_ms"] for p in seen if p["rtt_ms"] is not None]
    after = [p["latency_ms"] - p["rtt_ms"] for p in seen if p["rtt_ms"] is not None]
    return {**out, "median_ms": statistics.median(lat), "p90_ms": percentile(lat, 90), "max_ms": max(lat),
            "min_ms": min(lat), "mean_ms": statistics.fmean(lat),
            "rtt_median_ms": statistics.median(rtt) if rtt else None,
            "after_arrival_median_ms": statistics.median(after) if after else None,
            "queued_at_key_median": statistics.median(p["queued_at_key"] for p in seen),
            "painted_chunk_applied_the_event": sum(bool(p["painted_chunk_applied_the_event"]) for p in seen)}


def goal(per_format: dict[str, dict[str, Any]], fps: float) -> dict[str, Any]:
    """h264's median at most one frame interval above jpeg's."""
    frame_ms = 1000.0 / fps
    jpeg, h264 = per_format["jpeg"].get("median_ms"), per_format["h264"].get("median_ms")
    if jpeg is None or h264 is None:
        return {"frame_interval_ms": frame_ms, "h264_minus_jpeg_median_ms": None, "within_one_frame": False}
    diff = h264 - jpeg
    return {"frame_interval_ms": frame_ms, "h264_minus_jpeg_median_ms": diff,
            "h264_minus_jpeg_median_frames": diff / frame_ms, "within_one_frame": diff <= frame_ms}


def block_order(presses: int, block: int) -> list[str]:
    """The format of each block, ABBA: ``jpeg h264 h264 jpeg jpeg h264 ...`` until each format has
    ``presses`` (the last block of each shorter when ``block`` does not divide it)."""
    blocks = -(-presses // block)
    order: list[str] = []
    for i in range(blocks):
        order += list(FORMATS) if i % 2 == 0 else list(reversed(FORMATS))
    return order


# ------------------------------------------------------------------ the page
def session(page: Any, fmt: str) -> dict[str, Any]:
    """A new session in ``fmt`` through the page's format menu; its settings once it plays."""
    page.select_option("#world-format", fmt)
    page.click("#world-connect")
    page.wait_for_function(
        f"demo.world.format === '{fmt}' && demo.world.chunkIndex >= 3 || demo.world.formatFallback !== null",
        timeout=60_000)
    got = page.evaluate("""() => ({format: demo.world.format, codec: demo.world.codec, fallback: demo.world.formatFallback,
        height: demo.world.height, width: demo.world.width, model: demo.world.model,
        fps: 1000 / demo.panels.world.player.interval})""")
    got["fps"] = round(got["fps"], 6)  # the world's fps back from the player's frame interval (1000 / fps)
    if got["format"] != fmt or got["fallback"] is not None:
        raise RuntimeError(f"the page plays {got['format']} instead of {fmt}: {got['fallback']}")
    return got


def counters(page: Any) -> dict[str, Any]:
    return page.evaluate("""() => ({now: performance.now(), frames: demo.world.framesDrawn, stalls: demo.world.stalls,
        decode_ms: demo.world.decodeMs, bytes_per_s: demo.world.bytesPerS, still_noise_share_max: window.__latency.stillMax,
        errors: demo.world.errors.length})""")


def press(page: Any, key: str, settle_ms: float, jitter_ms: float, rng: random.Random) -> dict[str, Any]:
    """Wait for a still picture, press ``key`` and hold it until the canvas changes."""
    page.wait_for_function(_SETTLED, arg=settle_ms, timeout=60_000)
    page.evaluate(_ARM)
    time.sleep(rng.uniform(0, jitter_ms) / 1000)  # the press at any phase of the frame clock
    page.keyboard.down(key)
    try:
        page.wait_for_function("window.__latency.paintAt !== null", timeout=PAINT_TIMEOUT_S * 1000)
        got = page.evaluate(_PRESS)
    except Exception as exc:  # noqa: BLE001 - playwright's TimeoutError: a press whose turn never showed
        if "Timeout" not in type(exc).__name__:
            raise
        got = {"latency_ms": None, "why": f"no changed paint within {PAINT_TIMEOUT_S:.0f} s"}
    finally:
        page.keyboard.up(key)
    return {"key": key, **got}


def measure(addr: str, args: argparse.Namespace) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    rng = random.Random(args.seed)
    presses: dict[str, list[dict[str, Any]]] = {f: [] for f in FORMATS}
    blocks: list[dict[str, Any]] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1180, "height": 760})
            console: list[str] = []
            page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            page.goto(f"http://{addr}/")
            page.wait_for_function("window.demo && (window.demo.ready || window.demo.bootError)", timeout=60_000)
            if page.evaluate("demo.bootError") is not None:
                raise RuntimeError(f"the page did not boot: {page.evaluate('demo.bootError')}")
            page.wait_for_function("demo.world.chunkIndex >= 0", timeout=120_000)
            page.evaluate(_HOOK, [LEVEL, SHARE])
            page.focus("#world-canvas")
            settings: dict[str, Any] = {}
            turn = 0
            for fmt in block_order(args.presses, args.block):
                n = min(args.block, args.presses - len(presses[fmt]))
                settings[fmt] = session(page, fmt)
                page.focus("#world-canvas")
                page.wait_for_function(_SETTLED, arg=args.settle_ms, timeout=60_000)
                page.evaluate("() => { window.__latency.stillMax = 0; }")
                a = counters(page)
                for _ in range(n):
                    presses[fmt].append(press(page, KEYS[turn % 2], args.settle_ms, 1000 / settings[fmt]["fps"], rng))
                    turn += 1
                b = counters(page)
                dt = (b["now"] - a["now"]) / 1000
                blocks.append({"format": fmt, "presses": n, "seconds": dt,
                               "frames_drawn_per_s": (b["frames"] - a["frames"]) / dt,
                               "stalls": b["stalls"] - a["stalls"], "decode_ms": b["decode_ms"],
                               "bytes_per_s": b["bytes_per_s"], "still_noise_share_max": b["still_noise_share_max"],
                               "server_errors": b["errors"] - a["errors"]})
            chromium = browser.version
        finally:
            browser.close()
    return {"chromium": chromium, "settings": settings, "presses": presses, "blocks": blocks, "console_errors": console}


# ------------------------------------------------------------------ record
def environment() -> dict[str, Any]:
    return {"hardware": {"cpu": cpu_name(), "cores": len(os.sched_getaffinity(0))},
            "versions": {"python": platform.python_version(), "torch": package_version("torch"),
                         "av": package_version("av"), "playwright": package_version("playwright")}}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="240x416", help="maze-sim's render size, HEIGHTxWIDTH")
    parser.add_argument("--presses", type=int, default=20, help="key presses per format")
    parser.add_argument("--block", type=int, default=5, help="presses in a row in one format")
    parser.add_argument("--settle-ms", type=float, default=500.0, help="a still picture for this long before a press")
    parser.add_argument("--seed", type=int, default=0, help="of the presses' timing jitter")
    parser.add_argument("--quick", action="store_true", help="smoke test: 64x64, 2 presses per format, blocks of 1")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.quick:
        args.size, args.presses, args.block, args.settle_ms = "64x64", 2, 1, 300.0
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if why := available():
        raise SystemExit(f"cannot measure the page: {why}")
    entry = "maze-sim" if args.size == "64x64" else f"maze-sim?size={args.size}"
    serve_args = ["--host", "127.0.0.1", "--device", "cpu", "--models", entry, "--policy", "", "--no-tts",
                  "--no-access-log"]
    port = free_port()
    result: dict[str, Any] = {
        "question": "key press to the canvas on the demo page in Chromium: h264 against jpeg",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.world.bench_page_latency " + " ".join(sys.argv[1:] if argv is None else argv),
        **environment(),
        "server": "realtime serve " + " ".join(serve_args),
        "world": entry, "presses_per_format": args.presses, "block": args.block, "settle_ms": args.settle_ms,
        "keys": list(KEYS), "changed_pixel_level": LEVEL, "changed_share_min": SHARE,
        # Other work on the machine slows the server and the page alike; both formats alternate.
        "load_average_at_start": os.getloadavg(),
    }
    proc, ready_s = start_server(port, serve_args)
    try:
        result["server_ready_s"] = ready_s
        page = measure(f"127.0.0.1:{port}", args)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    result["load_average_at_end"] = os.getloadavg()
    result["versions"]["chromium"] = page["chromium"]
    fps = page["settings"]["jpeg"]["fps"]
    result.update({"fps": fps, "height": page["settings"]["jpeg"]["height"], "width": page["settings"]["jpeg"]["width"],
                   "h264_codec": page["settings"]["h264"]["codec"]})
    result["formats"] = {f: summary(page["presses"][f]) for f in FORMATS}
    for f in FORMATS:
        blocks = [b for b in page["blocks"] if b["format"] == f]
        result["formats"][f].update({
            "frames_drawn_per_s_median": statistics.median(b["frames_drawn_per_s"] for b in blocks),
            "stalls": sum(b["stalls"] for b in blocks),
            "still_noise_share_max": max(b["still_noise_share_max"] for b in blocks)})
    result["goal"] = goal(result["formats"], fps)
    result.update({"blocks": page["blocks"], "presses": page["presses"], "console_errors": page["console_errors"]})
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    return result


if __name__ == "__main__":
    out = main()
    for f, s in out["formats"].items():
        print(f"{f}: median {s.get('median_ms', float('nan')):.1f} ms, p90 {s.get('p90_ms', float('nan')):.1f} ms, "
              f"max {s.get('max_ms', float('nan')):.1f} ms, n {s['n']} (missed {s['missed']}), "
              f"{s['frames_drawn_per_s_median']:.1f} frames/s drawn")
    print(json.dumps(out["goal"]))
