"""A small stateful robot policy for the OpenPI tests: it declares RoboArena's
``needs_session_id`` and keeps one counter per session, so a test can see which
robot's state each reply came from, and records every reset and drop.

Each reply's ``actions`` (float32 [4, 8]) encode the session's state::

    row 0: [calls in this session (this one included), resets of it so far, joint_position[0], 0, ...]
    rows 1-3: zeros

The observation is RoboArena's DROID one at a tiny size: two exteriors and a wrist, uint8
[6, 8, 3] (or [T, 6, 8, 3], T <= 4), ``observation/joint_position`` (7),
``observation/gripper_position`` (1), an optional ``prompt`` of at most 64 characters.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping, Sequence

import numpy as np

from models.policy.base import PolicyAdapter, PolicyWork
from protocols.openpi import PolicyMetadata
from protocols.roboarena import JOINT_POSITION, RoboArenaConfig

ARENA = RoboArenaConfig(image_resolution=(6, 8), needs_wrist_camera=True, n_external_cameras=2,
                        needs_session_id=True, action_space="joint_position")
METADATA = PolicyMetadata(action_horizon=4, action_dim=8, image_keys=ARENA.camera_keys, image_resolution=(6, 8),
                          state_dim=0, max_frames=4, max_prompt_chars=64, roboarena=ARENA,
                          extra={"policy": "stateful-test"})


class StatefulPolicy(PolicyAdapter):
    """Per-session call counters; ``calls``, ``resets`` and ``drops`` record what the engine asked."""

    def __init__(self, name: str = "stateful-test-policy", max_batch: int = 8) -> None:
        self.metadata = METADATA
        self.name = name
        self.max_batch = max_batch
        self.inline_forward_s = 0.0  # always through the engine thread, as a GPU policy runs
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._resets: dict[str, int] = {}
        self.calls: list[str] = []  # session id of every observation, in order
        self.resets: list[str] = []
        self.drops: list[str] = []

    def infer_batch(self, works: Sequence[PolicyWork]) -> list[Mapping[str, Any]]:
        out = []
        with self._lock:
            for work in works:
                sid = work.session_id
                self._counts[sid] = self._counts.get(sid, 0) + 1
                self.calls.append(sid)
                actions = np.zeros((4, 8), np.float32)
                actions[0, :3] = (self._counts[sid], self._resets.get(sid, 0),
                                  work.observation.extras[JOINT_POSITION][0])
                out.append({"actions": actions})
        return out

    def reset(self, session_id: str) -> None:
        with self._lock:
            self._counts.pop(session_id, None)
            self._resets[session_id] = self._resets.get(session_id, 0) + 1
            self.resets.append(session_id)

    def drop_session(self, session_id: str) -> None:
        with self._lock:
            self._counts.pop(session_id, None)
            self._resets.pop(session_id, None)
            self.drops.append(session_id)

    def count(self, session_id: str) -> int | None:
        """The session's calls since its last reset, None if the policy holds nothing for it."""
        with self._lock:
            return self._counts.get(session_id)


def droid_obs(joint0: float = 0.0, frames: int | None = None, **over: Any) -> dict[str, Any]:
    """One observation as RoboArena's and DreamZero's DROID clients build it, at METADATA's size."""
    shape = (6, 8, 3) if frames is None else (frames, 6, 8, 3)
    obs: dict[str, Any] = {key: np.full(shape, i + 1, np.uint8) for i, key in enumerate(ARENA.camera_keys)}
    obs.update({
        "observation/joint_position": np.array([joint0, 0, 0, 0, 0, 0, 0], np.float64),
        "observation/cartesian_position": np.zeros(6, np.float64),
        "observation/gripper_position": np.array([0.5], np.float64),
        "prompt": "wipe the table",
    })
    obs.update(over)
    return {k: v for k, v in obs.items() if v is not None}
