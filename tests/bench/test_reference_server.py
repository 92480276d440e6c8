"""bench/openpi/reference_server.py does what openpi's WebsocketPolicyServer does, seen
through the real openpi-client: metadata first, server_timing per reply (prev_total_ms
from the second on), /healthz, and a failing policy's traceback as a text frame + 1011."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import websockets.sync.client
from openpi_client import base_policy, msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from bench.openpi.reference_server import METADATA, InstantPolicy, ReferencePolicyServer
from realtime.server.server import free_port


class Failing(base_policy.BasePolicy):
    def infer(self, obs: dict) -> dict:
        raise ValueError("broken policy")


@contextmanager
def serving(policy: base_policy.BasePolicy) -> Iterator[str]:
    port = free_port()
    server = ReferencePolicyServer(policy, host="127.0.0.1", port=port, metadata=METADATA)
    loop = asyncio.new_event_loop()
    task: list[asyncio.Task] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        task.append(loop.create_task(server.run()))
        try:
            loop.run_until_complete(task[0])
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopped by the test
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(task[0].cancel)
        thread.join(5)


def test_metadata_then_actions_with_server_timing():
    with serving(InstantPolicy()) as addr:
        with urllib.request.urlopen(f"http://{addr}/healthz", timeout=5) as resp:
            assert (resp.status, resp.read()) == (200, b"OK\n")
        robot = WebsocketClientPolicy(host=f"ws://{addr}")
        assert robot.get_server_metadata() == {"action_horizon": 50, "action_dim": 32}
        obs = {"observation/state": np.zeros(32, np.float32), "prompt": "pick"}
        first, second = robot.infer(obs), robot.infer(obs)
        robot._ws.close()
    assert sorted(first) == ["actions", "server_timing"]
    assert first["actions"].shape == (50, 32) and first["actions"].dtype == np.float32
    assert not first["actions"].any()
    assert sorted(first["server_timing"]) == ["infer_ms"]
    assert sorted(second["server_timing"]) == ["infer_ms", "prev_total_ms"]
    assert 0 <= second["server_timing"]["infer_ms"] < second["server_timing"]["prev_total_ms"] + 1000


def test_a_failing_policy_sends_its_traceback_and_closes_1011():
    with serving(Failing()) as addr:
        with websockets.sync.client.connect(f"ws://{addr}", compression=None, max_size=None) as ws:
            assert msgpack_numpy.unpackb(ws.recv()) == METADATA
            ws.send(msgpack_numpy.packb({"prompt": "x"}))
            text = ws.recv()
            assert isinstance(text, str) and "ValueError: broken policy" in text and "Traceback" in text
            with pytest.raises(websockets.ConnectionClosedError) as info:
                ws.recv()
    assert info.value.rcvd.code == 1011
    assert info.value.rcvd.reason == "Internal server error. Traceback included in previous frame."
