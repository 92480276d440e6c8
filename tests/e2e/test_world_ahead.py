"""world.v1 with two ticks per session in flight (``--ticks-in-flight 2``, and ``auto``'s
shared sessions): the same contract as one at a time, through a real uvicorn server and
real WebSocket clients."""

from __future__ import annotations

import asyncio
from typing import Iterator

import httpx
import pytest

from clients.world import WorldClient
from tests.e2e.conftest import serve, tiny_app
from tests.e2e.test_world import (  # noqa: F401 - collected here again, on this module's server
    run,
    scripted_app,
    test_chunks_are_contiguous_and_credit_bounded,
    test_error_codes_leave_the_session_intact,
    test_events_apply_in_order_at_chunk_boundaries,
    test_frames_follow_keys_and_are_deterministic,
    test_reset_restarts_at_zero_and_keeps_the_floor,
    test_two_interleaved_sessions_are_independent,
    url,
)


# Two ticks in flight for every session, a lone one too (``--ticks-in-flight 2``; the
# default ``auto`` keeps one for a session alone).
TWO_IN_FLIGHT = {"session_ticks_in_flight": 2, "session_ticks_in_flight_alone": None}


@pytest.fixture
def tiny_server() -> Iterator[str]:
    with serve(tiny_app(**TWO_IN_FLIGHT)) as addr:
        assert httpx.get(f"http://{addr}/healthz").text == "OK"
        yield addr


def test_every_accepted_event_is_applied_once_or_reported_dropped(tiny_server):
    """Events sent while two ticks are in flight land in later chunks; none is lost."""

    async def main():
        async with WorldClient.connect(url(tiny_server)) as c:
            await c.create("a1", credits=4)
            accepted, applied, indexes = [], [], []
            for i in range(1, 41):
                assert (await c.hold_keys(["w"] if i % 2 else ["d"], event_id=i))["status"] == "accepted"
                accepted.append(i)
                if i % 3 == 0:
                    chunk = await c.next_chunk()
                    indexes.append(chunk.chunk_index)
                    applied += chunk.applied_event_ids
            while not c.chunks.empty():
                chunk = c.chunks.get_nowait()
                indexes.append(chunk.chunk_index)
                applied += chunk.applied_event_ids
            closed = await c.close()
            while not c.chunks.empty():  # chunks sent before the close was answered
                chunk = c.chunks.get_nowait()
                indexes.append(chunk.chunk_index)
                applied += chunk.applied_event_ids
            assert indexes == list(range(len(indexes)))
            assert sorted(applied + closed["dropped_event_ids"]) == accepted
            assert len(set(applied)) == len(applied)

    run(main())


def test_a_failed_tick_drops_the_one_queued_behind_it():
    app, model = scripted_app(**TWO_IN_FLIGHT)
    with serve(app) as addr:
        async def main():
            async with WorldClient.connect(url(addr)) as bad, WorldClient.connect(url(addr)) as good:
                await good.create("good", credits=0)
                await bad.create("bad", credits=0)
                await bad.event(event_id=1, prompt="explode")
                await bad.credit(2)  # tick 0 runs (and fails) with tick 1 queued behind it
                err = await bad.expect("error")
                assert (err["code"], err["pending_event_ids"]) == ("session_failed", [1])
                await asyncio.sleep(0.2)
                assert bad.chunks.empty() and bad.messages.empty()  # one error, no chunk
                assert model.prompts.count("explode") == 1  # the queued tick never ran
                await good.credit(3)
                assert [(await good.next_chunk(credit=False)).chunk_index for _ in range(3)] == [0, 1, 2]
                await bad.send({"type": "event", "event_id": 2})
                assert (await bad.expect("error"))["code"] == "session_failed"
                assert (await bad.reset())["dropped_event_ids"] == [1]
                # The two credits no chunk spent run the reset session.
                chunks = [await bad.next_chunk(credit=False) for _ in range(2)]
                assert [(x.chunk_index, x.applied_event_ids) for x in chunks] == [(0, []), (1, [])]
                await bad.event(event_id=3)
                await bad.credit(1)
                assert (await bad.next_chunk(credit=False)).applied_event_ids == [3]

        run(main())


def test_reset_and_close_with_two_ticks_in_flight():
    app, model = scripted_app(**TWO_IN_FLIGHT)
    model.delay = 0.05
    with serve(app) as addr:
        async def main():
            async with WorldClient.connect(url(addr)) as c:
                await c.create("r1", credits=8)
                await c.next_chunk(credit=False)
                await c.event(event_id=7)
                reset = await c.reset()  # ticks are in flight: they finish or are dropped, then chunk 0
                assert reset["chunk_index"] == 0
                applied = []
                while not c.chunks.empty():  # chunks committed before the reset
                    applied += c.chunks.get_nowait().applied_event_ids
                # Event 7 went into a chunk that was committed and sent, or the reset dropped it.
                assert (7 in applied) != (7 in reset["dropped_event_ids"])
                await c.credit(2)
                first = await c.next_chunk(credit=False)
                assert first.chunk_index == 0
                await c.credit(4)
                closed = await c.close()
                assert closed["type"] == "session.closed"
            async with WorldClient.connect(url(addr)) as c:  # the id is free again
                await c.create("r1", credits=2)
                assert [(await c.next_chunk(credit=False)).chunk_index for _ in range(2)] == [0, 1]

        run(main())


def test_the_same_script_gives_the_same_frames_with_one_or_two_ticks_in_flight():
    """Controls prepared on top of an uncommitted tick equal the ones prepared after it."""

    async def play(addr: str) -> list:
        async with WorldClient.connect(url(addr)) as c:
            await c.create("same", credits=0, format="rgb8", seed=5)
            await c.script_keys([["j"], ["j"], ["w"], [], ["l"], ["l"], ["l"], ["s"]])
            await c.hold_keys(["d"])
            await c.credit(12)
            chunks = [await c.next_chunk(credit=False) for _ in range(12)]
            return [(x.chunk_index, x.applied_event_ids, x.frames()[0].tobytes()) for x in chunks]

    results = []
    for depth in (1, 2):
        with serve(tiny_app(session_ticks_in_flight=depth, session_ticks_in_flight_alone=None)) as addr:
            results.append(run(play(addr)))
    assert [r[:2] for r in results[0]] == [(i, [0, 1] if i == 0 else []) for i in range(12)]
    assert results[0] == results[1]


def test_auto_keeps_one_tick_for_a_session_alone_and_two_once_shared():
    """``--ticks-in-flight auto``: alone, a session's next tick is built after its last one
    committed; once a second session is live, each queues its next tick while one runs."""
    app, model = scripted_app(session_ticks_in_flight=2, session_ticks_in_flight_alone=1)
    model.delay = 0.02
    queued_at_end: list[int] = []  # the model's queued ticks as each batch ends
    uncommitted_at_build: list[int] = []  # the session's chunks begun, not committed, as one is built
    run_batch, tick = model.run_batch, model.tick

    def recording(works):
        out = run_batch(works)
        queued_at_end.append(app.state.engine.queued(model.name))  # the engine starts with the app
        return out

    def building(request, *args, **kwargs):
        session = app.state.world_sessions.get(request.session_id)
        uncommitted_at_build.append(request.chunk_index - session.chunk_index)
        return tick(request, *args, **kwargs)

    model.run_batch, model.tick = recording, building
    with serve(app) as addr:
        async def main():
            async with WorldClient.connect(url(addr)) as a:
                await a.create("alone", credits=8)
                assert [(await a.next_chunk()).chunk_index for _ in range(8)] == list(range(8))
                alone = list(queued_at_end)
                assert alone and max(alone) == 0  # nothing was queued behind a running tick
                assert uncommitted_at_build[:8] == [0] * 8  # each built on a committed session
                async with WorldClient.connect(url(addr)) as b:
                    await b.create("shared", credits=8)
                    queued_at_end.clear()
                    got = [(await a.next_chunk()).chunk_index for _ in range(8)]
                    assert got == list(range(8, 16))
                    assert [(await b.next_chunk()).chunk_index for _ in range(8)] == list(range(8))
                    assert max(queued_at_end) >= 1  # next ticks waited in the engine's queue

        run(main())


def test_a_committed_ticks_next_one_is_queued_before_its_chunk_goes_out(monkeypatch):
    """Next tick first (realtime/endpoints/world_driver.py): a session alone queues tick N+1 as soon as N
    commits, while chunk N-1 may still be on its way."""
    import realtime.endpoints.world_driver as world_driver

    app, model = scripted_app()  # auto: one tick in flight for a session alone
    built: dict[int, float] = {}
    sent: dict[int, float] = {}
    send_chunk, tick = world_driver.TickDriver._send_chunk, model.tick

    async def slow_first_send(self, request, *args, **kwargs):
        if request.chunk_index == 0:
            await asyncio.sleep(0.5)  # chunk 0 still going out while tick 1 runs and commits
        await send_chunk(self, request, *args, **kwargs)
        sent[request.chunk_index] = asyncio.get_running_loop().time()

    def building(request, *args, **kwargs):
        built.setdefault(request.chunk_index, asyncio.get_running_loop().time())
        return tick(request, *args, **kwargs)

    monkeypatch.setattr(world_driver.TickDriver, "_send_chunk", slow_first_send)
    model.tick = building
    with serve(app) as addr:
        async def main():
            async with WorldClient.connect(url(addr)) as a:
                await a.create("alone", credits=4)
                assert [(await a.next_chunk()).chunk_index for _ in range(4)] == list(range(4))

        run(main())
    # Tick 2 comes after tick 1's commit: first, it is built while chunk 0 is still going out.
    assert built[2] < sent[0]


def test_a_tick_that_cannot_be_built_fails_after_the_chunk_before():
    """The model's ``tick`` raising for chunk 2 (its own bug, found as chunk 1 commits): chunk 1
    still reaches the client, then the session's error, and nothing after it."""
    app, model = scripted_app()
    tick = model.tick

    def building(request, *args, **kwargs):
        if request.chunk_index == 2:
            raise ValueError("simulated tick bug")
        return tick(request, *args, **kwargs)

    model.tick = building
    with serve(app) as addr:
        async def main():
            async with WorldClient.connect(url(addr)) as a:
                await a.create("bug", credits=4)
                err = await a.expect("error")
                assert "simulated tick bug" in err["message"]
                assert [(await a.next_chunk(credit=False)).chunk_index for _ in range(a.chunks.qsize())] == [0, 1]
                await a.send({"type": "session.reset"})
                assert (await a.expect("session.reset"))["type"] == "session.reset"

        run(main())
