"""A trajectory plays relative to its first pose, so that pose must be invertible: a
singular or ill-conditioned one is refused when the event is accepted (``bad_request``,
nothing changes), inline and by name, never left for the tick to trip over."""

from __future__ import annotations

import numpy as np
import pytest

from models.world.lingbot.controls import CameraTrajectoryReducer
from models.world.lingbot.trajectory_files import TrajectoryError, checked, load_trajectory
from sessions import KeysReducer, Session
from sessions.errors import ErrorCode, SessionError
from sessions.events import ControlInput, SessionEvent
from sessions.frozen import deep_freeze

INTRINSICS = [500.0, 500.0, 416.0, 240.0]


def _slide(n: int) -> np.ndarray:
    p = np.tile(np.eye(4), (n, 1, 1))
    p[:, 0, 3] = 0.1 * np.arange(n)
    return p


def _singular(n: int = 3) -> np.ndarray:
    p = _slide(n)
    p[0, :3, :3] = 0.0      # last row still 0 0 0 1: only the rotation part is singular
    return p


def _rank_two(n: int = 3) -> np.ndarray:
    p = _slide(n)
    p[0, :3, :3] = [[1, 0, 0], [0, 1, 0], [1, 1, 0]]
    return p


def _ill_conditioned(n: int = 3) -> np.ndarray:
    p = _slide(n)
    p[0, :3, :3] = np.diag([1.0, 1.0, 1e-12])
    return p


def _overflowing(n: int = 3) -> np.ndarray:
    # Invertible and finite, but relative to a tiny first pose the others overflow.
    p = _slide(n)
    p[0, :3, :3] = np.eye(3) * 1e-300
    p[1:, :3, :3] = np.eye(3) * 1e300
    return p


def _inline(poses: np.ndarray) -> dict:
    return {"mode": "inline", "poses": poses.tolist(), "intrinsics": [INTRINSICS] * len(poses)}


BAD = [_singular, _rank_two, _ill_conditioned, _overflowing]


@pytest.mark.parametrize("poses", BAD)
def test_checked_refuses_a_first_pose_that_cannot_be_inverted(poses):
    p = poses()
    with pytest.raises(TrajectoryError, match="first pose"):
        checked(p, np.tile(INTRINSICS, (len(p), 1)), "t")


def test_checked_keeps_the_poses_relative_to_the_first():
    p = _slide(4)
    p[0, :3, 3] = [1.0, 2.0, 3.0]
    t = checked(p, np.tile(INTRINSICS, (4, 1)), "t")
    np.testing.assert_array_equal(t.relative, np.linalg.inv(p[0]) @ p)
    np.testing.assert_array_equal(t.relative[0], np.eye(4))


@pytest.mark.parametrize("poses", BAD)
def test_an_inline_trajectory_with_a_bad_first_pose_is_refused_at_accept(poses):
    session = Session("s", reducers={"keys": KeysReducer(4), "camera_trajectory": CameraTrajectoryReducer(3)})
    control = ControlInput("camera_trajectory", "lingbot.camera_trajectory.v1", deep_freeze(_inline(poses()), "data"))
    with pytest.raises(SessionError) as info:
        session.accept_event(SessionEvent(event_id=1, controls=(control,)))
    assert info.value.code is ErrorCode.BAD_REQUEST and info.value.event_id == 1
    assert "first pose" in info.value.message
    # Refused: nothing changed, and the next tick starts.
    assert session.pending_event_ids == () and session.event_floor == -1
    assert session.begin_tick().controls["camera_trajectory"] is None


@pytest.mark.parametrize("poses", BAD)
def test_a_named_trajectory_with_a_bad_first_pose_is_refused(tmp_path, poses):
    d = tmp_path / "bad"
    d.mkdir()
    p = poses()
    np.save(d / "poses.npy", p)
    np.save(d / "intrinsics.npy", np.tile(INTRINSICS, (len(p), 1)))
    with pytest.raises(TrajectoryError, match="first pose"):
        load_trajectory(tmp_path, "bad")
    with pytest.raises(SessionError, match="first pose") as info:
        CameraTrajectoryReducer(3, tmp_path).validate(deep_freeze({"mode": "named", "name": "bad"}, "data"))
    assert info.value.code is ErrorCode.BAD_REQUEST


def test_only_the_last_update_of_a_tick_is_prepared(tmp_path):
    """Each update replaces the trajectory before it: an earlier one (here a name whose
    files went after it was accepted) is never loaded again."""
    d = tmp_path / "gone"
    d.mkdir()
    np.save(d / "poses.npy", _slide(3))
    np.save(d / "intrinsics.npy", np.tile(INTRINSICS, (3, 1)))
    r = CameraTrajectoryReducer(3, tmp_path)
    named = deep_freeze({"mode": "named", "name": "gone"}, "data")
    inline = deep_freeze(_inline(_slide(3)), "data")
    r.validate(named)
    r.validate(inline)
    r._loaded.clear()  # the memo forgot it (it holds a few)
    (d / "poses.npy").unlink()
    value = r.prepare([named, inline]).value
    np.testing.assert_allclose(value.arrays()[0][:, 0, 3], [0.0, 0.1, 0.2])
