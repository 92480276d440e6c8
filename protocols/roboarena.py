"""RoboArena's policy-server handshake, carried inside OpenPI's first frame.

RoboArena (``robo-arena/roboarena`` ``policy_server.py``; DreamZero's ``eval_utils/policy_server.py``
is a copy of it) speaks OpenPI's msgpack-numpy over a WebSocket. What it adds:

* The first frame is the server's ``PolicyServerConfig`` as a map: ``image_resolution`` [H, W],
  ``needs_wrist_camera``, ``n_external_cameras`` (0-2), ``needs_stereo_camera``,
  ``needs_session_id`` and ``action_space``. Its evaluator reads those keys with ``dict.get``, so
  they ride in our metadata map beside OpenPI's own keys, which ``openpi-client`` never reads.
* Every request names its ``endpoint``: ``"infer"`` with an observation, ``"reset"`` with the
  ``reset_info`` the client passes (its ``session_id``, or nothing).
* The observation's keys are fixed: ``observation/exterior_image_{i}_left`` for i < n (0-indexed, as
  RoboArena's own test and DreamZero's DROID clients write them; RoboArena's evaluator numbers them
  from 1, which is read too: ``sent_cameras``), ``observation/wrist_image_left``,
  ``_right`` twins when stereo, ``observation/joint_position`` (7),
  ``observation/cartesian_position`` (6), ``observation/gripper_position`` (1), ``prompt`` and, when
  ``needs_session_id``, ``session_id``: one id per evaluation episode.

``RoboArenaConfig`` is what a policy declares; ``PolicyMetadata(roboarena=...)`` sends it and
checks observations against it (``state_vectors``). Pure numpy, like ``protocols/openpi.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from protocols.openpi import ProtocolError, _describe, _is_int, _is_real

ACTION_SPACES = ("joint_position", "joint_velocity", "cartesian_position", "cartesian_velocity")
INFER_ENDPOINT = "infer"
WRIST_IMAGE = "observation/wrist_image_left"
JOINT_POSITION = "observation/joint_position"
CARTESIAN_POSITION = "observation/cartesian_position"
GRIPPER_POSITION = "observation/gripper_position"
# Lengths of the robot-state vectors every RoboArena observation carries (a DROID Franka:
# 7 joints, an end-effector pose of xyz + euler, one gripper opening).
STATE_VECTORS: Mapping[str, int] = MappingProxyType({JOINT_POSITION: 7, CARTESIAN_POSITION: 6, GRIPPER_POSITION: 1})
# The keys of the config map, in RoboArena's order.
CONFIG_KEYS = ("image_resolution", "needs_wrist_camera", "n_external_cameras", "needs_stereo_camera",
               "needs_session_id", "action_space")


_SAME_KEYS: Mapping[str, str] = MappingProxyType({})


def exterior_image(i: int, side: str = "left") -> str:
    return f"observation/exterior_image_{i}_{side}"


@dataclass(frozen=True)
class RoboArenaConfig:
    """RoboArena's ``PolicyServerConfig``, as a policy declares it.

    ``image_resolution`` is required here (RoboArena allows None, "send raw images"; our
    observations are checked against one size). ``needs_session_id`` is how a policy says it is
    stateful: it keeps per-robot state under the observation's ``session_id``."""

    image_resolution: tuple[int, int]
    needs_wrist_camera: bool = True
    n_external_cameras: int = 1
    needs_stereo_camera: bool = False
    needs_session_id: bool = False
    action_space: str = "joint_position"

    def __post_init__(self) -> None:
        res = tuple(self.image_resolution)
        if len(res) != 2 or not all(_is_int(v) and v > 0 for v in res):
            raise ValueError(f"roboarena image_resolution must be [H, W], got {self.image_resolution!r}")
        if not _is_int(self.n_external_cameras) or not 0 <= self.n_external_cameras <= 2:
            raise ValueError(f"roboarena n_external_cameras must be 0, 1 or 2, got {self.n_external_cameras!r}")
        if self.action_space not in ACTION_SPACES:
            raise ValueError(f"roboarena action_space must be one of {ACTION_SPACES}, got {self.action_space!r}")
        if not self.needs_wrist_camera and self.n_external_cameras == 0:
            raise ValueError("a roboarena policy needs at least one camera")
        object.__setattr__(self, "image_resolution", (int(res[0]), int(res[1])))

    @property
    def camera_keys(self) -> tuple[str, ...]:
        """Every camera the client sends: the exteriors in order, then the wrist; ``_right`` after
        each ``_left`` when stereo."""
        sides = ("left", "right") if self.needs_stereo_camera else ("left",)
        keys = [exterior_image(i, s) for i in range(self.n_external_cameras) for s in sides]
        if self.needs_wrist_camera:
            keys += [f"observation/wrist_image_{s}" for s in sides]
        return tuple(keys)

    @property
    def action_dim(self) -> int:
        """7 joints or a 6-D pose, plus the gripper."""
        return 8 if self.action_space.startswith("joint") else 7

    @property
    def required_state(self) -> tuple[str, ...]:
        """The state vectors a request must carry: the joints and the gripper always, the
        end-effector pose when the actions are cartesian. The pose is checked whenever sent."""
        if self.action_space.startswith("cartesian"):
            return (JOINT_POSITION, CARTESIAN_POSITION, GRIPPER_POSITION)
        return (JOINT_POSITION, GRIPPER_POSITION)

    def sent_cameras(self, msg: Mapping[str, Any]) -> Mapping[str, str]:
        """Camera key -> the key ``msg`` carries it under, for the cameras sent under another.

        RoboArena's evaluator numbers the exteriors from 1 (``exterior_image_1_left``,
        ``exterior_image_2_left`` for two), RoboArena's own test and DreamZero's clients from 0. A
        request without ``exterior_image_0_left`` but with ``exterior_image_{n}_left`` (a key no
        0-indexed client sends) is read as numbered from 1: its i-th exterior is camera i - 1."""
        n = self.n_external_cameras
        if n == 0 or exterior_image(0) in msg or exterior_image(n) not in msg:
            return _SAME_KEYS
        sides = ("left", "right") if self.needs_stereo_camera else ("left",)
        return {exterior_image(i, s): exterior_image(i + 1, s) for i in range(n) for s in sides}

    def to_wire(self) -> dict[str, Any]:
        return {
            "image_resolution": list(self.image_resolution),
            "needs_wrist_camera": bool(self.needs_wrist_camera),
            "n_external_cameras": int(self.n_external_cameras),
            "needs_stereo_camera": bool(self.needs_stereo_camera),
            "needs_session_id": bool(self.needs_session_id),
            "action_space": self.action_space,
        }

    def state_vectors(self, msg: Mapping[str, Any], where: str = "") -> dict[str, np.ndarray]:
        """The request's state vectors as read-only float64 arrays (DreamZero's server reads them
        as float64), or a ``ProtocolError`` naming the first bad one."""
        required = self.required_state
        out = {}
        for key, length in STATE_VECTORS.items():
            if key in msg:
                out[key] = state_vector(msg[key], length, f"{where}{key!r}")
            elif key in required:
                raise ProtocolError(f"missing {where}{key!r} (float [{length}])")
        return out


def state_vector(value: Any, length: int, name: str) -> np.ndarray:
    """``value`` (a real 1-D array or a list of numbers) as a read-only float64 [length] of finite values."""
    if isinstance(value, (list, tuple)) and all(_is_real(v) for v in value):
        value = np.asarray(value, dtype=np.float64)
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "fiu":
        raise ProtocolError(f"{name} must be a float array, got {_describe(value)}")
    if value.shape != (length,):
        raise ProtocolError(f"{name} must have shape [{length}], got {list(value.shape)}")
    vector = value.astype(np.float64)
    if not np.isfinite(vector).all():
        bad = int(np.flatnonzero(~np.isfinite(vector))[0])
        raise ProtocolError(f"{name} has a non-finite value (NaN or inf) at index {bad}")
    vector.flags.writeable = False
    return vector
