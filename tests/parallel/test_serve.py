"""``realtime serve --sequence-parallel 2`` as a process: it starts its worker rank itself,
serves LingBot sessions and a DreamZero robot over both ranks, and fails fast and whole when
the worker dies.

One server for the whole module (a start costs ~10 s on the 2-core CI machine): sessions
first, then the worker is killed (SIGKILL) with a session open.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from clients.world import WorldClient
from models.policy.dreamzero.observation import droid_observation
from realtime.engine import EXIT_GROUP_FAILED
from realtime.server.server import free_port
from tests.e2e.test_dreamzero_served import reference
from tests.parallel.ranks import ROOT
from tests.support.process import wait_until_ready
from tests.support.roboarena_client import RoboArenaClient

# What a session hears, and /healthz says, once a rank has died (docs/sequence_parallel.md).
FAILED = "sequence-parallel"


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"   # a zombie has exited


@pytest.fixture(scope="module")
def server(four_head_checkpoint, dreamzero_folders):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REALTIME_") and k not in ("RANK", "WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), REALTIME_SEQUENCE_PARALLEL="2")
    proc = subprocess.Popen(
        [sys.executable, "-m", "realtime.server.cli", "serve", "--port", str(port), "--device", "cpu",
         "--models", f"lingbot={four_head_checkpoint}?size=32x48&steps=1", "--no-tts",
         "--policy", "dreamzero={}?tokenizer={}".format(*dreamzero_folders),
         "--max-batch", "1", "--no-access-log", "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_ready(proc, port, timeout_s=90)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 90))


def test_sessions_run_over_both_ranks_with_swap_reset_and_close(server):
    proc, port = server
    [worker] = children(proc.pid)          # the server started rank 1 itself
    url = f"ws://127.0.0.1:{port}/v1/realtime/world"
    models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"]
    assert [m["sequence_parallel"] for m in models if m["id"] == "lingbot"] == [2]

    async def go():
        async with WorldClient.connect(url) as a, WorldClient.connect(url) as b:
            await a.create("a", model="lingbot", format="rgb8", seed=5)
            await b.create("b", model="lingbot", format="rgb8", seed=6)
            await a.hold_keys(["w"])
            await b.hold_keys(["d"])
            # One resident slot (--max-batch 1): a and b swap to host and back at every tick.
            first = [(await a.next_chunk(60)).frames(), (await b.next_chunk(60)).frames()]
            for _ in range(2):
                assert (await a.next_chunk(60)).chunk_index == (await b.next_chunk(60)).chunk_index
            await a.reset()
            while not a.chunks.empty():   # chunks made before the reset (credits ran ahead)
                a.chunks.get_nowait()
            again = await a.next_chunk(60)
            assert again.chunk_index == 0
            assert all((x == y).all() for x, y in zip(again.frames(), first[0]))   # a reset replays
            await a.close()
            await b.close()

    run(go())
    assert proc.poll() is None and alive(worker)
    assert httpx.get(f"http://127.0.0.1:{port}/healthz").text == "OK"


def test_a_robot_runs_over_both_ranks(server, dreamzero_folders):
    proc, port = server
    [worker] = children(proc.pid)
    models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"]
    assert [(m["sequence_parallel"], m["split"]) for m in models if m["id"] == "dreamzero"] == [(2, "heads")]
    want = reference(dreamzero_folders, 4, 3)
    robot = RoboArenaClient(f"ws://127.0.0.1:{port}/")
    got = [robot.infer(droid_observation(4, call, "robot"))["actions"] for call in range(2)]
    robot.close()   # the episode is detached on both ranks (mirrored) and kept for a reconnect
    again = RoboArenaClient(f"ws://127.0.0.1:{port}/")
    got.append(again.infer(droid_observation(4, 2, "robot"))["actions"])
    for a, b in zip(got, want):   # tests/parallel/test_dreamzero_equal.py's tolerance
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
    assert isinstance(again.reset({"session_id": "robot"}), bytes)   # reset on both ranks
    np.testing.assert_allclose(again.infer(droid_observation(4, 0, "robot"))["actions"], want[0], rtol=0, atol=1e-4)
    again.close()
    assert proc.poll() is None and alive(worker)
    assert httpx.get(f"http://127.0.0.1:{port}/healthz").text == "OK"


def test_a_killed_rank_fails_every_session_turns_healthz_503_and_the_server_exits(server):
    proc, port = server
    [worker] = children(proc.pid)

    async def go() -> tuple[dict, float]:
        async with WorldClient.connect(f"ws://127.0.0.1:{port}/v1/realtime/world") as c:
            await c.create("idle", model="lingbot", format="rgb8")
            await c.hold_keys(["w"])
            await c.next_chunk(60, credit=False)
            killed = time.monotonic()
            os.kill(worker, signal.SIGKILL)
            error = await c.expect("error", timeout=10)
            health = httpx.get(f"http://127.0.0.1:{port}/healthz")
            return error, time.monotonic() - killed, health

    error, took, health = run(go())
    assert error["code"] == "session_failed" and FAILED in error["message"], error
    assert took < 5.0
    assert health.status_code == 503 and FAILED in health.text, health.text
    assert proc.wait(timeout=30) == EXIT_GROUP_FAILED
    out = proc.stdout.read()
    assert "sequence-parallel rank 1 exited with status -9" in out, out[-3000:]
    assert not alive(worker) and children(proc.pid) == []
