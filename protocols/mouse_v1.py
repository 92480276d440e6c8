"""mouse.v1: per-frame mouse-look deltas, a world.v1 control (see docs/protocols.md).

A control ``{"track": "mouse", "schema": "mouse.v1", "data": {"deltas": [[yaw, pitch], ...]}}``
queues one ``[yaw, pitch]`` pair per generated frame, played in order from the next chunk on;
a frame with nothing queued has no mouse motion. Yaw is positive to the right, pitch positive
up, in the model's own units per frame (Matrix-Game 2.0: 0.1 is what one held look key gives).
Each value is a finite number with ``|value| <= MAX_DELTA``; an event carries 1 to
``MAX_FRAMES_PER_EVENT`` pairs. Only models that list ``mouse.v1`` in ``control_schemas``
take it. This module parses and builds; the session's reducer owns the queue.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Sequence

from protocols.world_v1 import Control

MOUSE_TRACK = "mouse"
MOUSE_SCHEMA = "mouse.v1"
MAX_DELTA = 1.0
MAX_FRAMES_PER_EVENT = 256


class MouseError(ValueError):
    """A mouse.v1 data object that breaks a rule (the message names it)."""


def parse_deltas(data: Any) -> tuple[tuple[float, float], ...]:
    """``data`` -> the ``(yaw, pitch)`` pairs it queues, or ``MouseError`` naming the problem."""
    if not isinstance(data, Mapping) or set(data) != {"deltas"}:
        fields = sorted(data) if isinstance(data, Mapping) else type(data).__name__
        raise MouseError(f"data must be an object with exactly 'deltas', got {fields}")
    deltas = data["deltas"]
    if not isinstance(deltas, (list, tuple)) or not 1 <= len(deltas) <= MAX_FRAMES_PER_EVENT:
        raise MouseError(f"deltas must be a list of 1..{MAX_FRAMES_PER_EVENT} [yaw, pitch] pairs")
    out = []
    for i, pair in enumerate(deltas):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise MouseError(f"deltas[{i}] must be a [yaw, pitch] pair")
        for name, x in zip(("yaw", "pitch"), pair):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                raise MouseError(f"deltas[{i}] {name} must be a finite number")
            if abs(x) > MAX_DELTA:
                raise MouseError(f"deltas[{i}] {name} {x} is outside [-{MAX_DELTA}, {MAX_DELTA}]")
        out.append((float(pair[0]), float(pair[1])))
    return tuple(out)


def mouse_control(deltas: Sequence[Sequence[float]]) -> Control:
    """One ``mouse.v1`` control of an event."""
    return Control(MOUSE_TRACK, MOUSE_SCHEMA, {"deltas": [list(map(float, d)) for d in deltas]})
