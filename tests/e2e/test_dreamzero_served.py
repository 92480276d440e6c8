"""DreamZero-DROID (the tiny checkpoint with DROID's action register) behind a real server, driven
by the real ``openpi-client`` and by a robot speaking RoboArena's client protocol: per-robot
sessions, a reconnect that continues its episode, a reset that starts it over."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from models.policy.base import PolicyWork
from models.policy.dreamzero import load_policy
from models.policy.dreamzero.config import TINY_DROID
from models.policy.dreamzero.observation import METADATA, droid_observation
from models.policy.dreamzero.tiny_checkpoint import write_tiny_checkpoint, write_tiny_tokenizer
from protocols.openpi import validate_observation
from tests.e2e.test_openpi_ws import PATH, running
from tests.support.roboarena_client import RoboArenaClient


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("dreamzero_e2e")
    return str(write_tiny_checkpoint(root / "ckpt", cfg=TINY_DROID)), str(write_tiny_tokenizer(root / "tok"))


@pytest.fixture(scope="module")
def served(folders) -> Iterator[str]:
    with running(load_policy(*folders, sessions=4), batch_wait_ms=20) as addr:
        yield addr


def reference(folders, seed: int, calls: int) -> list[np.ndarray]:
    """The episode's chunks from a policy of its own, in process, one call at a time."""
    policy = load_policy(*folders, sessions=1)
    out = []
    for i in range(calls):
        obs = droid_observation(seed, i)
        work = PolicyWork("ref", f"ref:{i}", validate_observation(obs, METADATA))
        out.append(policy.run_batch([work])[0].actions)
        policy.end_tick("ref", True)
    return out


def chunk(reply: dict[str, Any]) -> np.ndarray:
    actions = reply["actions"]
    assert actions.shape == (24, 8) and actions.dtype == np.float32 and np.isfinite(actions).all()
    return actions


def test_two_robots_with_their_own_sessions_get_their_own_chunks(served, folders):
    config = RoboArenaClient(f"ws://{served}/").get_server_metadata()
    assert (config["action_horizon"], config["action_dim"], config["image_resolution"]) == (24, 8, [180, 320])
    assert config["needs_session_id"] is True and config["policy"] == "dreamzero"

    robots = [WebsocketClientPolicy(host=f"ws://{served}{PATH}") for _ in range(2)]
    barrier = threading.Barrier(2)
    got: dict[int, list[np.ndarray]] = {}

    def drive(i: int) -> None:
        barrier.wait()
        got[i] = [chunk(robots[i].infer(droid_observation(10 + i, call, f"robot-{i}"))) for call in range(3)]

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(got) == [0, 1]
    for i in range(2):
        # Sharing a forward with the other robot moves a chunk by float32 rounding at most.
        for a, b in zip(got[i], reference(folders, 10 + i, 3)):
            np.testing.assert_allclose(a, b, rtol=0, atol=2e-6)
    assert np.abs(got[0][0] - got[1][0]).max() > 1e-2


def test_a_robot_reconnecting_continues_and_a_reset_starts_over(served, folders):
    want = reference(folders, 20, 3)
    first = RoboArenaClient(f"ws://{served}/")
    for call in range(2):
        np.testing.assert_array_equal(chunk(first.infer(droid_observation(20, call, "ep-R"))), want[call])
    first.close()
    second = RoboArenaClient(f"ws://{served}/")
    np.testing.assert_array_equal(chunk(second.infer(droid_observation(20, 2, "ep-R"))), want[2])
    # RoboArena's evaluator resets with the episode's id; the episode starts over.
    assert isinstance(second.reset({"session_id": "ep-R"}), bytes)
    np.testing.assert_array_equal(chunk(second.infer(droid_observation(20, 0, "ep-R"))), want[0])
    second.close()


def test_openpi_client_without_a_session_id_is_one_episode_per_connection(served, folders):
    want = reference(folders, 30, 2)
    robot = WebsocketClientPolicy(host=f"ws://{served}{PATH}")
    assert [chunk(robot.infer(droid_observation(30, call))).tolist() for call in range(2)] == [w.tolist() for w in want]
    assert robot.infer({"endpoint": "reset"}) == {"status": "reset successful"}
    np.testing.assert_array_equal(chunk(robot.infer(droid_observation(30, 0))), want[0])


def test_a_bad_observation_is_named_and_the_episode_kept(served, folders):
    want = reference(folders, 40, 2)
    robot = RoboArenaClient(f"ws://{served}/")
    np.testing.assert_array_equal(chunk(robot.infer(droid_observation(40, 0, "ep-B"))), want[0])
    bad = droid_observation(40, 1, "ep-B")
    bad["observation/joint_position"] = bad["observation/joint_position"][:6]
    with pytest.raises(RuntimeError) as info:
        robot.infer(bad)
    assert str(info.value) == ("Error in inference server:\ninvalid request: 'observation/joint_position' "
                               "must have shape [7], got [6]")
    again = RoboArenaClient(f"ws://{served}/")
    np.testing.assert_array_equal(chunk(again.infer(droid_observation(40, 1, "ep-B"))), want[1])


def test_an_idle_episode_swaps_to_the_host_and_continues_with_the_same_chunks(folders):
    want = reference(folders, 50, 3)
    with running(load_policy(*folders, sessions=1)) as addr:
        a, b = RoboArenaClient(f"ws://{addr}/"), RoboArenaClient(f"ws://{addr}/")
        np.testing.assert_array_equal(chunk(a.infer(droid_observation(50, 0, "ep-A"))), want[0])
        chunk(b.infer(droid_observation(51, 0, "ep-B")))             # one session resident: ep-A to the host
        for call in (1, 2):                                  # ep-A back (ep-B out), bit for bit
            np.testing.assert_array_equal(chunk(a.infer(droid_observation(50, call, "ep-A"))), want[call])


def test_a_new_episode_without_room_is_refused_busy_until_one_ends(folders):
    want = reference(folders, 60, 1)
    with running(load_policy(*folders, sessions=1, host_budget_bytes=0)) as addr:
        a, b = RoboArenaClient(f"ws://{addr}/"), RoboArenaClient(f"ws://{addr}/")
        chunk(a.infer(droid_observation(61, 0, "ep-A")))
        with pytest.raises(RuntimeError) as info:
            b.infer(droid_observation(60, 0, "ep-B"))
        assert str(info.value).startswith("Error in inference server:\npolicy failed: busy: session ep-B: no room "
                                          "for a new session: it needs ")
        a.reset({"session_id": "ep-A"})                      # ep-A's state goes: room for ep-B
        again = RoboArenaClient(f"ws://{addr}/")
        np.testing.assert_array_equal(chunk(again.infer(droid_observation(60, 0, "ep-B"))), want[0])


def test_a_new_episode_reclaims_one_whose_robot_left(folders):
    # A robot that starts each episode under a new id and never resets: the episode it left
    # makes room for its next one; the left one, asked for again, is refused until reset.
    want = reference(folders, 70, 1)
    with running(load_policy(*folders, sessions=1, host_budget_bytes=0)) as addr:
        first = RoboArenaClient(f"ws://{addr}/")
        chunk(first.infer(droid_observation(71, 0, "ep-1")))
        first.close()                                        # ep-1's robot is gone: its state is reclaimable
        wait_until_unlisted(addr, "ep-1")
        robot = RoboArenaClient(f"ws://{addr}/")
        np.testing.assert_array_equal(chunk(robot.infer(droid_observation(70, 0, "ep-2"))), want[0])
        with pytest.raises(RuntimeError) as info:
            RoboArenaClient(f"ws://{addr}/").infer(droid_observation(71, 1, "ep-1"))
        assert "session ep-1: its state was evicted" in str(info.value)


def wait_until_unlisted(addr: str, session_id: str, timeout_s: float = 10.0) -> None:
    """Until the server's ``/v1/sessions`` no longer lists ``session_id`` (its connection ended)."""
    deadline = time.monotonic() + timeout_s
    while any(s["session_id"] == session_id
              for s in httpx.get(f"http://{addr}/v1/sessions", timeout=5).json()["data"]):
        assert time.monotonic() < deadline, f"{session_id} still listed"
        time.sleep(0.02)
