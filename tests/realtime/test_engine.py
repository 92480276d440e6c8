"""The engine loop with small real adapters: lanes, batching, failure isolation, death."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Mapping, Sequence

import pytest

from models.base import EngineDeadError, ModelAdapter, ModelError
from realtime.engine import NOT_RUN, Engine, EngineStopped, TickCancelled


class Doubler(ModelAdapter[int, int]):
    """Doubles ints; fails on 13; kills the engine on 666; records batches and end_ticks."""

    kind = "test"

    def __init__(self, name: str = "doubler", max_batch: int = 4, delay: float = 0.0) -> None:
        self.name, self.max_batch, self.delay = name, max_batch, delay
        self.batches: list[list[int]] = []
        self.ended: list[tuple[str, bool]] = []
        self.released: list[str] = []
        self.gate = threading.Event()
        self.gate.set()

    def describe(self) -> Mapping[str, Any]:
        return {"name": self.name}

    def run_batch(self, works: Sequence[int]) -> list[int]:
        self.gate.wait(5)
        self.batches.append(list(works))
        if self.delay:
            time.sleep(self.delay)
        if 666 in works:
            raise EngineDeadError("device lost")
        if 13 in works:
            raise ValueError("unlucky")
        return [w * 2 for w in works]

    def end_tick(self, session_id: str, committed: bool) -> None:
        self.ended.append((session_id, committed))

    def drop_session(self, session_id: str) -> None:
        self.released.append(session_id)


def with_engine(adapter: ModelAdapter, coro_fn, batch_wait_ms: float = 20.0, **kwargs):
    engine = Engine({adapter.name: adapter}, batch_wait_ms=batch_wait_ms, **kwargs)
    engine.start()
    try:
        return asyncio.run(asyncio.wait_for(coro_fn(engine), 20))
    finally:
        engine.stop()


def test_ticks_of_sessions_are_batched_and_end_ticks_reported():
    model = Doubler(max_batch=4)

    async def main(engine: Engine):
        hold = threading.Event()
        engine.post_control(lambda: hold.wait(5))  # the engine is busy while all four queue
        ticks = asyncio.gather(*(engine.submit("doubler", i, session_id=f"s{i}") for i in range(4)))
        await asyncio.sleep(0.05)
        hold.set()
        return await ticks

    assert with_engine(model, main) == [0, 2, 4, 6]
    assert model.batches == [[0, 1, 2, 3]]
    assert sorted(model.ended) == [(f"s{i}", True) for i in range(4)]


def test_a_fleet_in_a_loop_stays_in_full_batches():
    """Sessions answered by one batch are waited for; a lone newcomer is not."""
    model = Doubler(max_batch=8, delay=0.02)

    async def robot(engine: Engine, sid: str, calls: int) -> None:
        for k in range(calls):
            await engine.submit("doubler", 100 + k, session_id=sid)
            await asyncio.sleep(0.001 * (hash(sid) % 3))  # robots take a moment to act

    async def main(engine: Engine):
        hold = threading.Event()
        engine.post_control(lambda: hold.wait(5))
        fleet = asyncio.gather(*(robot(engine, f"r{i}", 6) for i in range(8)))
        await asyncio.sleep(0.05)
        hold.set()
        await fleet

    with_engine(model, main, batch_wait_ms=50.0)
    assert [len(b) for b in model.batches] == [8] * 6


def test_a_full_queue_ends_the_wait_for_returners():
    """Waiting for the last batch's sessions stops once a full batch is queued anyway."""
    model = Doubler(max_batch=4)

    async def main(engine: Engine):
        await engine.submit("doubler", 1, session_id="gone")   # returner that never comes back
        started = time.perf_counter()
        await asyncio.gather(*(engine.submit("doubler", 20 + i, session_id=f"n{i}") for i in range(4)))
        return time.perf_counter() - started

    assert with_engine(model, main, batch_wait_ms=3000.0) < 1.0
    assert model.batches == [[1], [20, 21, 22, 23]]


def test_two_robots_driven_in_turn_never_wait_for_each_other():
    """One client calling robot a, then robot b, then a again: neither comes back while the
    other runs, so neither is waited for (each waited the whole batch wait before)."""
    model = Doubler(max_batch=8, delay=0.02)

    async def main(engine: Engine):
        for k in range(2):  # first ticks count as quick: a newcomer beside them may wait once
            for sid in ("a", "b"):
                await engine.submit("doubler", k, session_id=sid)
        started = time.perf_counter()
        for k in range(10):
            for sid in ("a", "b"):
                await engine.submit("doubler", k, session_id=sid)
        return (time.perf_counter() - started) / 20

    # 20 ms forwards; a wait would add the whole 1 s batch wait to a call.
    assert with_engine(model, main, batch_wait_ms=1000.0) < 0.2
    assert all(len(b) == 1 for b in model.batches)


def test_a_session_that_acts_between_calls_or_left_is_not_waited_for():
    """A robot that takes longer than half a forward to call again, or that was released,
    holds no one back: the next caller runs at once."""
    model = Doubler(max_batch=8, delay=0.02)

    async def main(engine: Engine):
        await engine.submit("doubler", 1, session_id="slow")
        await asyncio.sleep(0.1)  # acting: 100 ms after its forward, well past 10 ms
        await engine.submit("doubler", 2, session_id="slow")
        started = time.perf_counter()
        await engine.submit("doubler", 3, session_id="other")
        slow_gone = time.perf_counter() - started
        await engine.submit("doubler", 4, session_id="once")  # a first tick: a returner
        await engine.drop_session("doubler", "once")
        assert "once" not in engine._sched.returners("doubler") and engine._sched.ended_at("doubler", "once") is None
        started = time.perf_counter()
        await engine.submit("doubler", 5, session_id="other")
        return slow_gone, time.perf_counter() - started

    slow, released = with_engine(model, main, batch_wait_ms=1000.0)
    assert slow < 0.5 and released < 0.5  # a wait is 1 s


def test_a_batch_resolves_every_future_with_its_own_result():
    model = Doubler(max_batch=16)

    async def main(engine: Engine):
        return await asyncio.gather(*(engine.submit("doubler", 100 + i, session_id=f"s{i}") for i in range(40)))

    assert with_engine(model, main) == [2 * (100 + i) for i in range(40)]


def test_a_lone_session_does_not_wait():
    model = Doubler(max_batch=8)

    async def main(engine: Engine):
        started = time.perf_counter()
        for k in range(20):
            await engine.submit("doubler", 100 + k, session_id="alone")
        return (time.perf_counter() - started) / 20

    # batch_wait is 1 s: a lone session (its own only returner) never pays it.
    assert with_engine(model, main, batch_wait_ms=1000.0) < 0.1


def test_one_session_never_twice_in_a_batch():
    model = Doubler(max_batch=4)

    async def main(engine: Engine):
        return await asyncio.gather(*(engine.submit("doubler", i, session_id="same") for i in range(3)))

    assert with_engine(model, main) == [0, 2, 4]
    assert model.batches == [[0], [1], [2]]


def test_a_failing_work_fails_alone():
    model = Doubler(max_batch=4)

    async def main(engine: Engine):
        hold = threading.Event()
        engine.post_control(lambda: hold.wait(5))
        ticks = asyncio.gather(
            *(engine.submit("doubler", w, session_id=f"s{w}") for w in (1, 13, 3)), return_exceptions=True
        )
        await asyncio.sleep(0.05)
        hold.set()
        return await ticks

    one, bad, three = with_engine(model, main)
    assert (one, three) == (2, 6)
    assert isinstance(bad, ModelError) and "unlucky" in str(bad)
    # The batch failed whole, then each work ran alone.
    assert model.batches == [[1, 13, 3], [1], [13], [3]]
    assert ("s13", False) in model.ended and ("s1", True) in model.ended


def test_validate_failure_is_not_committed():
    model = Doubler(max_batch=1)

    def reject_odd(result: int) -> None:
        if result % 4:
            raise ValueError("metadata mismatch")

    async def main(engine: Engine):
        ok = await engine.submit("doubler", 2, session_id="a", validate=reject_odd)
        with pytest.raises(ModelError):
            await engine.submit("doubler", 1, session_id="b", validate=reject_odd)
        return ok

    assert with_engine(model, main) == 4
    assert model.ended == [("a", True), ("b", False)]


def test_control_lane_runs_before_queued_ticks_and_purges():
    model = Doubler(max_batch=1)
    order: list[str] = []

    async def main(engine: Engine):
        model.gate.clear()  # hold the engine inside the first batch
        first = asyncio.ensure_future(engine.submit("doubler", 1, session_id="a"))
        await asyncio.sleep(0.05)
        queued = [asyncio.ensure_future(engine.submit("doubler", i, session_id="b")) for i in (2, 3)]
        await asyncio.sleep(0.05)
        control = asyncio.ensure_future(engine.control(lambda: order.append("control") or "done"))
        release = asyncio.ensure_future(engine.drop_session("doubler", "b"))
        await asyncio.sleep(0.05)
        model.gate.set()
        assert await first == 2
        assert await control == "done"
        await release
        for q in queued:
            with pytest.raises(TickCancelled):
                await q

    with_engine(model, main)
    assert order == ["control"]
    assert model.batches == [[1]]
    assert model.released == ["b"]


def test_dead_engine_fails_everything_fast():
    model = Doubler(max_batch=1)

    async def main(engine: Engine):
        with pytest.raises(EngineDeadError):
            await engine.submit("doubler", 666, session_id="x")
        assert not engine.healthy and "device lost" in engine.dead_reason
        with pytest.raises(EngineDeadError):
            await engine.submit("doubler", 1, session_id="y")
        with pytest.raises(EngineDeadError):
            await engine.control(lambda: None)

    with_engine(model, main)


def test_stop_rejects_waiting_work():
    model = Doubler(max_batch=1)
    engine = Engine({model.name: model})
    engine.start()
    engine.stop()

    async def main():
        with pytest.raises(EngineStopped):
            await engine.submit("doubler", 1)

    asyncio.run(main())


def test_models_never_run_on_the_event_loop_thread():
    seen: list[str] = []

    class Where(Doubler):
        def run_batch(self, works):
            seen.append(threading.current_thread().name)
            return super().run_batch(works)

    async def main(engine: Engine):
        await engine.submit("doubler", 1)

    with_engine(Where(), main)
    assert seen == ["engine"]


class CudaFailing(Doubler):
    """Raises what torch raises for a failed kernel, or a RuntimeError that merely mentions CUDA."""

    def run_batch(self, works: Sequence[int]) -> list[int]:
        import torch  # already imported by the test: a first import is slow on a busy box

        if 7 in works:
            raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
        if 8 in works:
            raise RuntimeError("CUDA error: looks fatal, is not one by type")
        return super().run_batch(works)


def test_fatal_errors_are_recognised_by_type_not_text():
    import torch  # noqa: F401 - before the engine's 20 s deadline starts

    async def main(engine: Engine):
        with pytest.raises(ModelError, match="looks fatal"):
            await engine.submit("doubler", 8, session_id="a")
        assert engine.healthy
        with pytest.raises(EngineDeadError, match="illegal memory access"):
            await engine.submit("doubler", 7, session_id="b")
        assert not engine.healthy
        with pytest.raises(EngineDeadError):
            await engine.submit("doubler", 1, session_id="c")

    with_engine(CudaFailing(), main)


class Resettable(Doubler):
    def __init__(self) -> None:
        super().__init__()
        self.resets: list[str] = []
        self.entered = threading.Event()

    def run_batch(self, works: Sequence[int]) -> list[int]:
        self.entered.set()
        return super().run_batch(works)

    def reset(self, session_id: str) -> None:
        self.resets.append(session_id)


def test_release_and_reset_for_any_adapter_drop_queued_ticks():
    model = Resettable()
    model.gate.clear()

    async def main(engine: Engine):
        running = asyncio.ensure_future(engine.submit("doubler", 1, session_id="a"))
        assert await asyncio.to_thread(model.entered.wait, 10)  # "a" is in run_batch, held by the gate
        queued = asyncio.ensure_future(engine.submit("doubler", 2, session_id="a"))
        await asyncio.sleep(0)  # queued behind the running batch
        reset = asyncio.ensure_future(engine.reset("doubler", "a"))
        await asyncio.sleep(0)  # the reset is on the control lane before the running batch ends
        model.gate.set()
        assert await running == 2
        await reset
        with pytest.raises(TickCancelled):
            await queued
        await engine.drop_session("doubler", "b")
        return model.resets, model.released

    assert with_engine(model, main) == (["a"], ["b"])


def test_a_failing_control_job_reaches_its_caller_only():
    class BadRelease(Doubler):
        def drop_session(self, session_id: str) -> None:
            raise KeyError(session_id)

    async def main(engine: Engine):
        with pytest.raises(KeyError):
            await engine.drop_session("doubler", "x")
        assert engine.healthy
        return await engine.submit("doubler", 3, session_id="x")

    assert with_engine(BadRelease(), main) == 6


# ----------------------------------------------------------------------------- inline forwards
class FastDoubler(Doubler):
    """A Doubler that may run inline; records the thread of every forward."""

    inline_forward_s = 0.05

    def __init__(self) -> None:
        super().__init__(name="fast", max_batch=4)
        self.threads: list[int] = []

    def run_batch(self, works: Sequence[int]) -> list[int]:
        self.threads.append(threading.get_ident())
        return super().run_batch(works)


async def _measured_fast(engine: Engine) -> None:
    """Submit until the engine runs "fast" inline (forwards preempted by the OS do not count)."""
    k = 0
    while engine.run_now("fast", 1, session_id="r") is NOT_RUN and k < 200:
        await engine.submit("fast", 1, session_id="r")
        k += 1


def test_a_fast_model_runs_inline_once_measured_and_goes_back_after_a_slow_forward():
    from realtime.engine.scheduler import INLINE_WINDOW

    model = FastDoubler()

    async def main(engine: Engine):
        me = threading.get_ident()
        # Forwards preempted by the OS are not counted, so on a busy host measuring may
        # take a few more than INLINE_WINDOW.
        k = 0
        while (out := engine.run_now("fast", k, session_id="r")) is NOT_RUN and k < 200:
            assert await engine.submit("fast", k, session_id="r") == 2 * k
            k += 1
        assert out == 2 * k  # answered here and now
        first = model.threads.index(me)
        assert first >= INLINE_WINDOW and me not in model.threads[:first]
        # A submitted tick is queued for the engine thread all the same: one inline path.
        queued = engine.submit_future("fast", 5, session_id="r")
        assert not queued.done()
        assert await queued == 10 and model.threads[-1] != me
        for _ in range(3):  # (again if the OS preempted the slow one: it did not count)
            await _measured_fast(engine)
            model.delay = 0.1  # over inline_forward_s: the forward after it goes to the engine thread
            slow = engine.run_now("fast", 6, session_id="r")
            model.delay = 0.0
            after = engine.run_now("fast", 7, session_id="r")
            if after is NOT_RUN:
                break
        assert model.threads[-1] == me  # the slow one ran inline, the next did not run at all
        assert await engine.submit("fast", 7, session_id="r") == 14 and model.threads[-1] != me
        return slow, after

    assert with_engine(model, main) == (12, NOT_RUN)
    assert model.ended[-1] == ("r", True)
    assert all(committed for _, committed in model.ended)


def test_inline_never_overtakes_a_control_or_a_queued_tick():
    model = FastDoubler()

    async def main(engine: Engine):
        await _measured_fast(engine)
        hold = threading.Event()
        order: list[str] = []
        engine.post_control(lambda: (hold.wait(5), order.append("control")))
        await asyncio.sleep(0.05)  # the engine thread is in the control
        ran = len(model.batches)
        assert engine.run_now("fast", 100, session_id="a") is NOT_RUN  # behind the control, not here
        pending = engine.submit_future("fast", 100, session_id="a")
        assert engine.run_now("fast", 101, session_id="b") is NOT_RUN  # a tick is queued: this waits its turn too
        second = engine.submit_future("fast", 101, session_id="b")
        assert len(model.batches) == ran
        hold.set()
        assert await pending == 200 and await second == 202
        order.append("ticks")
        return order

    assert with_engine(model, main) == ["control", "ticks"]
    assert model.batches[-1] == [100, 101]


def test_a_model_without_inline_forward_s_always_runs_on_the_engine_thread():
    model = Doubler(max_batch=4)
    seen: list[int] = []
    run = model.run_batch
    model.run_batch = lambda works: (seen.append(threading.get_ident()), run(works))[1]  # type: ignore[method-assign]

    async def main(engine: Engine):
        for k in range(20):
            assert engine.run_now("doubler", k, session_id="r") is NOT_RUN
            await engine.submit("doubler", 100 + k, session_id="r")
        return threading.get_ident(), engine.stats.inline_works

    me, inline = with_engine(model, main)
    assert inline == 0 and me not in seen


class FailingEndTick(FastDoubler):
    """A FastDoubler whose end_tick raises for session "bad"."""

    def end_tick(self, session_id: str, committed: bool) -> None:
        super().end_tick(session_id, committed)
        if session_id == "bad" and committed:
            raise ValueError("cannot keep it")


def test_run_now_answers_inline_with_the_same_outcome_and_stats_as_submit():
    model = FailingEndTick()

    async def main(engine: Engine):
        assert engine.run_now("fast", 3, session_id="r") is NOT_RUN  # not measured yet: nothing ran
        assert model.batches == []
        await _measured_fast(engine)
        me = threading.get_ident()
        works, inline, ticks = engine.stats.works, engine.stats.inline_works, engine.stats.models["fast"].ticks
        result = engine.run_now("fast", 21, session_id="r")
        if result is NOT_RUN:  # a loaded host stretched the forward before: measure again
            await _measured_fast(engine)
            works, inline, ticks = engine.stats.works, engine.stats.inline_works, engine.stats.models["fast"].ticks
            result = engine.run_now("fast", 21, session_id="r")
        assert result == 42
        assert model.threads[-1] == me and model.ended[-1] == ("r", True)
        assert (engine.stats.works, engine.stats.inline_works, engine.stats.models["fast"].ticks) == (
            works + 1, inline + 1, ticks + 1)
        # its forward's end noted, as for a submitted tick (microseconds after the last: not quick)
        assert engine._sched.ended_at("fast", "r") <= time.perf_counter()
        assert engine._sched.returners("fast") == frozenset()
        # A failing forward: not committed, the error that awaiting submit would raise.
        await _measured_fast(engine)  # (again, should a loaded host have stretched a forward)
        with pytest.raises(ModelError, match="ValueError: unlucky"):
            engine.run_now("fast", 13, session_id="r")
        assert model.ended[-1] == ("r", False) and engine.stats.failed_works == 1
        # An end_tick that raises: the tick does not count, the session gets a ModelError.
        await _measured_fast(engine)
        works = engine.stats.works
        with pytest.raises(ModelError, match="ValueError: cannot keep it"):
            engine.run_now("fast", 4, session_id="bad")
        assert engine.stats.works == works and engine.stats.failed_works == 2
        # While a control is pending, nothing runs here: the caller queues instead.
        hold = threading.Event()
        engine.post_control(lambda: hold.wait(5))
        await asyncio.sleep(0.05)
        ran = len(model.batches)
        assert engine.run_now("fast", 5, session_id="r") is NOT_RUN and len(model.batches) == ran
        hold.set()
        await asyncio.sleep(0.05)
        # A fatal error kills the engine, as from the engine thread.
        await _measured_fast(engine)
        with pytest.raises(EngineDeadError):
            engine.run_now("fast", 666, session_id="r")
        assert not engine.healthy
        with pytest.raises(EngineDeadError):
            engine.run_now("fast", 1, session_id="r")

    with_engine(model, main)


def test_a_submit_the_engine_waits_for_hands_it_the_gil(monkeypatch):
    """The one session of the last batch coming back hands the GIL over (the engine takes
    its batch at once); a new session, or one of several, hands nothing."""
    import realtime.engine.loop as engine_module

    handed: list[str] = []
    monkeypatch.setattr(engine_module, "hand_off_gil", lambda: handed.append("x"))
    model = Doubler(max_batch=4, delay=0.1)

    async def main(engine: Engine):
        async def submit(work: int, sid: str) -> int:
            out = await engine.submit(model.name, work, session_id=sid)
            # The engine thread notes the batch's sessions after resolving it; back within
            # half a forward (50 ms), so each session stays one the engine waits for.
            await asyncio.sleep(0.02)
            return out

        assert await submit(1, "a") == 2  # a new session: nothing
        assert handed == []
        assert await submit(2, "a") == 4  # the lone returner
        assert handed == ["x"]
        assert await submit(3, "b") == 6  # not the one it ran
        assert handed == ["x"]
        assert await asyncio.gather(submit(4, "b"), submit(5, "c")) == [8, 10]
        assert len(handed) == 2  # b came back alone (c was new)
        # Whatever the last round was, the engine waits for c this time: one batch.
        assert await asyncio.gather(submit(6, "b"), submit(7, "c")) == [12, 14]
        assert model.batches[-1] == [6, 7]
        handed.clear()
        assert await asyncio.gather(submit(8, "b"), submit(9, "c")) == [16, 18]
        assert model.batches[-1] == [8, 9] and handed == []  # two returners: no hand-off

    with_engine(model, main, batch_wait_ms=200.0)


def test_an_engine_without_the_gil_hand_off_hands_nothing(monkeypatch):
    """``EngineConfig.gil_hand_off`` off: the lone returner's submit hands nothing either."""
    import realtime.engine.loop as engine_module

    handed: list[str] = []
    monkeypatch.setattr(engine_module, "hand_off_gil", lambda: handed.append("x"))
    model = Doubler(max_batch=4, delay=0.1)

    async def main(engine: Engine):
        for work in (1, 2, 3):
            assert await engine.submit(model.name, work, session_id="a") == 2 * work
            await asyncio.sleep(0.02)
        assert handed == []

    with_engine(model, main, batch_wait_ms=200.0, gil_hand_off=False)


def _two_models(main, world_delay: float = 0.05) -> tuple[Doubler, Doubler, list[str]]:
    """A slow "world" and a quick "voice" on one engine; ``order`` lists which ran, batch by batch."""
    world, voice = Doubler("world", max_batch=1, delay=world_delay), Doubler("voice", max_batch=1)
    order: list[str] = []
    for model in (world, voice):
        run = model.run_batch
        model.run_batch = lambda works, run=run, name=model.name: order.append(name) or run(works)  # type: ignore[method-assign]
    engine = Engine({"world": world, "voice": voice}, batch_wait_ms=200.0)  # roomy: CI may be loaded
    engine.start()
    try:
        asyncio.run(asyncio.wait_for(main(engine, world, order), 20))
    finally:
        engine.stop()
    return world, voice, order


async def _hold(engine: Engine, world: Doubler) -> asyncio.Future:
    """A world batch held running (until ``world.gate`` is set)."""
    world.gate.clear()
    held = asyncio.ensure_future(engine.submit("world", 2, session_id="w"))
    await asyncio.sleep(0.02)
    return held


async def _hold_the_world(engine: Engine, world: Doubler) -> asyncio.Future:
    """The world's forward time measured (50 ms), then a world batch held running."""
    assert await engine.submit("world", 1, session_id="w") == 2
    return await _hold(engine, world)


def test_a_tick_that_would_miss_its_deadline_goes_before_an_older_batch():
    async def main(engine: Engine, world: Doubler, order: list[str]):
        assert await engine.submit("world", 1, session_id="w") == 2  # its forward time: 50 ms
        for deadline, want in ((None, ["world", "voice"]), (30.0, ["world", "voice"]), (0.0, ["voice", "world"])):
            held = await _hold(engine, world)  # the engine in a world batch while both queue
            older = asyncio.ensure_future(engine.submit("world", 3, session_id="w2"))
            await asyncio.sleep(0.01)
            due = None if deadline is None else time.perf_counter() + deadline
            voice = asyncio.ensure_future(engine.submit("voice", 4, session_id="v", deadline=due))
            await asyncio.sleep(0.01)
            start = len(order)
            world.gate.set()
            assert (await held, await older, await voice) == (4, 6, 8)
            # Oldest first unless the voice would miss its deadline waiting for the world's 50 ms.
            assert order[start:] == want, deadline
            await asyncio.sleep(0.25)  # past the engine's wait for the voice's return

    _two_models(main)


def test_after_a_batch_with_deadlines_its_sessions_are_awaited_before_another_model():
    async def main(engine: Engine, world: Doubler, order: list[str]):
        held = await _hold_the_world(engine, world)
        first = asyncio.ensure_future(engine.submit("voice", 1, session_id="v", deadline=time.perf_counter()))
        await asyncio.sleep(0.01)
        world.gate.set()
        assert await held == 4
        nxt = asyncio.ensure_future(engine.submit("world", 3, session_id="w"))  # queued before the voice returns
        assert await first == 2
        # The voice's next window comes a moment after its result: it runs before the world's tick.
        assert await engine.submit("voice", 2, session_id="v", deadline=time.perf_counter()) == 4
        assert await nxt == 6

    _, _, order = _two_models(main)
    assert order == ["world", "world", "voice", "voice", "world"]


def test_a_tick_that_waited_the_defer_limit_is_not_passed_over():
    from realtime.engine.scheduler import DEADLINE_DEFER_MAX_S

    async def main(engine: Engine, world: Doubler, order: list[str]):
        held = await _hold_the_world(engine, world)
        older = asyncio.ensure_future(engine.submit("world", 3, session_id="w2"))
        await asyncio.sleep(DEADLINE_DEFER_MAX_S + 0.05)  # the older tick has waited its limit
        voice = asyncio.ensure_future(engine.submit("voice", 4, session_id="v", deadline=time.perf_counter()))
        await asyncio.sleep(0.01)
        world.gate.set()
        assert (await held, await older, await voice) == (4, 6, 8)

    _, _, order = _two_models(main)
    assert order == ["world", "world", "world", "voice"]


def test_the_engine_sets_its_switch_interval_at_start():
    """``EngineConfig.switch_interval_s`` reaches the interpreter when the engine starts; 0 leaves it."""
    import sys

    before = sys.getswitchinterval()
    try:
        for given, want in ((0.002, 0.002), (0.0, 0.002)):
            engine = Engine({}, switch_interval_s=given)
            engine.start()
            engine.stop()
            assert sys.getswitchinterval() == pytest.approx(want)
    finally:
        sys.setswitchinterval(before)
