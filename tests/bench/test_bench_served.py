"""bench_served end to end on CPU: one tiny row through the real server and client processes.

The benchmark once hung on its first row (its profiler wrapped ``tick`` with the
seam's old arguments, every tick raised on the loop, and the clients waited
forever): a row must finish, with figures, in seconds, and a broken model must end
a row with its reason instead of a hang.
"""

from __future__ import annotations

import time

import pytest

from bench.world.bench_served import InstantWorld, parse_args, run
from bench.world.served_client import ClientFailure, ClientFleet
from realtime.app import build_app
from realtime.config import ServerConfig, WorldConfig
from realtime.registry import Inventory
from realtime.server import serve_in_thread


def test_one_tiny_row_through_the_harness() -> None:
    args = parse_args(["--model", "instant", "--device", "cpu", "--variants", "rgb8@1", "--seconds", "0.6",
                       "--warmup", "0.3", "--bare-repeats", "2"])
    t0 = time.monotonic()
    report = run(args)
    assert time.monotonic() - t0 < 60
    (row,) = report["rows"]
    assert "error" not in row, row
    assert row["sessions"] == 1 and row["format"] == "rgb8"
    assert row["frames_per_s_total"] > 0 and row["bare_frames_per_s_total"] > 0
    assert row["profile"]["batches"] >= 3  # the profiler saw the served batches
    assert 0 < row["engine_busy_share"] < 1
    assert report["capacity"]["model_fps"] == 15.0
    assert report["capacity"]["measured_max_sessions_tried"] == 1


class BrokenTick(InstantWorld):
    """A model whose ``tick`` raises: the endpoint must fail the session and say so."""

    def tick(self, request, seed, options=None):  # type: ignore[no-untyped-def, override]
        raise RuntimeError("broken tick")


def test_a_broken_model_ends_the_row_with_its_reason() -> None:
    model = BrokenTick()
    inventory = Inventory()
    inventory.adapters[model.name] = model
    app = build_app(ServerConfig(world=WorldConfig(models=(model.name,))), inventory)
    with serve_in_thread(app) as addr:
        fleet = ClientFleet(f"ws://{addr}/v1/realtime/world", 2, 1, 4, 0.2, 0.5)
        fleet.start()
        t0 = time.monotonic()
        with pytest.raises(ClientFailure, match="session_failed.*broken tick"):
            fleet.results()
        assert time.monotonic() - t0 < 30
