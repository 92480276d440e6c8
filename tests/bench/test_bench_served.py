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
from models.world.tiny import TinyWorld
from realtime.media import default_workers
from realtime.server.app import build_app
from realtime.server.config import ServerConfig, WorldConfig
from realtime.server.inventory import Inventory
from realtime.server.server import serve_in_thread


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

    def tick(self, request, seed, options=None, **kwargs):  # type: ignore[no-untyped-def, override]
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


class Recording(InstantWorld):
    """Remembers the format of every tick it generates."""

    def __init__(self) -> None:
        super().__init__()
        self.formats: list[str] = []

    def generate(self, works):  # type: ignore[no-untyped-def, override]
        self.formats += [w.format for w in works]
        return super().generate(works)


def test_a_jpeg_session_s_ticks_carry_its_format() -> None:
    model = Recording()
    inventory = Inventory()
    inventory.adapters[model.name] = model
    app = build_app(ServerConfig(world=WorldConfig(models=(model.name,))), inventory)
    with serve_in_thread(app) as addr:
        fleet = ClientFleet(f"ws://{addr}/v1/realtime/world", 1, 1, 4, 0.0, 0.3, "jpeg")
        fleet.start()
        (result,) = fleet.results().values()
    assert result["frames"] > 0
    assert model.formats and set(model.formats) == {"jpeg"}  # the server may encode CUDA frames on the device


def test_variants_name_a_switch_interval() -> None:
    from bench.world.bench_served import _plan

    rows = _plan(parse_args(["--variants", "rgb8@1", "rgb8/gil0.1@32", "jpeg/gil5@2"]))
    assert [(r.variant, r.sessions, r.switch_s, r.encode_workers) for r in rows][1:] == [
        ("rgb8/gil0.1", 32, 0.0001, default_workers()), ("jpeg/gil5", 2, 0.005, default_workers())]
    # Encoding on the loop is the server's config for the whole run (EncodeConfig.workers), not a row's.
    (inline,) = _plan(parse_args(["--encode-workers", "0", "--variants", "jpeg@2"]))
    assert inline.encode_workers == 0
    for bad in ("rgb8/gilx@1", "rgb8/gil1/gil2@1", "rgb8/gil0@1"):
        with pytest.raises(SystemExit, match="bad variant"):
            _plan(parse_args(["--variants", bad]))


def test_the_maze_host_path_stand_in_waits_as_the_device_would() -> None:
    """bench/world/host_maze.py: the real maze host path, the frame's passes a wait of base + per row."""
    from bench.world.bench_served import _bare
    from bench.world.host_maze import HostPathMaze

    model = HostPathMaze(base_ms=20.0, per_row_ms=1.0, max_batch=8, max_sessions=8)
    assert model.describe()["static_frame_path"] and model.graph_buckets == (1, 2, 4, 8)
    bare = _bare(model, 3, repeats=3)  # a bucket of 4 rows: at least 24 ms a tick
    assert bare["tick_ms_p50"] >= 24.0
    assert model.cache.num_resident == 0  # _bare released its sessions
    assert bare["untimed_ticks"] == 3 + model.window  # timed over a full context window, as served


def test_bare_ticks_are_timed_once_the_context_window_is_full() -> None:
    from bench.world.bench_served import _bare

    class Counting(TinyWorld):
        frames_seen: list[int] = []

        def run_batch(self, works):
            self.frames_seen.append(works[0].chunk_index)
            return super().run_batch(works)

    model = Counting(max_batch=4)
    warm = 3 + model.window  # the tiny world's context window, in frames
    assert _bare(model, 2, repeats=4)["untimed_ticks"] == warm
    assert model.frames_seen == list(range(warm + 4))  # the last 4 timed: each past the window


def test_variants_pin_and_auto() -> None:
    from bench.world.bench_served import _cpu_list, _plan

    auto, pinned = _plan(parse_args(["--variants", "rgb8/auto@4", "rgb8/ahead2/pin@1"]))
    assert (auto.ticks_in_flight, auto.ticks_in_flight_alone, auto.pin) == (2, 1, False)
    assert (pinned.ticks_in_flight, pinned.ticks_in_flight_alone, pinned.pin) == (2, None, True)
    assert _cpu_list("0-3,8") == [0, 1, 2, 3, 8]
