"""The real ``openpi-client`` against a real uvicorn server: /v1/realtime/robot/openpi."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from typing import Iterator

import httpx
import msgpack
import numpy as np
import pytest
import websockets.sync.client
from openpi_client import msgpack_numpy
from openpi_client.action_chunk_broker import ActionChunkBroker
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosed

from models.policy import DummyPolicy, PolicyAdapter
from models.policy.flow import FlowMatchingPolicy, FlowPolicyConfig
from protocols.openpi import MAX_MESSAGE_BYTES, PolicyMetadata
from realtime.server.app import build_app
from realtime.server.config import EngineConfig, PolicyConfig, ServerConfig, TTSConfig, WorldConfig
from realtime.server.inventory import Inventory
from tests.e2e.conftest import serve

PATH = "/v1/realtime/robot/openpi"
SMALL = FlowPolicyConfig(
    action_horizon=6, action_dim=4, image_keys=("cam_high", "cam_wrist"), image_resolution=(64, 64), state_dim=5,
    d_model=32, num_heads=2, num_layers=2, num_inference_steps=3, max_batch=8,
)
TINY_META = PolicyMetadata(action_horizon=5, action_dim=3, image_keys=("cam",), image_resolution=(32, 32), state_dim=2)


def policy_app(adapter: PolicyAdapter | None, batch_wait_ms: float = 2.0):
    config = ServerConfig(engine=EngineConfig(batch_wait_ms=batch_wait_ms), world=WorldConfig(models=()),
                          policy=PolicyConfig(policy=""), tts=TTSConfig(enabled=False))
    inventory = Inventory()
    if adapter is not None:
        inventory.adapters[adapter.name] = adapter
    return build_app(config, inventory)


@contextlib.contextmanager
def running(adapter: PolicyAdapter | None, **kw) -> Iterator[str]:
    with serve(policy_app(adapter, **kw)) as addr:
        yield addr


def client(addr: str) -> WebsocketClientPolicy:
    # A host starting with "ws" is used as the whole URI, exactly as robots will write it.
    return WebsocketClientPolicy(host=f"ws://{addr}{PATH}")


def small_obs(seed: int = 0, **over) -> dict:
    rng = np.random.default_rng(seed)
    obs = {
        "cam_high": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
        "cam_wrist": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
        "state": rng.standard_normal(5).astype(np.float32),
        "prompt": "stack the blocks",
    }
    obs.update(over)
    return {k: v for k, v in obs.items() if v is not None}


def tiny_obs(**over) -> dict:
    obs = {"cam": np.zeros((32, 32, 3), np.uint8), "state": np.zeros(2, np.float32), "prompt": "go"}
    obs.update(over)
    return {k: v for k, v in obs.items() if v is not None}


def error_and_close(robot: WebsocketClientPolicy) -> tuple[str, int]:
    """Read the text error frame, then the close code."""
    text = robot._ws.recv()
    assert isinstance(text, str)
    with pytest.raises(ConnectionClosed) as info:
        robot._ws.recv()
    return text, info.value.rcvd.code


@pytest.fixture(scope="module")
def flow_server() -> Iterator[tuple[str, FlowMatchingPolicy]]:
    policy = FlowMatchingPolicy(SMALL)
    with running(policy) as addr:
        yield addr, policy


# ----------------------------------------------------------------------------- the real client


def test_metadata_matches_the_config(flow_server):
    addr, policy = flow_server
    robot = client(addr)
    assert robot.get_server_metadata() == {
        "policy": "flow-matching", "num_inference_steps": 3, "action_horizon": 6, "action_dim": 4,
        "image_keys": ["cam_high", "cam_wrist"], "image_resolution": [64, 64], "state_dim": 5,
        "state_key": "state", "prompt_key": "prompt",
    }
    assert robot.get_server_metadata() == policy.metadata.to_wire()


def test_infer_returns_advertised_actions_and_timing(flow_server):
    addr, _ = flow_server
    robot = client(addr)
    first = robot.infer(small_obs())
    assert sorted(first) == ["actions", "policy_timing", "server_timing"]
    assert first["actions"].shape == (6, 4) and first["actions"].dtype == np.float32
    assert np.isfinite(first["actions"]).all() and first["actions"].std() > 0.05
    assert sorted(first["server_timing"]) == ["infer_ms"] and sorted(first["policy_timing"]) == ["infer_ms"]
    assert first["server_timing"]["infer_ms"] >= first["policy_timing"]["infer_ms"] > 0
    second = robot.infer(small_obs())
    assert sorted(second["server_timing"]) == ["infer_ms", "prev_total_ms"]
    assert second["server_timing"]["prev_total_ms"] >= first["server_timing"]["infer_ms"]
    # A robot's noise stream advances: the same observation gives a new sample.
    assert np.abs(second["actions"] - first["actions"]).max() > 1e-3


def test_action_chunk_broker_on_top(flow_server):
    addr, _ = flow_server
    robot = client(addr)
    calls = []
    inner_infer = robot.infer
    robot.infer = lambda obs: calls.append(1) or inner_infer(obs)  # count round trips
    broker = ActionChunkBroker(robot, action_horizon=6)
    steps = [broker.infer(small_obs()) for _ in range(7)]
    assert len(calls) == 2
    assert all(s["actions"].shape == (4,) for s in steps)
    chunk = np.stack([s["actions"] for s in steps[:6]])
    assert chunk.shape == (6, 4) and np.abs(steps[6]["actions"] - steps[0]["actions"]).max() > 1e-4
    broker.reset()


def test_extensions_session_sampling_reset_and_batch(flow_server):
    addr, _ = flow_server
    robot = client(addr)
    seeded = small_obs(sampling_params={"seed": 11, "num_inference_steps": 2})
    a, b = robot.infer(seeded), robot.infer(seeded)
    assert np.array_equal(a["actions"], b["actions"])
    fewer = robot.infer(small_obs(sampling_params={"seed": 11, "num_inference_steps": 1}))
    assert np.abs(fewer["actions"] - a["actions"]).max() > 1e-4

    # Per-session noise: after a reset the same session replays the same sample.
    first = robot.infer(small_obs(session_id="arm-1"))["actions"]
    assert np.abs(robot.infer(small_obs(session_id="arm-1"))["actions"] - first).max() > 1e-4
    assert robot.infer({"endpoint": "reset", "session_id": "arm-1"}) == {"status": "reset successful"}
    assert np.array_equal(robot.infer(small_obs(session_id="arm-1"))["actions"], first)
    assert robot.infer({"endpoint": "reset"}) == {"status": "reset successful"}

    # An id held by one connection is refused to another.
    other = client(addr)
    with pytest.raises(RuntimeError) as info:
        other.infer(small_obs(session_id="arm-1"))
    assert str(info.value) == "Error in inference server:\nsession_id 'arm-1' is in use by another connection"

    reply = robot.infer({"batch": [small_obs(1, sampling_params={"seed": 3}), small_obs(2, session_id="arm-2"),
                                   small_obs(1, sampling_params={"seed": 3})]})
    assert sorted(reply) == ["batch"] and len(reply["batch"]) == 3
    assert all(r["actions"].shape == (6, 4) for r in reply["batch"])
    np.testing.assert_allclose(reply["batch"][0]["actions"], reply["batch"][2]["actions"], atol=1e-5)
    assert robot.infer(small_obs())["actions"].shape == (6, 4)  # still the plain protocol afterwards


def test_two_robots_at_once_are_batched():
    policy = DummyPolicy(metadata=TINY_META, infer_ms=150, max_batch=8)
    with running(policy, batch_wait_ms=20) as addr:
        robots = [client(addr) for _ in range(2)]
        barrier = threading.Barrier(2)
        results: dict[int, list] = {}

        def drive(i: int) -> None:
            barrier.wait()
            results[i] = [robots[i].infer(tiny_obs())["actions"].shape for _ in range(3)]

        threads = [threading.Thread(target=drive, args=(i,)) for i in range(2)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        elapsed = time.perf_counter() - started
    assert results == {0: [(5, 3)] * 3, 1: [(5, 3)] * 3}
    # Six calls in three or four forwards: a robot that arrives a moment after the
    # first forward started joins from the second on (the engine waits only for the
    # robots of the last batch; a newcomer never waits), then they share every one.
    assert policy.calls in (3, 4)
    assert elapsed < 6 * 0.150


# ----------------------------------------------------------------------------- malformed input


def _raw_array_obs(dtype: str) -> bytes:
    obs = tiny_obs()
    packed = msgpack_numpy.packb(obs)
    body = msgpack.unpackb(packed, strict_map_key=False)
    body["cam"] = {b"__ndarray__": True, b"data": b"\x00" * 16, b"dtype": dtype, b"shape": [1]}
    return msgpack.packb(body)


MALFORMED = {
    "text frame": (lambda r: r._ws.send("hello"), "invalid request: expected a binary msgpack frame, got a text frame"),
    "non-map body": (lambda r: r._ws.send(msgpack_numpy.packb([1, 2, 3])),
                     "invalid request: request must be a msgpack map, got array"),
    "not msgpack": (lambda r: r._ws.send(b"\xc1"), "invalid request: body is not valid msgpack (FormatError)"),
    "complex dtype": (lambda r: r._ws.send(_raw_array_obs("<c16")), "invalid request: unsupported array dtype '<c16'"),
    "object dtype": (lambda r: r._ws.send(_raw_array_obs("|O")), "invalid request: unsupported array dtype '|O'"),
    "wrong image shape": (lambda r: r._ws.send(msgpack_numpy.packb(tiny_obs(cam=np.zeros((32, 16, 3), np.uint8)))),
                          "invalid request: camera 'cam' must be uint8 [32, 32, 3], got uint8 [32, 16, 3]"),
    "image dtype": (lambda r: r._ws.send(msgpack_numpy.packb(tiny_obs(cam=np.zeros((32, 32, 3), np.float32)))),
                    "invalid request: camera 'cam' must be uint8 [32, 32, 3], got float32 [32, 32, 3]"),
    "NaN state": (lambda r: r._ws.send(msgpack_numpy.packb(tiny_obs(state=np.array([0, np.nan], np.float32)))),
                  "invalid request: 'state' has a non-finite value (NaN or inf) at index 1"),
    "state length": (lambda r: r._ws.send(msgpack_numpy.packb(tiny_obs(state=np.zeros(3, np.float32)))),
                     "invalid request: 'state' must have shape [2], got [3]"),
    "unknown camera key": (lambda r: r._ws.send(msgpack_numpy.packb(tiny_obs(top=np.zeros((32, 32, 3), np.uint8)))),
                           "invalid request: unknown camera key 'top' (this policy's cameras: ['cam'])"),
    "missing camera": (lambda r: r._ws.send(msgpack_numpy.packb(tiny_obs(cam=None))),
                       "invalid request: missing camera 'cam'"),
}


@pytest.fixture(scope="module")
def tiny_server() -> Iterator[tuple[str, DummyPolicy]]:
    policy = DummyPolicy(metadata=TINY_META, max_batch=8)
    with running(policy) as addr:
        yield addr, policy


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_input_closes_only_that_robot(tiny_server, case):
    addr, _ = tiny_server
    good, bad = client(addr), client(addr)
    assert good.infer(tiny_obs())["actions"].shape == (5, 3)
    send, expected = MALFORMED[case]
    send(bad)
    assert error_and_close(bad) == (expected, 1011)
    assert good.infer(tiny_obs())["actions"].shape == (5, 3)


def test_the_client_raises_the_error_text(tiny_server):
    addr, _ = tiny_server
    robot = client(addr)
    with pytest.raises(RuntimeError) as info:
        robot.infer(tiny_obs(state=np.array([np.inf, 0], np.float32)))
    assert str(info.value) == (
        "Error in inference server:\ninvalid request: 'state' has a non-finite value (NaN or inf) at index 0"
    )
    with pytest.raises(ConnectionClosed) as closed:
        robot.infer(tiny_obs())
    assert closed.value.rcvd.code == 1011


def test_over_limit_body(tiny_server):
    addr, _ = tiny_server
    good, bad = client(addr), client(addr)
    blob = np.zeros(MAX_MESSAGE_BYTES, np.uint8)  # plus the observation: just over 64 MiB
    with pytest.raises(RuntimeError) as info:
        bad.infer(tiny_obs(blob=blob))
    size = len(msgpack_numpy.packb(tiny_obs(blob=blob)))
    assert size > MAX_MESSAGE_BYTES
    assert str(info.value) == (
        f"Error in inference server:\ninvalid request: message of {size} bytes is over the 67108864 byte limit"
    )
    assert good.infer(tiny_obs())["actions"].shape == (5, 3)


def test_no_policy_loaded():
    with running(None) as addr:
        with websockets.sync.client.connect(f"ws://{addr}{PATH}", compression=None, max_size=None) as ws:
            assert ws.recv() == "no robot policy is loaded on this server"
            with pytest.raises(ConnectionClosed) as info:
                ws.recv()
        assert info.value.rcvd.code == 1011


def test_a_failing_policy_ends_only_that_robot():
    class Picky(DummyPolicy):
        def infer_batch(self, works):
            if any(w.observation.prompt == "explode" for w in works):
                raise ValueError("cannot do that")
            return super().infer_batch(works)

    with running(Picky(metadata=TINY_META)) as addr:
        good, bad = client(addr), client(addr)
        with pytest.raises(RuntimeError) as info:
            bad.infer(tiny_obs(prompt="explode"))
        assert str(info.value) == "Error in inference server:\npolicy failed: ValueError: cannot do that"
        assert good.infer(tiny_obs())["actions"].shape == (5, 3)


# ----------------------------------------------------------------------------- never on the event loop


def test_healthz_stays_fast_while_a_slow_policy_computes():
    policy = DummyPolicy(metadata=TINY_META, infer_ms=1500)
    with running(policy) as addr:
        robot = client(addr)
        done = threading.Event()
        thread = threading.Thread(target=lambda: (robot.infer(tiny_obs()), done.set()))
        thread.start()
        time.sleep(0.2)  # the forward is running now
        latencies = []
        with httpx.Client() as http:
            for _ in range(10):
                t0 = time.perf_counter()
                assert http.get(f"http://{addr}/healthz").text == "OK"
                latencies.append(time.perf_counter() - t0)
        assert not done.is_set()
        thread.join(10)
        assert done.is_set()
    assert max(latencies) < 0.25


def test_long_inference_keeps_the_connection(monkeypatch):
    """The real client with its keepalive squeezed 200x (20 s -> 0.1 s): the reference
    server would drop it during a 2 s inference; ours answers every ping."""
    fast = functools.partial(websockets.sync.client.connect, ping_interval=0.1, ping_timeout=0.3)
    monkeypatch.setattr(websockets.sync.client, "connect", fast)
    policy = DummyPolicy(metadata=TINY_META, infer_ms=2000)
    with running(policy) as addr:
        robot = client(addr)
        reply = robot.infer(tiny_obs())
        assert reply["actions"].shape == (5, 3)
        assert reply["policy_timing"]["infer_ms"] >= 2000
        assert robot._ws.latency > 0  # pongs came back while the policy computed
        assert robot.infer(tiny_obs())["actions"].shape == (5, 3)


def test_a_robot_that_leaves_mid_inference_is_dropped_from_the_queue():
    policy = DummyPolicy(metadata=TINY_META, infer_ms=400, max_batch=1)
    with running(policy) as addr:
        staying, leaving = client(addr), client(addr)
        thread = threading.Thread(target=lambda: staying.infer(tiny_obs()))
        thread.start()
        time.sleep(0.1)  # staying's forward is running; leaving's request will queue behind it
        leaving._ws.send(msgpack_numpy.packb(tiny_obs()))
        time.sleep(0.1)
        leaving._ws.close()
        thread.join(5)
        time.sleep(0.6)  # long enough for a second forward, were it run
        assert policy.calls == 1
        assert staying.infer(tiny_obs())["actions"].shape == (5, 3)
        assert policy.calls == 2


def test_pipelined_requests_are_answered_in_order(tiny_server):
    addr, _ = tiny_server
    robot = client(addr)
    for seed in (1, 2):
        robot._ws.send(msgpack_numpy.packb(tiny_obs(prompt=f"p{seed}")))
    replies = [msgpack_numpy.unpackb(robot._ws.recv()) for _ in range(2)]
    assert [r["actions"].shape for r in replies] == [(5, 3), (5, 3)]
    assert "prev_total_ms" not in replies[0]["server_timing"] and "prev_total_ms" in replies[1]["server_timing"]


def test_an_instant_policy_is_answered_inline_and_still_checked():
    """A policy that answers in microseconds runs on the event loop once measured (no hop
    to the engine thread); its replies, bounds and errors are the same as ever."""
    policy = DummyPolicy(metadata=TINY_META, infer_ms=0, max_batch=8)
    app = policy_app(policy)
    with serve(app) as addr:
        robot = client(addr)
        replies = [robot.infer(tiny_obs()) for _ in range(40)]
        assert app.state.engine.stats.inline_works > 0
        with pytest.raises(RuntimeError) as info:
            robot.infer(tiny_obs(state=np.zeros(3, np.float32)))
        with pytest.raises(ConnectionClosed) as closed:
            robot._ws.recv(timeout=5)
    assert all(r["actions"].shape == (5, 3) and not r["actions"].any() for r in replies)
    assert all(sorted(r["server_timing"]) == ["infer_ms", "prev_total_ms"] for r in replies[1:])
    assert str(info.value) == "Error in inference server:\ninvalid request: 'state' must have shape [2], got [3]"
    assert closed.value.rcvd.code == 1011
