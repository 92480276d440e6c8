"""Matrix-Game's controls: keys.v1 and mouse.v1 as the variant's keyboard and mouse vectors.

Per video frame the model reads a keyboard vector (one entry per key of the variant) and,
except Temple Run, a mouse vector ``[pitch, yaw]``. keys.v1 key sets map to them as upstream's
interactive mode does (``get_current_action``), and mouse.v1 deltas add to the mouse::

    variant     keyboard vector                              look keys (mouse, per frame)
    universal   W forward, S back, A left, D right            I/K pitch +-0.1, J/L yaw -+0.1
    gta_drive   W forward, S back                              A/D and J/L yaw -+0.1 (steer),
                                                               I/K pitch +-0.1
    templerun   none held: no move (entry 0); W jump, S slide, (no mouse)
                J turn left, L turn right, A left side, D right side

A key the variant does not read (I or K in Temple Run) is refused with the keys.v1 error,
naming the keys it takes, before the event is accepted; the session's controls are unchanged.
mouse.v1 (``protocols/mouse_v1.py``) is offered only by the variants with a mouse; a frame's
mouse is its queued delta plus its look keys, clamped to ``protocols.mouse_v1.MAX_DELTA``.
"""

from __future__ import annotations

from typing import Sequence

import torch

from protocols.echo import shown
from protocols.mouse_v1 import MAX_DELTA, MOUSE_SCHEMA, MOUSE_TRACK, MouseError, parse_deltas
from sessions.errors import ErrorCode, SessionError
from sessions.frozen import FrozenDict
from sessions.reducers import ControlReducer, KeysReducer, Prepared

LOOK = 0.1     # upstream's CAM_VALUE: one held look key's delta per frame
MAX_SCRIPT_FRAMES = 4096

# variant -> key -> keyboard entry; ``NO_MOVE``: the entry set when no key is held.
KEYBOARD: dict[str, dict[str, int]] = {
    "universal": {"w": 0, "s": 1, "a": 2, "d": 3},
    "gta_drive": {"w": 0, "s": 1},
    "templerun": {"w": 1, "s": 2, "j": 3, "l": 4, "a": 5, "d": 6},
}
NO_MOVE: dict[str, int | None] = {"universal": None, "gta_drive": None, "templerun": 0}
# variant -> key -> (yaw, pitch) per frame.
LOOK_KEYS: dict[str, dict[str, tuple[float, float]]] = {
    "universal": {"i": (0.0, LOOK), "k": (0.0, -LOOK), "j": (-LOOK, 0.0), "l": (LOOK, 0.0)},
    "gta_drive": {"i": (0.0, LOOK), "k": (0.0, -LOOK), "j": (-LOOK, 0.0), "l": (LOOK, 0.0),
                  "a": (-LOOK, 0.0), "d": (LOOK, 0.0)},
    "templerun": {},
}


def variant_keys(variant: str) -> tuple[str, ...]:
    """The keys.v1 keys the variant reads, in keys.v1 order."""
    from protocols.world_v1 import KEY_NAMES

    taken = set(KEYBOARD[variant]) | set(LOOK_KEYS[variant])
    return tuple(k for k in KEY_NAMES if k in taken)


def keyboard_vectors(variant: str, actions: Sequence[frozenset[str]], keys: int) -> torch.Tensor:
    """``[frames, keys]``: each frame's key set as the variant's keyboard vector."""
    table, none = KEYBOARD[variant], NO_MOVE[variant]
    out = torch.zeros(len(actions), keys)
    for f, held in enumerate(actions):
        idx = [table[k] for k in held if k in table]
        if idx:
            out[f, idx] = 1.0
        elif none is not None:
            out[f, none] = 1.0
    return out


def mouse_vectors(variant: str, actions: Sequence[frozenset[str]],
                  deltas: Sequence[tuple[float, float]] | None) -> torch.Tensor:
    """``[frames, 2]`` as the model reads it, ``[pitch, yaw]``: look keys plus mouse.v1 deltas."""
    look = LOOK_KEYS[variant]
    out = torch.zeros(len(actions), 2, dtype=torch.float64)
    for f, held in enumerate(actions):
        yaw = sum(look[k][0] for k in held if k in look)
        pitch = sum(look[k][1] for k in held if k in look)
        if deltas is not None:
            yaw, pitch = yaw + deltas[f][0], pitch + deltas[f][1]
        out[f, 0], out[f, 1] = pitch, yaw
    return out.clamp(-MAX_DELTA, MAX_DELTA).float()


class VariantKeysReducer(KeysReducer):
    """keys.v1 restricted to the keys the variant reads (see the module docstring)."""

    def __init__(self, frames_per_chunk: int, variant: str) -> None:
        super().__init__(frames_per_chunk)
        self.variant = variant
        self.keys = frozenset(variant_keys(variant))

    def validate(self, data: FrozenDict) -> None:
        super().validate(data)
        sets = [data["held"]] if data["mode"] == "state" else list(data["frames"])
        for keys in sets:
            for key in keys:
                if key.lower() not in self.keys:
                    raise SessionError(ErrorCode.BAD_REQUEST,
                                       f"keys.v1: key {shown(key)} does nothing in matrix-game "
                                       f"{self.variant}; it takes {', '.join(variant_keys(self.variant))}")


class MouseReducer(ControlReducer):
    """mouse.v1: queued per-frame deltas; a tick's value is one ``(yaw, pitch)`` per frame
    (``(0, 0)`` where nothing is queued). The queue is consumed only when the tick commits."""

    track, schema = MOUSE_TRACK, MOUSE_SCHEMA

    def __init__(self, frames_per_chunk: int, *, max_script_frames: int = MAX_SCRIPT_FRAMES) -> None:
        self.frames_per_chunk = frames_per_chunk
        self.max_script_frames = max_script_frames
        self._queue: tuple[tuple[float, float], ...] = ()

    def validate(self, data: FrozenDict) -> None:
        try:
            parse_deltas(data)
        except MouseError as e:
            raise SessionError(ErrorCode.BAD_REQUEST, f"mouse.v1: {e}") from None

    def admit(self, updates: Sequence[FrozenDict]) -> None:
        backlog = len(self._queue) + sum(len(u["deltas"]) for u in updates)
        if backlog > self.max_script_frames:
            raise SessionError(ErrorCode.QUEUE_FULL, f"mouse.v1: backlog would be {backlog} frames, "
                                                     f"at most {self.max_script_frames}")

    def prepare(self, updates: Sequence[FrozenDict]) -> Prepared:
        queue = self._queue
        for data in updates:
            queue = queue + parse_deltas(data)
        n = self.frames_per_chunk
        now = queue[:n]
        value = now + ((0.0, 0.0),) * (n - len(now))
        return Prepared(value=value, next_state=queue[len(now):])

    def commit(self, prepared: Prepared) -> None:
        self._queue = prepared.next_state

    def reset(self) -> None:
        self._queue = ()
