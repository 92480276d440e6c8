"""Matrix-Game 2.0 through a real uvicorn server and real WebSocket clients (world.v1).

One server per module: a tiny random checkpoint root in the exact Skywork/Matrix-Game-2.0
layout, loaded by the factory table's ``matrix-game`` row at 32x64 on CPU, the base variant
beside Temple Run (no mouse), driven with keys.v1 and mouse.v1.
"""

from __future__ import annotations

import json
from typing import Iterator

import httpx
import pytest
import websockets

from clients.world import ServerError, WorldClient
from models import factory
from models.factory import BuildOptions, ModelEntry
from tests.support.served_world import png, run, serving, url

HEIGHT, WIDTH = 32, 64
KEYS = {"track": "keys", "schema": "keys.v1"}
MOUSE = {"track": "mouse", "schema": "mouse.v1"}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[str, object, object]]:
    from models.world.matrix_game.tiny_checkpoint import write_tiny_root

    root = write_tiny_root(tmp_path_factory.mktemp("matrix_game_e2e"), ("universal", "templerun"))
    options = BuildOptions(device="cpu", max_batch=2, height=HEIGHT, width=WIDTH)
    base = factory.build(ModelEntry("matrix-game", str(root)), options, kind="world")
    temple = factory.build(ModelEntry("matrix-game", str(root), (("variant", "templerun"),)), options, kind="world")
    temple.name = "matrix-game-templerun"
    with serving(base, temple) as addr:
        yield addr, base, temple


def test_models_lists_both_variants_with_their_controls(server):
    addr, _, _ = server
    models = {m["id"]: m for m in httpx.get(f"http://{addr}/v1/models").json()["data"]}
    mg, tr = models["matrix-game"], models["matrix-game-templerun"]
    assert (mg["height"], mg["width"], mg["frames_per_chunk"], mg["fps"]) == (HEIGHT, WIDTH, 12, 25.0)
    assert mg["control_schemas"] == ["keys.v1", "mouse.v1"] and mg["takes_image"] is True
    assert (mg["variant"], mg["mouse"], mg["weights_licence"]) == ("universal", True, "MIT")
    assert tr["control_schemas"] == ["keys.v1"] and tr["variant_keys"] == ["w", "a", "s", "d", "j", "l"]


def test_keys_and_mouse_drive_the_world_bad_controls_change_nothing_and_reset_replays(server):
    addr, base, _ = server

    async def main():
        async with WorldClient.connect(url(addr), session_id="mg") as c:
            created = await c.create(model="matrix-game", image=png(80, 40), format="rgb8", credits=0, seed=3)
            assert (created["height"], created["width"], created["frames_per_chunk"]) == (HEIGHT, WIDTH, 12)
            await c.event(event_id=1, controls=[{**KEYS, "data": {"mode": "state", "held": ["w"]}},
                                                {**MOUSE, "data": {"deltas": [[0.3, -0.1]] * 12}}])
            await c.credit(1)
            first = await c.next_chunk(credit=False)
            assert (first.chunk_index, first.applied_event_ids) == (0, [1])
            assert len(first.payloads) == 12 and all(f.shape == (HEIGHT, WIDTH, 3) for f in first.frames())
            assert base.pipeline.sessions["mg"].blocks == 1

            # Bad controls: documented errors, nothing accepted, the next chunk as if never sent.
            bad = [({**KEYS, "data": {"mode": "state", "held": ["q"]}}, "unknown key 'q'"),
                   ({**MOUSE, "data": {"deltas": [[5.0, 0.0]]}}, "outside [-1.0, 1.0]"),
                   ({**MOUSE, "data": {"deltas": [["left", 0.0]]}}, "yaw must be a finite number"),
                   ({**MOUSE, "data": {"deltas": []}}, "1..256"),
                   ({**MOUSE, "data": {"yaw": 0.1}}, "exactly 'deltas'")]
            for i, (control, text) in enumerate(bad):
                with pytest.raises(ServerError) as info:
                    await c.event(event_id=2 + i, controls=[control])
                assert info.value.code == "bad_request" and text in info.value.message, info.value.message
                assert info.value.event_id == 2 + i
            # NaN is not JSON; a client that writes it anyway is refused before any control is read.
            await c.send({"type": "event", "event_id": 9, "controls": [
                {**MOUSE, "data": {"deltas": [[float("nan"), 0.0]]}}]})
            err = await c.expect("error")
            assert err["code"] == "bad_request" and "NaN" in err["message"]

            await c.event(event_id=10, controls=[{**MOUSE, "data": {"deltas": [[-0.5, 0.2]] * 4}}])
            await c.credit(1)
            second = await c.next_chunk(credit=False)
            assert (second.chunk_index, second.applied_event_ids) == (1, [10])

            # Reset: the same image and seed, so the same controls make the same chunk 0.
            reset = await c.reset()
            assert reset["chunk_index"] == 0
            await c.event(event_id=11, controls=[{**KEYS, "data": {"mode": "state", "held": ["w"]}},
                                                 {**MOUSE, "data": {"deltas": [[0.3, -0.1]] * 12}}])
            await c.credit(1)
            again = await c.next_chunk(credit=False)
            assert (again.chunk_index, again.applied_event_ids) == (0, [11])
            assert again.payloads == first.payloads
            # Other keys and mouse make other frames from the same start.
            await c.reset()
            await c.event(event_id=12, controls=[{**KEYS, "data": {"mode": "state", "held": ["s", "j"]}}])
            await c.credit(1)
            other = await c.next_chunk(credit=False)
            assert other.payloads != first.payloads
            closed = await c.close()
            assert closed["session_id"] == "mg" and "mg" not in base.pipeline.sessions
            assert "mg" not in base.pipeline.cache

    run(main())


def test_two_sessions_share_batches_and_temple_run_refuses_the_mouse(server):
    addr, base, temple = server

    async def main():
        async with WorldClient.connect(url(addr), session_id="t1") as t, \
                WorldClient.connect(url(addr), session_id="m1") as m, \
                WorldClient.connect(url(addr), session_id="m2") as m2:
            await t.create(model="matrix-game-templerun", format="rgb8", credits=0, seed=1)
            with pytest.raises(ServerError) as info:
                await t.event(event_id=1, controls=[{**MOUSE, "data": {"deltas": [[0.1, 0.0]]}}])
            assert info.value.code == "bad_request" and "unknown track 'mouse'" in info.value.message
            with pytest.raises(ServerError) as info:
                await t.event(event_id=2, controls=[{**KEYS, "data": {"mode": "state", "held": ["i"]}}])
            assert "does nothing in matrix-game templerun" in info.value.message
            await t.event(event_id=3, controls=[{**KEYS, "data": {"mode": "script", "frames": [["w"], ["j"]]}}])
            await t.credit(1)
            chunk = await t.next_chunk(credit=False)
            assert (chunk.chunk_index, chunk.applied_event_ids, len(chunk.payloads)) == (0, [3], 12)

            sizes: list[int] = []
            run_blocks = base.pipeline.run

            def counted(requests):
                sizes.append(len(requests))
                return run_blocks(requests)

            base.pipeline.run = counted
            try:
                for c in (m, m2):
                    await c.create(model="matrix-game", format="rgb8", credits=0, seed=4)
                for c in (m, m2):
                    await c.credit(3)
                chunks = [[await c.next_chunk(credit=False) for _ in range(3)] for c in (m, m2)]
            finally:
                base.pipeline.run = run_blocks
            # The same seed, default image and no controls: the same frames, whichever batches.
            assert [ch.payloads for ch in chunks[0]] == [ch.payloads for ch in chunks[1]]
            assert sum(sizes) == 6 and max(sizes) == 2      # the two sessions shared forwards

    run(main())


def test_a_create_with_a_bad_image_creates_nothing(server):
    addr, base, _ = server

    async def main():
        async with websockets.connect(url(addr)) as ws:
            garbage = b"\x89PNG not really"
            await ws.send(json.dumps({"type": "session.create", "session_id": "x", "model": "matrix-game",
                                      "image": {"format": "png", "bytes": len(garbage)}}))
            await ws.send(garbage)
            answer = json.loads(await ws.recv())
            assert answer["code"] == "bad_request" and "not a valid png" in answer["message"]
            assert "x" not in base.pipeline.sessions

    run(main())


def test_a_session_that_cannot_fit_is_refused_busy_at_create_and_nothing_else_changes(tmp_path):
    """One resident slot and no host swap budget: a second player is refused ``busy`` at
    ``session.create`` (not at its first tick), the first keeps playing untouched, and once
    the first closes the same connection creates again."""
    from models.world.matrix_game.tiny_checkpoint import write_tiny_root

    root = write_tiny_root(tmp_path, ("universal",))
    one = factory.build(ModelEntry("matrix-game", str(root)),
                        BuildOptions(device="cpu", max_batch=1, height=HEIGHT, width=WIDTH, host_budget_bytes=0),
                        kind="world")
    assert one.pipeline.cache.max_sessions == 1

    async def main(addr: str):
        async with WorldClient.connect(url(addr), session_id="p1") as a, \
                WorldClient.connect(url(addr), session_id="p2") as b:
            await a.create(model="matrix-game", format="rgb8", credits=0, seed=5)
            await a.event(event_id=1, controls=[{**KEYS, "data": {"mode": "state", "held": ["w"]}}])
            await a.credit(1)
            assert (await a.next_chunk(credit=False)).chunk_index == 0
            p = one.pipeline
            before = (p.cache.num_free_blocks, dict(p.residency.metrics()), p.sessions["p1"])

            with pytest.raises(ServerError) as info:
                await b.create(model="matrix-game", format="rgb8", credits=0, seed=6)
            assert info.value.code == "busy", info.value.raw
            assert info.value.message.startswith("no room for a new session: it needs ")
            assert "(1 session held, 1 resident slot)" in info.value.message
            assert (p.cache.num_free_blocks, dict(p.residency.metrics()), p.sessions["p1"]) == before
            assert "p2" not in p.sessions and "p2" not in p.cache and not p.residency.is_swapped("p2")

            await a.credit(1)
            second = await a.next_chunk(credit=False)
            assert (second.chunk_index, second.applied_event_ids) == (1, [])
            assert p.sessions["p1"].blocks == 2
            await a.close()
            created = await b.create(model="matrix-game", format="rgb8", credits=0, seed=6)
            assert created["session_id"] == "p2"

    with serving(one) as addr:
        run(main(addr))


def test_the_page_captures_the_pointer_for_a_model_that_takes_mouse_v1(server):
    """The demo page in headless Chromium: a click on the canvas locks the pointer for
    matrix-game (it lists mouse.v1), motion goes out as mouse.v1 deltas the server accepts;
    Temple Run (no mouse.v1) gets no pointer lock."""
    import os

    from tests.support.browser import CHROMIUM, CHROMIUM_ARGS

    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} missing: apt-get install chromium")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    addr, _, _ = server
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1180, "height": 760})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            page.goto(f"http://{addr}/")
            page.wait_for_function("window.demo && (window.demo.ready || window.demo.bootError)")
            page.wait_for_function("demo.world.model === 'matrix-game' && demo.world.chunkIndex >= 0",
                                   timeout=60_000)
            box = page.locator("#world-canvas").bounding_box()
            cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
            page.mouse.click(cx, cy)
            page.wait_for_function("demo.world.mouse.locked", timeout=10_000)
            page.mouse.move(cx + 40, cy - 20)
            page.wait_for_function("demo.world.mouse.sent >= 1", timeout=10_000)
            yaw, pitch = page.evaluate("demo.world.mouse.last")
            assert yaw > 0 and pitch > 0 and max(abs(yaw), abs(pitch)) <= 1.0
            sent = page.evaluate("demo.world.lastEventId")
            page.wait_for_function(f"demo.world.appliedEventIds.includes({sent})", timeout=60_000)
            assert page.evaluate("demo.world.errors.length") == 0

            page.select_option("#world-model", "matrix-game-templerun")
            page.wait_for_function("demo.world.model === 'matrix-game-templerun' && demo.world.chunkIndex >= 0",
                                   timeout=60_000)
            assert page.evaluate("demo.world.mouse.locked") is False
            page.mouse.click(cx, cy)
            page.wait_for_timeout(300)
            assert page.evaluate("demo.world.mouse.locked") is False
            assert errors == []
        finally:
            browser.close()
