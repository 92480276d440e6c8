"""``GET /metrics`` through a real server: every family present from the first scrape,
and each one moves once a world, a robot and a voice have ticked."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import numpy as np
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families

from clients.world import WorldClient
from models.policy.dummy import DummyPolicy
from models.world.maze.adapter import MazeWorld
from models.world.tiny import TinyWorld
from realtime.server.app import build_app
from realtime.server.config import LimitsConfig, ServerConfig, WorldConfig
from realtime.server.inventory import Inventory, Planned
from realtime.server.loading import Loading
from realtime.server.metrics import REFUSALS, ServerMetrics
from tests.e2e.conftest import serve

FAMILIES = {
    "realtime_engine_healthy": "gauge", "realtime_sessions": "gauge", "realtime_ticks": "counter",
    "realtime_tick_failures": "counter", "realtime_tick_seconds": "histogram", "realtime_batch_size": "histogram",
    "realtime_engine_queue_depth": "gauge", "realtime_engine_busy_share": "gauge",
    "realtime_engine_busy_seconds": "counter", "realtime_engine_model_busy_seconds": "counter",
    "realtime_tts_first_audio_seconds": "histogram", "realtime_policy_call_seconds": "histogram",
    "realtime_kv_blocks": "gauge", "realtime_kv_sessions": "gauge", "realtime_kv_host_bytes": "gauge",
    "realtime_kv_swap_bytes": "counter", "realtime_kv_swap_seconds": "counter", "realtime_kv_evictions": "counter",
    "realtime_world_event_to_frame_seconds": "histogram", "realtime_refusals": "counter",
    # prometheus_client's process, platform and GC collectors, on the app's registry.
    "process_cpu_seconds": "counter", "process_resident_memory_bytes": "gauge", "process_open_fds": "gauge",
    "python_info": "gauge", "python_gc_collections": "counter",
}


def scrape(addr: str) -> dict[str, object]:
    text = httpx.get(f"http://{addr}/metrics", timeout=10).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families, family: str, suffix: str = "", **labels: str) -> float:
    for sample in families[family].samples:
        if sample.name == family + suffix and all(sample.labels.get(k) == v for k, v in labels.items()):
            return sample.value
    raise KeyError((family, suffix, labels))


def test_every_family_is_typed_documented_and_moves_after_ticks():
    # One device slot: a second world session evicts the first to host (swaps move).
    world = MazeWorld(device="cpu", steps=1, window=2, max_batch=2, max_sessions=1, host_budget_bytes=1 << 26)
    policy = DummyPolicy()
    inventory = Inventory()
    for adapter in (world, policy):
        inventory.adapters[adapter.name] = adapter
    voice = None
    try:
        from models.tts.piper.adapter import PiperTTS

        voice = PiperTTS.load(device="cpu", max_batch=1)
        inventory.adapters[voice.name] = voice
    except Exception:  # noqa: BLE001 - the tts extra is optional; its family is still checked
        pass
    app = build_app(ServerConfig(world=WorldConfig(models=("maze",))), inventory)
    with serve(app) as addr:
        before = scrape(addr)
        for name, kind in FAMILIES.items():
            assert before[name].type == kind, name
            assert before[name].documentation, name
        assert value(before, "realtime_kv_blocks", state="used", model="maze") == 0
        for code in REFUSALS:  # every code shows from the first scrape
            assert value(before, "realtime_refusals", "_total", code=code) == 0
        assert value(before, "process_resident_memory_bytes") > 0

        async def main() -> None:
            url = f"ws://{addr}/v1/realtime/world"
            async with WorldClient.connect(url) as a, WorldClient.connect(url) as b:
                await a.create("a", credits=2, seed=1, format="rgb8")
                assert [(await a.next_chunk(credit=False)).chunk_index for _ in range(2)] == [0, 1]
                await b.create("b", credits=1, seed=2, format="rgb8")
                assert (await b.next_chunk(credit=False)).chunk_index == 0
                mid = scrape(addr)
                assert value(mid, "realtime_sessions", kind="world", state="active") == 2
                assert value(mid, "realtime_kv_blocks", state="used", model="maze") > 0
                assert value(mid, "realtime_kv_sessions", residency="swapped", model="maze") == 1
            if voice is not None:
                async with websockets.connect(f"ws://{addr}/v1/realtime/tts", max_size=None) as ws:
                    await ws.recv()
                    await ws.send('{"type": "input.text", "text": "Hello there."}')
                    await ws.send('{"type": "input.done"}')
                    while True:
                        msg = await ws.recv()
                        if isinstance(msg, str) and '"response.done"' in msg:
                            break

        asyncio.run(asyncio.wait_for(main(), 120))
        from openpi_client.websocket_client_policy import WebsocketClientPolicy

        robot = WebsocketClientPolicy(f"ws://{addr}/v1/realtime/robot/openpi")
        obs = robot_obs(policy)
        assert "actions" in robot.infer(obs)
        robot._ws.close()

        after = scrape(addr)
        assert value(after, "realtime_ticks", "_total", kind="world", model="maze") == 3
        assert value(after, "realtime_ticks", "_total", kind="policy", model=policy.name) == 1
        assert value(after, "realtime_tick_seconds", "_count", kind="world", model="maze") == 3
        assert value(after, "realtime_batch_size", "_count", kind="world", model="maze") >= 2
        assert value(after, "realtime_policy_call_seconds", "_count") == 1
        assert value(after, "realtime_engine_busy_seconds", "_total") > 0
        assert value(after, "realtime_engine_model_busy_seconds", "_total", model="maze") > 0
        assert value(after, "realtime_kv_swap_bytes", "_total", direction="out", model="maze") > 0
        assert value(after, "realtime_kv_swap_seconds", "_total", direction="out", model="maze") > 0
        assert value(after, "realtime_kv_evictions", "_total", outcome="swapped", model="maze") >= 1
        assert value(after, "realtime_tick_failures", "_total", model="maze", code="out_of_memory") == 0
        assert 0 < value(after, "realtime_engine_busy_share") <= 1
        if voice is not None:
            assert value(after, "realtime_tts_first_audio_seconds", "_count") == 1
            assert value(after, "realtime_ticks", "_total", kind="tts", model=voice.name) >= 1
        # Every session closed: every block back in the pool, nobody resident or swapped.
        for _ in range(50):
            final = scrape(addr)
            if value(final, "realtime_kv_blocks", state="used", model="maze") == 0:
                break
            asyncio.run(asyncio.sleep(0.1))
        assert value(final, "realtime_kv_blocks", state="used", model="maze") == 0
        assert value(final, "realtime_kv_sessions", residency="swapped", model="maze") == 0


def test_refused_counts_refusal_codes_only():
    metrics = ServerMetrics()
    for code in ("busy", "busy", "too_many_sessions", "unauthorized", "loading", "idle_timeout", "bad_request",
                 "session_failed", None):
        metrics.refused(code)
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    counts = {s.labels["code"]: s.value for s in families["realtime_refusals"].samples if s.name.endswith("_total")}
    assert counts == {"busy": 2, "too_many_sessions": 1, "idle_timeout": 1, "unauthorized": 1, "loading": 1}
    assert set(REFUSALS) == set(counts)


def test_world_event_to_frame_and_refusals_through_a_real_server():
    """A held key observed once, when the chunk that applied it is sent (plain and streamed);
    a duplicate and a chunk without events add nothing; refusals counted by code."""
    inventory = Inventory()
    for adapter in (TinyWorld(), DummyPolicy()):
        inventory.adapters[adapter.name] = adapter
    config = ServerConfig(world=WorldConfig(models=("tiny",)),
                          limits=LimitsConfig(idle_timeout_s=1.0, max_sessions_per_client=1))
    with serve(build_app(config, inventory)) as addr:

        async def main() -> list[float]:
            url = f"ws://{addr}/v1/realtime/world"
            waits = []
            for n, stream in enumerate((False, True)):
                async with WorldClient.connect(url) as c:
                    await c.create(f"e{n}", credits=0, format="rgb8", stream_frames=stream)
                    start = time.perf_counter()
                    await c.hold_keys(["w"], event_id=0)
                    assert (await c.hold_keys(["w"], event_id=0))["status"] == "duplicate"
                    await c.credit(1)
                    assert (await c.next_chunk(credit=False)).applied_event_ids == [0]
                    waits.append(time.perf_counter() - start)
                    await c.credit(1)
                    assert (await c.next_chunk(credit=False)).applied_event_ids == []
                    async with WorldClient.connect(url) as other:  # the client's one slot is held
                        await other.send({"type": "session.create", "session_id": f"x{n}"})
                        assert (await other.expect("error"))["code"] == "too_many_sessions"
                    async with websockets.connect(f"ws://{addr}/v1/realtime/robot/openpi") as robot:
                        assert (await robot.recv()).startswith("too_many_sessions: ")
                    await c.close()
            async with WorldClient.connect(url) as idle:  # told idle_timeout after 1 s
                assert (await idle.expect("error", timeout=10))["code"] == "idle_timeout"
            return waits

        waits = asyncio.run(asyncio.wait_for(main(), 60))
        after = scrape(addr)
    assert value(after, "realtime_world_event_to_frame_seconds", "_count") == 2
    assert 0 < value(after, "realtime_world_event_to_frame_seconds", "_sum") < sum(waits)
    assert value(after, "realtime_world_event_to_frame_seconds", "_bucket", le="10.0") == 2
    assert value(after, "realtime_refusals", "_total", code="too_many_sessions") == 4  # 2 world, 2 OpenPI
    assert value(after, "realtime_refusals", "_total", code="idle_timeout") == 1
    assert value(after, "realtime_refusals", "_total", code="busy") == 0


def test_sessions_refused_while_models_load_are_counted():
    release = threading.Event()

    def build(progress) -> TinyWorld:
        release.wait(30)
        return TinyWorld()

    app = build_app(ServerConfig(world=WorldConfig(models=("tiny",))), loading=Loading([Planned("tiny", "world", build)]))
    with serve(app) as addr:
        try:
            async def main() -> None:
                for path in ("/v1/realtime/world", "/v1/realtime/robot/openpi"):
                    async with websockets.connect(f"ws://{addr}{path}") as ws:
                        assert "loading" in await asyncio.wait_for(ws.recv(), 10)

            asyncio.run(asyncio.wait_for(main(), 30))
            assert value(scrape(addr), "realtime_refusals", "_total", code="loading") == 2
        finally:
            release.set()


def robot_obs(policy) -> dict:
    """A valid observation for the policy's advertised metadata."""
    meta = policy.metadata
    h, w = meta.image_resolution
    obs: dict = {key: np.zeros((h, w, 3), np.uint8) for key in meta.image_keys}
    obs[meta.state_key] = np.zeros(meta.state_dim, np.float32)
    obs[meta.prompt_key] = "go"
    return obs


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
