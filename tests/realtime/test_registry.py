"""realtime/server/inventory.py: models are built on a thread that ends, so the engine's OpenMP
team is the process's only one (realtime.server.inventory.on_spent_thread says why)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from realtime.server.config import PolicyConfig, ServerConfig, TTSConfig, WorldConfig
from realtime.server.inventory import build_inventory, on_spent_thread

REPO = Path(__file__).resolve().parents[2]

BUILT_ON: list[threading.Thread] = []  # the threads RecordingPolicy was built on


class RecordingPolicy:
    """A user policy (``module:factory``) that notes the thread building it."""

    metadata = {"action_horizon": 2, "action_dim": 3, "image_keys": [], "image_resolution": [8, 8], "state_dim": 3}

    def __init__(self) -> None:
        BUILT_ON.append(threading.current_thread())

    def infer(self, obs: dict) -> dict:
        raise NotImplementedError  # never called: only the build is under test


def test_build_inventory_builds_off_the_main_thread() -> None:
    BUILT_ON.clear()
    config = ServerConfig(world=WorldConfig(models=("tiny",)),
                          policy=PolicyConfig(policy=f"{__name__}:RecordingPolicy"), tts=TTSConfig(enabled=False))
    inventory = build_inventory(config)
    assert sorted(a.kind for a in inventory.adapters.values()) == ["policy", "world"]
    assert len(BUILT_ON) == 1
    assert BUILT_ON[0] is not threading.main_thread() and BUILT_ON[0].name == "model-loader"
    assert not BUILT_ON[0].is_alive()


def test_on_spent_thread_returns_the_result_and_raises_the_error() -> None:
    assert on_spent_thread(lambda a, b: (a, b, threading.current_thread().name), 1, "x") == (1, "x", "model-loader")

    def fails() -> None:
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        on_spent_thread(fails)


# Runs in a fresh interpreter (a clean OpenMP runtime): the parallel ops first on the main
# thread or on a spent thread, then on a new "engine" thread whose OpenMP worker's
# voluntary context switches are counted: one per op when libgomp throttles its spin.
_PROBE = """
import os, sys, threading, torch
from realtime.server.inventory import on_spent_thread
OPS = 200
def parallel():
    x = torch.ones(1 << 21)  # made here: even a fill is a parallel op
    for _ in range(OPS):
        x.mul(2)
def switches(tids):
    total = 0
    for tid in tids:
        status = open("/proc/self/task/%s/status" % tid).read()
        total += int(status.split("voluntary_ctxt_switches:")[1].split()[0])
    return total
if sys.argv[1] == "main":
    parallel()
else:
    on_spent_thread(parallel)
out = {}
def engine():
    before = set(os.listdir("/proc/self/task"))
    parallel()  # makes this thread's team (its worker is the new task)
    me = str(threading.get_native_id())
    workers = set(os.listdir("/proc/self/task")) - before - {me}
    start = switches(workers)
    parallel()
    out["switches"] = switches(workers) - start
t = threading.Thread(target=engine)
t.start()
t.join()
print(out["switches"])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_spent_loader_thread_leaves_the_engine_team_spinning() -> None:
    torch = pytest.importorskip("torch")
    if torch.get_num_threads() < 2:
        pytest.skip("one intra-op thread: no OpenMP worker to throttle")

    def probe(mode: str) -> int:
        # libgomp's own spin count and a team of two, whatever OpenMP settings this process
        # picked up (realtime.server.cli's defaults, once a test ran them, are passive and one thread).
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
        env.update({"PYTHONPATH": str(REPO), "GOMP_SPINCOUNT": "300000", "OMP_NUM_THREADS": "2"})
        done = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, env=env,
                              cwd=REPO, timeout=120, check=True)
        return int(done.stdout.split()[-1])

    # Loaded on the main thread: two teams on the cores, libgomp cuts the spin to 100 and
    # the engine's worker sleeps after (nearly) every op. Loaded on a spent thread: the
    # configured spin count holds and the worker spins between ops.
    assert probe("main") > 200 // 2
    assert probe("spent") < 200 // 4
