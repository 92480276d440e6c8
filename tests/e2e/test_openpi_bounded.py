"""Nothing the OpenPI endpoint keeps grows with calls or with sessions (issue 19).

Robots that call and reconnect for hours must leave the server as they found it: no
per-call history, no per-session leftovers once a connection is gone. The real
``openpi-client`` against a real uvicorn server, in rounds of identical work; after each
round every structure a robot can fill is back to its empty size, and the process's
garbage-collected objects do not grow from one round to the next. (Each closed
connection's idle timer used to stay armed in the event loop for the idle timeout,
300 s by default, holding its clock: ``IdleClock.close``.)
"""

from __future__ import annotations

import gc
import time

from openpi_client.websocket_client_policy import WebsocketClientPolicy

from models.policy import DummyPolicy
from protocols import openpi as wire
from realtime.engine.scheduler import INLINE_WINDOW
from tests.e2e.conftest import serve
from tests.e2e.test_openpi_ws import PATH, TINY_META, policy_app, tiny_obs

CONNECTIONS = 8
CALLS = 25
ROUNDS = 3


def _round(addr: str) -> None:
    for i in range(CONNECTIONS):
        robot = WebsocketClientPolicy(host=f"ws://{addr}{PATH}")
        obs = tiny_obs(session_id=f"robot-{i}") if i % 2 else tiny_obs()  # explicit and connection ids
        for _ in range(CALLS):
            assert robot.infer(obs)["actions"].shape == (5, 3)
        robot._ws.close()


def _settled(app, model: str, timeout_s: float = 10.0) -> None:
    """Wait until every connection's close has been handled; then check what is left."""
    live, engine = app.state.live_sessions, app.state.engine
    deadline = time.monotonic() + timeout_s
    while (len(live) or live._sockets or engine._controls) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(live) == 0 and not live._sockets  # every session released, every socket detached
    assert app.state.client_slots.held("127.0.0.1") == 0
    assert engine.queued(model) == 0 and not engine._controls
    assert engine._sched.measured_forwards(model) <= INLINE_WINDOW
    assert len(engine._sched.returners(model)) <= 1  # the last batch's sessions, not every session seen
    assert engine._sched.tracked(model) == 0  # every released session forgotten
    assert set(engine.stats.batch_sizes) <= {1}  # one robot at a time: batches of one
    assert len(wire._DTYPES) <= 256


def _objects() -> int:
    gc.collect()
    return len(gc.get_objects())


def test_calls_and_sessions_leave_nothing_behind():
    policy = DummyPolicy(metadata=TINY_META)
    app = policy_app(policy)
    with serve(app) as addr:
        for _ in range(2):  # warm-up: imports, caches, one-time objects of the first connections
            _round(addr)
            _settled(app, policy.name)
        before = _objects()
        for _ in range(ROUNDS):
            _round(addr)
            _settled(app, policy.name)
        after = _objects()
    # 600 calls and 24 sessions more: one object kept per call would be 600, the idle timer
    # of each closed connection (clock, handle, bound method, context) about 100.
    assert after - before < 30, (before, after)
    assert app.state.engine.stats.works == (2 + ROUNDS) * CONNECTIONS * CALLS
