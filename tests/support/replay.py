"""Playing world ticks through an adapter and comparing the frames: the replay tests' shared steps."""

from __future__ import annotations

import numpy as np

from models.world.base import WorldAdapter, WorldTick


def play(w: WorldAdapter, batches: list[list[WorldTick]]) -> dict[str, list[np.ndarray]]:
    """Run each batch and commit it; each session's frames, in order."""
    out: dict[str, list[np.ndarray]] = {}
    for batch in batches:
        for c in w.run_batch(batch):
            w.end_tick(c.session_id, True)
            out.setdefault(c.session_id, []).append(c.frames)
    return out


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    """Both runs made the same frames, bit for bit."""
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
