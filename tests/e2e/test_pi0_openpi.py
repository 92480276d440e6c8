"""Native pi0 (a tiny checkpoint in LeRobot's layout) behind the real server and the real openpi-client."""

from __future__ import annotations

import threading
from typing import Iterator

import numpy as np
import pytest
from openpi_client import msgpack_numpy
from openpi_client.action_chunk_broker import ActionChunkBroker

from models.policy.pi0 import load_policy
from tests.e2e.test_openpi_ws import client, error_and_close, running
from tests.models.pi0.pi0_support import write_tiny

KEY_MAP = {"cam_high": "observation.images.base_0_rgb", "cam_wrist": "observation.images.left_wrist_0_rgb"}


@pytest.fixture(scope="module")
def pi0_server(tmp_path_factory) -> Iterator[str]:
    folder = str(tmp_path_factory.mktemp("pi0_e2e"))
    write_tiny(folder)
    policy = load_policy(folder, max_batch=4, image_key_map=KEY_MAP)
    with running(policy, batch_wait_ms=20) as addr:
        yield addr


def robot_obs(seed: int = 0, **over) -> dict:
    rng = np.random.default_rng(seed)
    obs = {
        "cam_high": rng.integers(0, 256, (28, 28, 3), dtype=np.uint8),
        "cam_wrist": rng.integers(0, 256, (28, 28, 3), dtype=np.uint8),
        "state": rng.standard_normal(5).astype(np.float32),
        "prompt": "stack the blocks",
    }
    obs.update(over)
    return {k: v for k, v in obs.items() if v is not None}


def test_metadata_infer_broker_and_reset(pi0_server):
    robot = client(pi0_server)
    meta = robot.get_server_metadata()
    assert (meta["action_horizon"], meta["action_dim"], meta["state_dim"]) == (6, 4, 5)
    assert meta["image_keys"] == ["cam_high", "cam_wrist"] and meta["image_resolution"] == [28, 28]
    assert meta["policy"] == "pi0" and meta["image_key_map"] == KEY_MAP

    first = robot.infer(robot_obs(session_id="arm"))
    assert first["actions"].shape == (6, 4) and first["actions"].dtype == np.float32
    assert np.isfinite(first["actions"]).all()
    second = robot.infer(robot_obs(session_id="arm"))
    assert np.abs(second["actions"] - first["actions"]).max() > 1e-3
    assert robot.infer({"endpoint": "reset", "session_id": "arm"}) == {"status": "reset successful"}
    np.testing.assert_array_equal(robot.infer(robot_obs(session_id="arm"))["actions"], first["actions"])

    calls = []
    inner = robot.infer
    robot.infer = lambda obs: calls.append(1) or inner(obs)
    broker = ActionChunkBroker(robot, action_horizon=6)
    steps = [broker.infer(robot_obs()) for _ in range(7)]
    assert len(calls) == 2 and all(s["actions"].shape == (4,) for s in steps)
    broker.reset()
    robot.reset()


def test_two_robots_at_once(pi0_server):
    robots = [client(pi0_server) for _ in range(2)]
    barrier = threading.Barrier(2)
    results: dict[int, list] = {}

    def drive(i: int) -> None:
        barrier.wait()
        results[i] = [robots[i].infer(robot_obs(i, sampling_params={"seed": 5}))["actions"] for _ in range(3)]

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [0, 1]
    for i in (0, 1):
        assert all(a.shape == (6, 4) for a in results[i])
        np.testing.assert_allclose(results[i][0], results[i][2], atol=1e-5)  # same seed, same answer
    assert np.abs(results[0][0] - results[1][0]).max() > 1e-3  # different observations


def test_bad_observations_name_the_field_and_spare_the_other_robot(pi0_server):
    good = client(pi0_server)
    assert good.infer(robot_obs())["actions"].shape == (6, 4)
    cases = {
        "long prompt": (robot_obs(prompt="pick up the red block and stack the blocks then open the drawer"),
                        "'prompt' is"),
        "NaN state": (robot_obs(state=np.array([0, np.nan, 0, 0, 0], np.float32)), "'state' has a non-finite value"),
        "missing camera": (robot_obs(cam_wrist=None), "missing camera 'cam_wrist'"),
        "image dtype": (robot_obs(cam_high=np.zeros((28, 28, 3), np.float32)), "camera 'cam_high' must be uint8"),
    }
    for name, (obs, text) in cases.items():
        bad = client(pi0_server)
        bad._ws.send(msgpack_numpy.packb(obs))
        message, code = error_and_close(bad)
        assert text in message, (name, message)
        assert code == 1011
        assert good.infer(robot_obs())["actions"].shape == (6, 4)
