"""The maze world's host path with a stand-in for the device: the H200's served tick on a CPU box.

On the H200 the maze's frame is one CUDA graph replay; what the engine thread does around it
(kv bookkeeping, batch assembly, the static buffers' copies, the chunks) is Python and small
torch ops, and the device time is a wait that holds no GIL. ``HostPathMaze`` is the real
``MazeWorld`` on CPU with the static-buffer frame path (``cuda_graphs=True``: no capture on CPU)
whose passes are replaced by that wait: the replay starts a device clock of
``base_ms + per_row_ms * rows`` (the bucket's rows) and ``generate`` ends when it runs out, as
the copy to the host would. What happens between the two (the chunks, ``_to_host``) overlaps
the wait as it does on the GPU. Frames are the sessions' sink frames' bytes (nothing is
computed), so this measures serving, never the model.

The default clock (6.5 ms + 0.27 ms per row: 6.8, 15.1 and 41.1 ms at 1, 32 and 128 rows) is
about the H200's bare maze tick (bench/results/world_serving_curve_h200.json: 6.9, 15.8 and
45.3 ms).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from models.world.base import WorldChunk, WorldTick
from models.world.maze.adapter import MazeWorld
from models.world.maze.frame_graph import FrameRunner

BASE_MS = 6.5
PER_ROW_MS = 0.27


class _WaitRunner(FrameRunner):
    """A ``FrameRunner`` whose passes are a device clock (see the module doc)."""

    def __init__(self, owner: "HostPathMaze", *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.owner = owner

    def _body(self) -> None:
        self.owner.device_until = time.perf_counter() + self.owner.device_s(self.rows)


class HostPathMaze(MazeWorld):
    """``MazeWorld`` on CPU, its frame passes replaced by a wait of the H200's length."""

    name = "maze"

    def __init__(self, base_ms: float = BASE_MS, per_row_ms: float = PER_ROW_MS, **kwargs: Any) -> None:
        self.base_s, self.per_row_s = base_ms / 1000.0, per_row_ms / 1000.0
        self.device_until = 0.0
        # The H200's sampler and window: the same kv bookkeeping per tick.
        kwargs.setdefault("steps", 4)
        kwargs.setdefault("window", 14)
        super().__init__(device="cpu", cuda_graphs=True, warm_up=False, **kwargs)

    def device_s(self, rows: int) -> float:
        return self.base_s + self.per_row_s * rows

    def _runner(self, rows: int) -> FrameRunner:
        r = self._runners.get(rows)
        if r is None:
            r = self._runners[rows] = _WaitRunner(self, self.model, self.cache, self.sampler, rows, self.dtype,
                                                  capture=False)
        return r

    def _start(self, ids: list[str], sessions: list[Any]) -> Any:
        # A session's first frame: the simulator's, its page allocated, no forward (the sink's
        # K/V is never read here).
        from models.maze.sim import MazeSim

        self._begin(ids)
        return MazeSim([s.seed for s in sessions], self.device).render().numpy()

    def generate(self, works: Sequence[WorldTick]) -> list[WorldChunk]:
        out = super().generate(works)
        # The device-to-host copy waits for the device (no GIL held, as cudaMemcpy).
        left = self.device_until - time.perf_counter()
        if left > 0:
            time.sleep(left)
        return out

    def details(self) -> dict[str, Any]:
        return {**super().details(), "stand_in": f"device passes replaced by a wait of "
                f"{1000 * self.base_s:g} + {1000 * self.per_row_s:g} ms per row (bench/world/host_maze.py)"}

