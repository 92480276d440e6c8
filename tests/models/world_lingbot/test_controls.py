"""The camera_actions and camera_trajectory reducers."""

from __future__ import annotations

import numpy as np
import pytest

from models.world.lingbot.controls import (MAX_INLINE_FRAMES, CameraActionsReducer,
                                           CameraTrajectoryReducer, lingbot_reducers)
from sessions.errors import ErrorCode, SessionError
from sessions.frozen import deep_freeze

W, D, J, NONE = frozenset("w"), frozenset("d"), frozenset("j"), frozenset()


def _u(**data):
    return deep_freeze(data, "data")


def _tick(r, *updates):
    for u in updates:
        r.validate(u)
    p = r.prepare(list(updates))
    r.commit(p)
    return p.value


def test_state_keys_are_held_until_released():
    r = CameraActionsReducer(3)
    assert _tick(r, _u(mode="state", held=["W"])) == (W, W, W)
    assert _tick(r) == (W, W, W)
    assert _tick(r, _u(mode="state", held=[])) == (NONE,) * 3


def test_a_press_and_release_inside_one_block_is_a_one_frame_pulse():
    r = CameraActionsReducer(3)
    v = _tick(r, _u(mode="state", held=["j"]), _u(mode="state", held=[]))
    assert v == (J, NONE, NONE)
    assert _tick(r) == (NONE,) * 3


def test_a_script_is_consumed_once_padded_with_neutral_frames_and_only_on_commit():
    r = CameraActionsReducer(3)
    _tick(r, _u(mode="state", held=["d"]))
    u = _u(mode="script", frames=[["w"], ["w", "j"], [], ["w"]])
    r.validate(u)
    first = r.prepare([u])
    again = r.prepare([u])                    # a failed tick: nothing consumed
    assert first.value == again.value == (W, W | J, NONE)
    r.commit(first)
    assert _tick(r) == (W, NONE, NONE)        # script ends inside the block: neutral pad
    assert _tick(r) == (D, D, D)              # then the held keys again


def test_frames_mode_is_exactly_one_block():
    r = CameraActionsReducer(3)
    assert _tick(r, _u(mode="frames", frames=[["w"], ["w", "j"], []])) == (W, W | J, NONE)
    with pytest.raises(SessionError, match="exactly 3 key lists"):
        r.validate(_u(mode="frames", frames=[["w"]]))


@pytest.mark.parametrize("data,match", [
    ({"mode": "state", "held": ["q"]}, "unknown key 'q'"),
    ({"mode": "state"}, "missing \\['held'\\]"),
    ({"mode": "fly"}, "mode must be"),
    ({"mode": "script", "frames": [["w"]] * 257}, "at most 256"),
    ({"mode": "state", "held": ["w"], "x": 1}, "unknown \\['x'\\]"),
    ({"mode": "state", "held": ["\u212a"]}, "unknown key"),  # the Kelvin sign: "k" once lower-cased
    ({"mode": "state", "held": ["q" * 60_000]}, "unknown key 'qqqq.*\\.\\.\\. \\(60000 characters\\)"),
])
def test_bad_actions_are_bad_requests(data, match):
    with pytest.raises(SessionError, match=match) as e:
        CameraActionsReducer(3).validate(_u(**data))
    assert e.value.code == ErrorCode.BAD_REQUEST


def test_script_backlog_is_bounded():
    r = CameraActionsReducer(3)
    u = _u(mode="script", frames=[["w"]] * 256)
    with pytest.raises(SessionError) as e:
        r.admit([u] * 17)
    assert e.value.code == ErrorCode.QUEUE_FULL


def _traj(n):
    poses = [np.eye(4) for _ in range(n)]
    for i, p in enumerate(poses):
        p[0, 3] = 0.1 * i
    return [p.tolist() for p in poses], [[500.0, 500.0, 416.0, 240.0]] * n


def test_inline_trajectory_plays_block_by_block_and_holds_its_last_pose():
    r = CameraTrajectoryReducer(3)
    poses, intr = _traj(4)
    assert _tick(r) is None
    b1 = _tick(r, _u(mode="inline", poses=poses, intrinsics=intr))
    p1, k1 = b1.arrays()
    assert b1.starts and np.allclose(p1[:, 0, 3], [0, 0.1, 0.2]) and k1.shape == (3, 4)
    b2 = _tick(r)
    p2, _ = b2.arrays()
    assert not b2.starts and np.allclose(p2[:, 0, 3], [0.3, 0.3, 0.3])
    assert _tick(r) is None                   # finished: back to the keys


def test_trajectory_stop_and_reset():
    r = CameraTrajectoryReducer(3)
    poses, intr = _traj(9)
    _tick(r, _u(mode="inline", poses=poses, intrinsics=intr))
    assert _tick(r, _u(mode="stop")) is None
    _tick(r, _u(mode="inline", poses=poses, intrinsics=intr))
    r.reset()
    assert _tick(r) is None


def test_inline_is_bounded_and_checked():
    r = CameraTrajectoryReducer(3)
    poses, intr = _traj(MAX_INLINE_FRAMES + 1)
    with pytest.raises(SessionError, match="1..128 frames"):
        r.validate(_u(mode="inline", poses=poses, intrinsics=intr))
    poses, intr = _traj(3)
    with pytest.raises(SessionError, match="3 poses but 2 intrinsics"):
        r.validate(_u(mode="inline", poses=poses, intrinsics=intr[:2]))
    poses[1][0][0] = float("nan")
    with pytest.raises(SessionError, match="finite"):
        r.validate(_u(mode="inline", poses=poses, intrinsics=intr))
    with pytest.raises(SessionError, match="numbers"):
        r.validate(_u(mode="inline", poses=[[["x"] * 4] * 4], intrinsics=[[1, 1, 1, 1]]))


def test_named_trajectories_need_a_root_and_obey_the_file_rules(tmp_path):
    with pytest.raises(SessionError, match="--trajectory-root"):
        CameraTrajectoryReducer(3).validate(_u(mode="named", name="orbit"))
    d = tmp_path / "orbit"
    d.mkdir()
    poses = np.tile(np.eye(4), (5, 1, 1))
    poses[:, 2, 3] = np.arange(5)
    np.save(d / "poses.npy", poses)
    np.save(d / "intrinsics.npy", np.tile([500.0, 500.0, 416.0, 240.0], (5, 1)))
    reducers = lingbot_reducers(3, tmp_path)
    r = reducers["camera_trajectory"]
    b = _tick(r, _u(mode="named", name="orbit"))
    assert np.allclose(b.arrays()[0][:, 2, 3], [0, 1, 2])
    with pytest.raises(SessionError, match="component") as e:
        r.validate(_u(mode="named", name="../orbit"))
    assert e.value.code == ErrorCode.BAD_REQUEST
    enc = CameraTrajectoryReducer.encode_value(b)
    assert CameraTrajectoryReducer.decode_value(enc) == b
    assert set(reducers) == {"camera_actions", "camera_trajectory"}
