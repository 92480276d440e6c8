"""The launch gate: sends wait while the engine prepares a batch, never longer than its bound."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Mapping, Sequence

from models.base import ModelAdapter
from realtime.engine import Engine
from realtime.engine.overlap import LaunchGate


def test_an_open_gate_does_not_wait():
    gate = LaunchGate()

    async def main() -> float:
        t0 = time.perf_counter()
        await gate.wait()
        return time.perf_counter() - t0

    assert asyncio.run(main()) < 0.01


def test_a_closed_gate_waits_until_another_thread_opens_it():
    gate = LaunchGate(max_hold_s=5.0)
    gate.close()
    opened: list[float] = []

    def engine_thread() -> None:
        time.sleep(0.05)
        opened.append(time.perf_counter())
        gate.open()

    async def main() -> float:
        threading.Thread(target=engine_thread).start()
        await asyncio.gather(gate.wait(), gate.wait())   # two sends, one hand-off
        return time.perf_counter()

    woke = asyncio.run(main())
    assert opened and woke >= opened[0] and not gate.closed


def test_a_gate_left_closed_holds_a_send_only_for_its_bound():
    gate = LaunchGate(max_hold_s=0.05)
    gate.close()

    async def main() -> float:
        t0 = time.perf_counter()
        await gate.wait()
        return time.perf_counter() - t0

    held = asyncio.run(main())
    assert 0.04 <= held < 1.0
    assert gate.closed   # nothing opened it: the next batch's open still wakes whoever waits then
    gate.open()
    assert not gate.closed


class Launcher(ModelAdapter[int, int]):
    """Records whether the engine's gate was closed before and open after ``launched()``."""

    kind = "test"
    name = "launcher"
    max_batch = 4

    def __init__(self) -> None:
        self.seen: list[tuple[bool, bool]] = []
        self.gate: LaunchGate | None = None

    def describe(self) -> Mapping[str, Any]:
        return {"name": self.name}

    def run_batch(self, works: Sequence[int]) -> list[int]:
        assert self.gate is not None
        before = self.gate.closed
        self.launched()
        self.seen.append((before, self.gate.closed))
        return list(works)


def test_the_engine_closes_the_gate_for_a_model_that_launches_and_the_adapter_opens_it():
    model = Launcher()
    engine = Engine({model.name: model})
    model.gate = engine.launch_gate
    engine.start()
    try:
        async def main() -> None:
            for i in range(3):   # one batch each
                assert await engine.submit(model.name, i, session_id=f"s{i}") == i

        asyncio.run(asyncio.wait_for(main(), 20))
    finally:
        engine.stop()
    # The first batch is not held (nothing said yet that the model launches); then each is,
    # until its launch.
    assert model.seen == [(False, False), (True, False), (True, False)]
    assert not engine.launch_gate.closed   # the forward's end opens it whatever the adapter did


def test_a_model_that_never_launches_never_closes_the_gate():
    from tests.realtime.test_engine import Doubler

    model = Doubler()
    engine = Engine({model.name: model})
    closed: list[bool] = []
    model.gate.clear()
    engine.start()
    try:
        async def main() -> None:
            fut = asyncio.ensure_future(engine.submit(model.name, 1, session_id="s"))
            await asyncio.sleep(0.05)            # the forward is waiting on the model's gate
            closed.append(engine.launch_gate.closed)
            model.gate.set()
            assert await fut == 2

        asyncio.run(asyncio.wait_for(main(), 20))
    finally:
        engine.stop()
    assert closed == [False]
