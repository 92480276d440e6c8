"""LingBot's control tracks, as session reducers (the session code stays schema-agnostic).

``camera_actions`` (schema ``lingbot.camera_actions.v1``), keys W A S D I J K L, one
key set per *latent* frame; a tick's value is ``frames_per_block`` frozensets::

    {"mode": "state",  "held": ["w"]}             keys held until released
    {"mode": "script", "frames": [["w"], [], ...]} queued, one list per latent frame
    {"mode": "frames", "frames": [["w"], ["w", "j"], []]}   exactly the next block

In ``state`` mode a key pressed and released between two ticks (it appears in an
update of the tick but not in the last one) still moves the camera for one frame:
a one-frame pulse in the block's first frame. A ``script`` is consumed once, frame
by frame, only when the tick commits (a failed tick leaves it queued); when it ends
inside a block the block is padded with neutral (no key) frames. ``frames`` fills
the next block exactly and takes precedence over script and held keys for it.

``camera_trajectory`` (schema ``lingbot.camera_trajectory.v1``): explicit poses::

    {"mode": "inline", "poses": [[4x4], ...], "intrinsics": [[fx, fy, cx, cy], ...]}
    {"mode": "named",  "name": "orbit"}          DIR/orbit/{poses,intrinsics}.npy
    {"mode": "stop"}

``inline`` takes at most ``MAX_INLINE_FRAMES`` (a 64 KiB text frame holds that many
comfortably); ``named`` needs the server's ``--trajectory-root DIR`` and loads under
every rule of ``trajectory_files``. A playing trajectory is consumed block by block
and takes precedence over the keys; the tick value is None when none plays, else a
``TrajectoryBlock``: the frames' poses relative to the trajectory's first pose (the
model anchors them at the camera's pose when the trajectory starts), intrinsics at
832x480, and whether this block starts the trajectory. A trajectory ending inside a
block holds its last pose for the rest.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from models.world.lingbot.trajectory_files import (Trajectory, TrajectoryError, checked,
                                                   load_trajectory)
from protocols.echo import shown, shown_all
from protocols.world_v1 import KEY_NAMES
from sessions.errors import ErrorCode, SessionError
from sessions.frozen import FrozenDict
from sessions.reducers import ControlReducer, Prepared

ACTIONS_TRACK, ACTIONS_SCHEMA = "camera_actions", "lingbot.camera_actions.v1"
TRAJECTORY_TRACK, TRAJECTORY_SCHEMA = "camera_trajectory", "lingbot.camera_trajectory.v1"
MAX_FRAMES_PER_EVENT = 256
MAX_SCRIPT_FRAMES = 4096
MAX_INLINE_FRAMES = 128
_KEYS = frozenset(KEY_NAMES)


def _bad(schema: str, message: str) -> SessionError:
    return SessionError(ErrorCode.BAD_REQUEST, f"{schema}: {message}")


def _fields(data: FrozenDict, schema: str, *names: str) -> None:
    want = {"mode", *names}
    if set(data) != want:
        missing, extra = sorted(want - set(data)), sorted(set(data) - want)
        raise _bad(schema, f"mode {shown(data.get('mode'))} takes {sorted(want)}"
                   + (f"; missing {missing}" if missing else "") + (f"; unknown {shown_all(extra)}" if extra else ""))


def _keyset(keys: Any, where: str) -> frozenset[str]:
    if not isinstance(keys, (tuple, list)):
        raise _bad(ACTIONS_SCHEMA, f"{where} must be a list of key names")
    out = set()
    for i, key in enumerate(keys):
        # ASCII only: str.lower() maps other letters onto these too (the Kelvin sign onto "k").
        name = key.lower() if type(key) is str and key.isascii() else None
        if name not in _KEYS:
            raise _bad(ACTIONS_SCHEMA, f"unknown key {shown(key)} at {where}[{i}]; keys are "
                       f"{', '.join(KEY_NAMES)}")
        out.add(name)
    return frozenset(out)


def _frame_list(frames: Any, where: str) -> tuple[frozenset[str], ...]:
    if not isinstance(frames, (tuple, list)):
        raise _bad(ACTIONS_SCHEMA, f"{where} must be a list of key lists")
    if len(frames) > MAX_FRAMES_PER_EVENT:
        raise _bad(ACTIONS_SCHEMA, f"{where}: {len(frames)} frames, at most {MAX_FRAMES_PER_EVENT}")
    return tuple(_keyset(f, f"{where}[{i}]") for i, f in enumerate(frames))


class CameraActionsReducer(ControlReducer):
    """Keys per latent frame of one session (see the module docstring)."""

    track, schema = ACTIONS_TRACK, ACTIONS_SCHEMA

    def __init__(self, frames_per_block: int) -> None:
        if type(frames_per_block) is not int or frames_per_block < 1:
            raise ValueError(f"frames_per_block must be a positive int, got {frames_per_block!r}")
        self.frames_per_block = frames_per_block
        self._held: frozenset[str] = frozenset()
        self._script: tuple[frozenset[str], ...] = ()

    def validate(self, data: FrozenDict) -> None:
        mode = data.get("mode")
        if mode == "state":
            _fields(data, self.schema, "held")
            _keyset(data["held"], "held")
        elif mode in ("script", "frames"):
            _fields(data, self.schema, "frames")
            frames = _frame_list(data["frames"], "frames")
            if mode == "frames" and len(frames) != self.frames_per_block:
                raise _bad(self.schema, f"mode 'frames' takes exactly {self.frames_per_block} "
                           f"key lists (one block), got {len(frames)}")
        else:
            raise _bad(self.schema, f"mode must be 'state', 'script' or 'frames', got {shown(mode)}")

    def admit(self, updates: Sequence[FrozenDict]) -> None:
        backlog = len(self._script) + sum(len(u["frames"]) for u in updates if u["mode"] == "script")
        if backlog > MAX_SCRIPT_FRAMES:
            raise SessionError(ErrorCode.QUEUE_FULL, f"{self.track}: script backlog would be "
                               f"{backlog} frames, at most {MAX_SCRIPT_FRAMES}")

    def prepare(self, updates: Sequence[FrozenDict]) -> Prepared:
        held, script, block = self._held, self._script, None
        pressed: set[str] = set()
        for data in updates:
            if data["mode"] == "state":
                held = _keyset(data["held"], "held")
                pressed |= held
            elif data["mode"] == "script":
                script = script + _frame_list(data["frames"], "frames")
            else:
                block = _frame_list(data["frames"], "frames")
        n = self.frames_per_block
        if block is not None:
            value = block
        elif script:
            value = script[:n] + (frozenset(),) * (n - len(script[:n]))
            script = script[n:]
        else:
            pulse = frozenset(pressed - held)
            value = (held | pulse,) + (held,) * (n - 1)
        return Prepared(value=value, next_state=(held, script))

    def commit(self, prepared: Prepared) -> None:
        self._held, self._script = prepared.next_state

    def reset(self) -> None:
        self._held, self._script = frozenset(), ()

    @classmethod
    def encode_value(cls, value: Sequence[frozenset[str]]) -> list[list[str]]:
        return [sorted(f) for f in value]

    @classmethod
    def decode_value(cls, wire: Any) -> tuple[frozenset[str], ...]:
        return tuple(_keyset(f, f"[{i}]") for i, f in enumerate(wire))


@dataclass(frozen=True)
class TrajectoryBlock:
    """One block's share of a playing trajectory."""

    poses: tuple[tuple[float, ...], ...]       # per frame, 16 floats: inv(T0) @ T_f, row-major
    intrinsics: tuple[tuple[float, ...], ...]  # per frame fx, fy, cx, cy at 832x480
    starts: bool                               # this block holds the trajectory's first frame

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.array(self.poses, dtype=np.float64).reshape(-1, 4, 4),
                np.array(self.intrinsics, dtype=np.float64))


def _inline(data: FrozenDict) -> Trajectory:
    poses, intr = data["poses"], data["intrinsics"]
    if not isinstance(poses, (list, tuple)) or not isinstance(intr, (list, tuple)):
        raise _bad(TRAJECTORY_SCHEMA, "poses and intrinsics must be lists")
    if not 1 <= len(poses) <= MAX_INLINE_FRAMES:
        raise _bad(TRAJECTORY_SCHEMA, f"inline trajectories have 1..{MAX_INLINE_FRAMES} frames "
                   f"(longer ones go by name from the trajectory root), got {len(poses)}")
    try:
        p = np.array(_plain(poses), dtype=np.float64)
        k = np.array(_plain(intr), dtype=np.float64)
    except (TypeError, ValueError):
        raise _bad(TRAJECTORY_SCHEMA, "poses and intrinsics must be numbers") from None
    try:
        return checked(p, k, "inline trajectory")
    except TrajectoryError as e:
        raise _bad(TRAJECTORY_SCHEMA, str(e)) from None


def _plain(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError("not a number")
    return x


class CameraTrajectoryReducer(ControlReducer):
    """A trajectory played block by block (see the module docstring)."""

    track, schema = TRAJECTORY_TRACK, TRAJECTORY_SCHEMA
    _MEMO = 8

    def __init__(self, frames_per_block: int, root: str | Path | None = None) -> None:
        self.frames_per_block = frames_per_block
        self.root = None if root is None else Path(root)
        self._playing: Trajectory | None = None
        self._cursor = 0
        # Files loaded by validate, reused by prepare (a memo, not session state).
        self._loaded: OrderedDict[str, Trajectory] = OrderedDict()

    def _named(self, name: Any) -> Trajectory:
        if self.root is None:
            raise _bad(self.schema, "named trajectories need the server's --trajectory-root")
        if isinstance(name, str) and name in self._loaded:
            self._loaded.move_to_end(name)
            return self._loaded[name]
        try:
            t = load_trajectory(self.root, name)
        except TrajectoryError as e:
            raise _bad(self.schema, str(e)) from None
        self._loaded[name] = t
        while len(self._loaded) > self._MEMO:
            self._loaded.popitem(last=False)
        return t

    def validate(self, data: FrozenDict) -> None:
        mode = data.get("mode")
        if mode == "inline":
            _fields(data, self.schema, "poses", "intrinsics")
            _inline(data)
        elif mode == "named":
            _fields(data, self.schema, "name")
            self._named(data["name"])
        elif mode == "stop":
            _fields(data, self.schema)
        else:
            raise _bad(self.schema, f"mode must be 'inline', 'named' or 'stop', got {shown(mode)}")

    def prepare(self, updates: Sequence[FrozenDict]) -> Prepared:
        playing, cursor = self._playing, self._cursor
        if updates:
            # Each update replaces the trajectory before it: only the tick's last one plays.
            data = updates[-1]
            mode = data["mode"]
            playing = None if mode == "stop" else _inline(data) if mode == "inline" else self._named(data["name"])
            cursor = 0
        if playing is None:
            return Prepared(value=None, next_state=(None, 0))
        n = self.frames_per_block
        idx = np.minimum(np.arange(cursor, cursor + n), playing.frames - 1)
        rel = playing.relative[idx]  # checked when the trajectory was accepted (trajectory_files)
        value = TrajectoryBlock(tuple(tuple(r.reshape(-1).tolist()) for r in rel),
                                tuple(tuple(k.tolist()) for k in playing.intrinsics[idx]),
                                starts=cursor == 0)
        cursor += n
        return Prepared(value=value, next_state=(playing, cursor) if cursor < playing.frames else (None, 0))

    def commit(self, prepared: Prepared) -> None:
        self._playing, self._cursor = prepared.next_state

    def reset(self) -> None:
        self._playing, self._cursor = None, 0

    @classmethod
    def encode_value(cls, value: TrajectoryBlock | None) -> Any:
        if value is None:
            return None
        return {"poses": [list(p) for p in value.poses],
                "intrinsics": [list(k) for k in value.intrinsics], "starts": value.starts}

    @classmethod
    def decode_value(cls, wire: Any) -> TrajectoryBlock | None:
        if wire is None:
            return None
        return TrajectoryBlock(tuple(tuple(float(x) for x in p) for p in wire["poses"]),
                               tuple(tuple(float(x) for x in k) for k in wire["intrinsics"]),
                               bool(wire["starts"]))


def lingbot_reducers(frames_per_block: int, trajectory_root: str | Path | None = None
                     ) -> dict[str, ControlReducer]:
    """Fresh reducers for one LingBot session."""
    return {ACTIONS_TRACK: CameraActionsReducer(frames_per_block),
            TRAJECTORY_TRACK: CameraTrajectoryReducer(frames_per_block, trajectory_root)}
