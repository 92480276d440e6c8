"""Held results (realtime/engine/overlap.py): a launching model's batch is resolved at the next
batch's launch; a failed tick of a chained model drops the session's queued ticks."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Mapping, Sequence

import pytest

from models.base import ModelAdapter, ModelError
from realtime.engine import Engine, TickCancelled


class Chain(ModelAdapter[tuple, str]):
    """Launches its device work (``launched()``) and logs each batch's works and how many
    results the engine held as it started; ``("boom", sid)`` fails that tick."""

    kind = "test"
    name = "chain"
    max_batch = 8
    chained_ticks = True

    def __init__(self) -> None:
        self.log: list[tuple[str, ...]] = []     # works of each batch, in order
        self.results = 0                         # written by the loop, read here (a counter)
        self.first = threading.Event()           # the test lets the first batch go when all are queued
        self.first.set()
        self.compute_s = 0.0
        self.engine: Engine | None = None
        self.held_at_start: list[int] = []       # results the engine held as each batch started

    def describe(self) -> Mapping[str, Any]:
        return {"name": self.name}

    def run_batch(self, works: Sequence[tuple]) -> list[str]:
        self.first.wait(10)
        self.held_at_start.append(len(self.engine._held) if self.engine is not None else 0)
        time.sleep(self.compute_s)  # work done before the launch is announced
        self.launched()
        self.log.append(tuple(f"{w[1]}:{w[0]}" for w in works))
        out = []
        for what, sid in works:
            if what == "boom":
                raise ModelError(f"{sid} exploded")
            out.append(f"{sid}:{what}")
        return out


def run(model: Chain, main):
    engine = Engine({model.name: model}, batch_wait_ms=0)
    model.engine = engine
    engine.start()
    try:
        return asyncio.run(asyncio.wait_for(main(engine), 20))
    finally:
        engine.stop()


async def rounds(engine: Engine, model: Chain, n: int) -> list[str]:
    """``n`` ticks each of sessions a and b, queued before the first batch starts; the model
    counts the results the loop has taken (``results``)."""
    futs = [engine.submit_future(model.name, (str(t), sid), session_id=sid) for t in range(n) for sid in "ab"]
    for f in futs:
        f.add_done_callback(lambda _: setattr(model, "results", model.results + 1))
    model.first.set()
    return list(await asyncio.gather(*futs))


def test_a_batch_is_resolved_at_the_next_launch_and_at_once_when_nothing_follows():
    model = Chain()
    model.first.clear()

    out = run(model, lambda engine: rounds(engine, model, 3))
    assert out == ["a:0", "b:0", "a:1", "b:1", "a:2", "b:2"]
    assert model.log == [("a:0", "b:0"), ("a:1", "b:1"), ("a:2", "b:2")]
    # Each batch's two results are held as the next one starts (until its launch); the last
    # batch's, with nothing after it, are resolved at once (every future above resolved).
    assert model.held_at_start == [0, 2, 2]


def test_a_model_that_announces_its_launch_late_is_never_held():
    """A model that computes inside ``run_batch`` and calls ``launched()`` at the end would hold
    its last batch's results for a whole forward: they are resolved as the batch ends."""
    model = Chain()
    model.compute_s = 0.06  # over LAUNCH_HOLD_MAX_S
    model.first.clear()

    run(model, lambda engine: rounds(engine, model, 3))
    assert model.held_at_start == [0, 0, 0]


def test_the_held_results_reach_the_loop_while_the_next_batch_runs():
    model = Chain()
    model.first.clear()
    seen: list[int] = []

    orig = model.run_batch

    def run_batch(works):
        out = orig(works)
        if len(model.log) == 2:   # the second batch: give the loop time to take batch 0's results
            for _ in range(200):
                if model.results >= 2:
                    break
                threading.Event().wait(0.01)
            seen.append(model.results)
        return out

    model.run_batch = run_batch  # type: ignore[method-assign]

    run(model, lambda engine: rounds(engine, model, 2))
    assert seen == [2]   # batch 0's two results, resolved at batch 1's launch, before batch 1 ended


def test_a_failed_tick_of_a_chained_model_drops_the_sessions_queued_ticks_only():
    model = Chain()
    model.first.clear()

    async def main(engine: Engine) -> list[Any]:
        works = [("boom", "a"), ("0", "b"), ("1", "a"), ("1", "b")]
        futs = [engine.submit_future(model.name, w, session_id=w[1]) for w in works]
        model.first.set()
        return list(await asyncio.gather(*futs, return_exceptions=True))

    out = run(model, main)
    # The batch failed, re-ran one by one: a's tick failed, b's went through; a's next tick
    # never ran (TickCancelled), b's did.
    assert isinstance(out[0], ModelError) and out[1] == "b:0"
    assert isinstance(out[2], TickCancelled) and out[3] == "b:1"
    assert not any("a:1" in batch for batch in model.log)


def test_a_policy_like_model_keeps_a_sessions_queued_ticks_after_a_failure():
    model = Chain()
    model.chained_ticks = False
    model.first.clear()

    async def main(engine: Engine) -> list[Any]:
        futs = [engine.submit_future(model.name, w, session_id="a") for w in (("boom", "a"), ("1", "a"))]
        model.first.set()
        return list(await asyncio.gather(*futs, return_exceptions=True))

    out = run(model, main)
    assert isinstance(out[0], ModelError) and out[1] == "a:1"


@pytest.mark.parametrize("chained", [True, False])
def test_nothing_is_held_forever(chained):
    model = Chain()
    model.chained_ticks = chained

    async def main(engine: Engine) -> None:
        for t in range(5):  # one at a time: each waits for its own result
            assert await engine.submit(model.name, (str(t), "a"), session_id="a") == f"a:{t}"

    run(model, main)


def test_another_models_batch_never_keeps_a_held_result_waiting():
    fast, slow = Chain(), Chain()
    slow.name, slow.compute_s = "slow", 0.06  # announces its launch late: its forward is no launch
    fast.first.clear()
    engine = Engine({fast.name: fast, slow.name: slow}, batch_wait_ms=0)
    fast.engine = slow.engine = engine
    engine.start()
    try:
        async def main() -> None:
            # Oldest first: fast a0, slow b0, fast a1, slow b1, one batch each.
            futs = [engine.submit_future(m.name, (t, sid), session_id=sid)
                    for t in ("0", "1") for m, sid in ((fast, "a"), (slow, "b"))]
            fast.first.set()
            await asyncio.gather(*futs)

        asyncio.run(asyncio.wait_for(main(), 20))
    finally:
        engine.stop()
    assert fast.log == [("a:0",), ("a:1",)] and slow.log == [("b:0",), ("b:1",)]
    # fast's results went out before each of slow's forwards began (b1's too, though slow had
    # launched by then: its launch comes too late to hold anything for).
    assert slow.held_at_start == [0, 0]
