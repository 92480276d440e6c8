"""A stateful policy (RoboArena's ``needs_session_id``) through a real server, driven by the real
``openpi-client`` and by a robot speaking RoboArena's client protocol (docs/protocols_openpi.md,
"Stateful policies")."""

from __future__ import annotations

import threading
import time
from typing import Iterator

import httpx
import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosed

from tests.e2e.test_openpi_ws import PATH, running
from tests.support.roboarena_client import RoboArenaClient
from tests.support.stateful_policy import METADATA, StatefulPolicy, droid_obs

IN_USE = "Error in inference server:\nsession_id 'ep-A' is in use by another connection"


@pytest.fixture
def served() -> Iterator[tuple[str, StatefulPolicy]]:
    policy = StatefulPolicy()
    with running(policy) as addr:
        yield addr, policy


def arena(addr: str) -> RoboArenaClient:
    # RoboArena's clients connect to ws://host:port; "/" answers OpenPI as the path does.
    return RoboArenaClient(f"ws://{addr}/")


def state(reply: dict) -> tuple[int, int, float]:
    """(calls in the session, its resets, the joint_position[0] it was sent) from a reply."""
    assert reply["actions"].shape == (4, 8) and reply["actions"].dtype == np.float32
    calls, resets, joint0 = reply["actions"][0, :3].tolist()
    return int(calls), int(resets), joint0


def closed_with(robot: RoboArenaClient) -> int:
    with pytest.raises(ConnectionClosed) as info:
        robot._ws.recv()
    return info.value.rcvd.code


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_one_handshake_serves_both_clients(served):
    addr, _ = served
    config = arena(addr).get_server_metadata()
    assert config == WebsocketClientPolicy(host=f"ws://{addr}{PATH}").get_server_metadata() == METADATA.to_wire()
    # What RoboArena's evaluator reads, with dict.get, to build its observations.
    assert {k: config.get(k) for k in ("image_resolution", "needs_wrist_camera", "n_external_cameras",
                                       "needs_stereo_camera", "needs_session_id", "action_space")} == {
        "image_resolution": [6, 8], "needs_wrist_camera": True, "n_external_cameras": 2,
        "needs_stereo_camera": False, "needs_session_id": True, "action_space": "joint_position"}


def test_openpi_client_unchanged_keeps_state_for_its_connection(served):
    addr, policy = served
    robot = WebsocketClientPolicy(host=f"ws://{addr}{PATH}")
    assert [state(robot.infer(droid_obs(0.25)))[:2] for _ in range(3)] == [(1, 0), (2, 0), (3, 0)]
    assert state(robot.infer(droid_obs(frames=4))) == (4, 0, 0.0)  # four frames a camera, as DreamZero's client sends
    sid = policy.calls[-1]
    assert sid.startswith("openpi-") and set(policy.calls) == {sid}
    robot._ws.close()
    wait_for(lambda: sid in policy.drops)  # no session_id: the state ends with its connection


def test_openpi_client_with_a_session_id_continues_after_reconnecting(served):
    addr, policy = served
    robot = WebsocketClientPolicy(host=f"ws://{addr}{PATH}")
    assert [state(robot.infer(droid_obs(session_id="ep-O")))[0] for _ in range(2)] == [1, 2]
    robot._ws.close()
    robot = WebsocketClientPolicy(host=f"ws://{addr}{PATH}")
    assert state(robot.infer(droid_obs(session_id="ep-O")))[0] == 3
    assert robot.infer({"endpoint": "reset", "session_id": "ep-O"}) == {"status": "reset successful"}
    assert state(robot.infer(droid_obs(session_id="ep-O")))[:2] == (1, 1)
    assert policy.drops == []


def test_two_robots_keep_separate_state_and_a_reset_clears_one(served):
    addr, policy = served
    a, b = arena(addr), arena(addr)
    barrier = threading.Barrier(2)
    seen: dict[str, list] = {}

    def drive(robot: RoboArenaClient, sid: str, joint0: float) -> None:
        barrier.wait()
        seen[sid] = [state(robot.infer(droid_obs(joint0, session_id=sid))) for _ in range(3)]

    threads = [threading.Thread(target=drive, args=args) for args in ((a, "ep-A", 1.0), (b, "ep-B", 2.0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"ep-A": [(1, 0, 1.0), (2, 0, 1.0), (3, 0, 1.0)], "ep-B": [(1, 0, 2.0), (2, 0, 2.0), (3, 0, 2.0)]}

    # RoboArena's evaluator resets with reset_info {"session_id": ...}; the reply is a binary map.
    reply = b.reset({"session_id": "ep-B"})
    assert isinstance(reply, bytes) and policy.resets == ["ep-B"]
    assert state(b.infer(droid_obs(2.0, session_id="ep-B"))) == (1, 1, 2.0)
    assert state(a.infer(droid_obs(1.0, session_id="ep-A"))) == (4, 0, 1.0)  # untouched

    # DreamZero's test client resets with {}: every session that connection used.
    b.infer(droid_obs(session_id="ep-C"))
    b.reset({})
    assert sorted(policy.resets) == ["ep-B", "ep-B", "ep-C"]
    assert policy.count("ep-B") is None and policy.count("ep-C") is None and policy.count("ep-A") == 4


def test_a_robot_reconnecting_with_its_session_id_continues(served):
    addr, policy = served
    first = arena(addr)
    assert [state(first.infer(droid_obs(session_id="ep-A")))[0] for _ in range(2)] == [1, 2]
    first.close()
    second = arena(addr)  # at once: the server may not have seen the first one go yet
    assert state(second.infer(droid_obs(session_id="ep-A"))) == (3, 0, 0.0)
    assert "ep-A" not in policy.drops
    second.close()
    # An operator's close ends the episode: its state is dropped with the connection.
    third = arena(addr)
    assert state(third.infer(droid_obs(session_id="ep-A")))[0] == 4
    assert httpx.delete(f"http://{addr}/v1/sessions/policy/ep-A", timeout=10).status_code == 200
    wait_for(lambda: "ep-A" in policy.drops)
    fourth = arena(addr)
    assert state(fourth.infer(droid_obs(session_id="ep-A")))[0] == 1


def test_a_session_id_in_use_is_refused_and_its_robot_untouched(served):
    addr, policy = served
    holder = arena(addr)
    assert state(holder.infer(droid_obs(session_id="ep-A")))[0] == 1
    for request in (lambda r: r.infer(droid_obs(session_id="ep-A")),
                    lambda r: r.reset({"session_id": "ep-A"})):
        intruder = arena(addr)
        with pytest.raises(RuntimeError) as info:
            reply = request(intruder)
            if isinstance(reply, str):  # RoboArena's reset returns the frame as it came
                raise RuntimeError(f"Error in inference server:\n{reply}")
        assert str(info.value) == IN_USE
        assert closed_with(intruder) == 1011
    assert policy.resets == [] and state(holder.infer(droid_obs(session_id="ep-A")))[0] == 2


@pytest.mark.parametrize("bad, message", [
    ({"observation/wrist_image_left": None}, "missing camera 'observation/wrist_image_left'"),
    ({"observation/exterior_image_0_left": np.zeros((6, 9, 3), np.uint8)},
     "camera 'observation/exterior_image_0_left' must be uint8 [6, 8, 3] or [T, 6, 8, 3] with T in [1, 4], "
     "got uint8 [6, 9, 3]"),
    ({"observation/joint_position": np.array([0, 0, np.nan, 0, 0, 0, 0])},
     "'observation/joint_position' has a non-finite value (NaN or inf) at index 2"),
    ({"observation/gripper_position": None}, "missing 'observation/gripper_position' (float [1])"),
    ({"prompt": "p" * 65}, "'prompt' is over 64 characters"),
    ({"session_id": np.zeros(1, np.int32)}, "session_id must be 1-128 characters of [A-Za-z0-9_.:@/+-]"),
])
def test_a_bad_observation_is_named_and_ends_only_its_robot(served, bad, message):
    addr, policy = served
    good, sender = arena(addr), arena(addr)
    assert state(good.infer(droid_obs(session_id="ep-A")))[0] == 1
    assert state(sender.infer(droid_obs(session_id="ep-B")))[0] == 1
    with pytest.raises(RuntimeError) as info:
        sender.infer(droid_obs(**{"session_id": "ep-B", **bad}))
    assert str(info.value) == f"Error in inference server:\ninvalid request: {message}"
    assert closed_with(sender) == 1011
    assert state(good.infer(droid_obs(session_id="ep-A")))[0] == 2
    # The refused robot's episode is still there for its next connection.
    assert state(arena(addr).infer(droid_obs(session_id="ep-B")))[0] == 2
    assert policy.calls.count("ep-B") == 2


def test_roboarenas_evaluator_numbering_is_served(served):
    addr, _ = served
    robot = arena(addr)
    # As RoboArena's evaluator builds it for two exteriors: numbered from 1, float64 state, its session id.
    obs = droid_obs(1.5, session_id="ep-A")
    obs["observation/exterior_image_2_left"] = obs.pop("observation/exterior_image_1_left")
    obs["observation/exterior_image_1_left"] = obs.pop("observation/exterior_image_0_left")
    assert state(robot.infer(obs)) == (1, 0, 1.5)
