"""The maze robot's map as seen: cells it has looked down, goal objects whose beacons it has seen.

The maze policy's ``map`` state layout (``models/policy/maze/model.py``) sends this map with every observation. It is
what the scanner teacher (``models/maze/scanner.py``) decides from, kept by the
robot from its own looks, never the maze's true map:

* **seen cells**: after every frame, from the cell it stands in, each straight corridor
  up to and including the first wall, in the four grid directions (``corridor_view``,
  the scanner's look);
* **goal objects**: each of the three (one per colour) once its beacon, which is drawn
  above the walls, has been within the camera's field of view; from then on the map
  holds that object's cell (a goal wall as a wall).

Sent turned to the heading (``heading_window``): a ``MAP_SIDE`` x ``MAP_SIDE`` window of
cells centred on the robot's, rotated by the quarter turn nearest the heading so that
column + is ahead and row + is to the right (the way L turns). The rest of the
heading, within +-45 degrees, and the robot's offset from its cell's centre in the
same frame go beside it (``MAP_POSE``). Channels, 0/1 per cell, in this order::

    wall seen, floor seen, red object, yellow object, blue object

Cells beyond the maze read 0 (unknown), as do cells not seen yet.

The ``maze-sim`` world sends the same floats in each chunk's ``info`` (``map_info``:
the pose as JSON numbers, the 0/1 cells bit-packed in base64), so a robot driving it
over world.v1, such as the demo page, sends exactly the state ``Episodes`` builds.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
import torch

from models.maze.goals import COLOUR_NAMES
from models.maze.scanner import corridor_view
from models.maze.sim import FOV, MAZE_CELLS, MazeSim

MAP_RADIUS = MAZE_CELLS - 1              # cells each side of the robot's: any cell of the maze is in view
MAP_SIDE = 2 * MAP_RADIUS + 1
MAP_CHANNELS = 2 + len(COLOUR_NAMES)     # wall, floor, one per goal colour
MAP_POSE = 4                             # cos / sin of the heading's rest, offset in the cell (ahead, right)
MAP_FLOATS = MAP_POSE + MAP_CHANNELS * MAP_SIDE * MAP_SIDE

# The quarter turns' "ahead" and "right" unit steps in grid (x, y); yaw 0 looks along +x and
# L turns towards +y.
_AHEAD = ((1, 0), (0, 1), (-1, 0), (0, -1))
_RIGHT = ((0, 1), (-1, 0), (0, -1), (1, 0))


def beacons_in_view(sim: MazeSim) -> torch.Tensor:
    """[B, 3] bool: each goal object's centre is within the camera's horizontal field of view
    (its beacon is then on screen; ``scanner.beacon_in_view`` is the target's column)."""
    return sim.object_bearings()[0].abs() < FOV / 2


def quarter(yaw: torch.Tensor) -> torch.Tensor:
    """[B] int64 in 0..3: the quarter turn nearest each heading."""
    return torch.remainder(torch.round(yaw / (math.pi / 2)).long(), 4)


def heading_window(cells: torch.Tensor, pos: torch.Tensor, yaw: torch.Tensor) -> torch.Tensor:
    """Per-cell maps [B, C, n, n] (rows y) -> [B, C, MAP_SIDE, MAP_SIDE] around each robot, turned
    to its heading: window [i, j] is the cell (j - R) ahead and (i - R) to the right of the robot's."""
    b, c, n, _ = cells.shape
    r = MAP_RADIUS
    dev = cells.device
    padded = torch.nn.functional.pad(cells, (r, r, r, r))                 # cell (x, y) at [y + r, x + r]
    here = pos.floor().long().clamp(0, n - 1)                              # [B, 2]
    q = quarter(yaw)
    ahead = torch.tensor(_AHEAD, device=dev)[q]                            # [B, 2]
    right = torch.tensor(_RIGHT, device=dev)[q]
    offs = torch.arange(MAP_SIDE, device=dev) - r
    a, s = offs[None, None, :], offs[None, :, None]                        # j - R ahead, i - R right
    x = here[:, 0, None, None] + a * ahead[:, 0, None, None] + s * right[:, 0, None, None] + r
    y = here[:, 1, None, None] + a * ahead[:, 1, None, None] + s * right[:, 1, None, None] + r
    out = padded[torch.arange(b, device=dev)[:, None, None], :, y, x]       # [B, S, S, C]
    return out.permute(0, 3, 1, 2)


def pose_in_map(pos: torch.Tensor, yaw: torch.Tensor) -> torch.Tensor:
    """[B, MAP_POSE]: cos / sin of the heading less its quarter turn, and the offset from the cell's
    centre along the window's ahead and right axes."""
    q = quarter(yaw)
    rest = yaw - q.float() * (math.pi / 2)
    rest = torch.remainder(rest + math.pi, 2 * math.pi) - math.pi
    off = pos - pos.floor() - 0.5
    ahead = torch.tensor(_AHEAD, dtype=pos.dtype, device=pos.device)[q]
    right = torch.tensor(_RIGHT, dtype=pos.dtype, device=pos.device)[q]
    return torch.stack([torch.cos(rest), torch.sin(rest), (off * ahead).sum(1), (off * right).sum(1)], 1)


class SeenMap:
    """What each robot of one ``MazeSim`` with goals has seen (see the module docstring)."""

    def __init__(self, sim: MazeSim) -> None:
        if sim.goals is None:
            raise ValueError("the map marks goal objects: it needs a MazeSim with goals")
        self.sim = sim
        B, n = sim.batch, sim.n
        self.seen = torch.zeros(B, n, n, dtype=torch.bool, device=sim.device)
        self.found = torch.zeros(B, len(COLOUR_NAMES), dtype=torch.bool, device=sim.device)
        self.look(torch.ones(B, dtype=torch.bool, device=sim.device))

    def look(self, live: torch.Tensor) -> None:
        """Add what the robots in ``live`` [B] bool see from where they stand now."""
        sim = self.sim
        here = sim.pos.floor().long().clamp(0, sim.n - 1)
        self.seen |= corridor_view(sim.grid, here) & live[:, None, None]
        self.found |= beacons_in_view(sim) & live[:, None]

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What has been seen so far, for ``restore`` (a tick that is not committed)."""
        return self.seen.clone(), self.found.clone()

    def restore(self, snapshot: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.seen, self.found = snapshot

    def cells(self) -> torch.Tensor:
        """[B, MAP_CHANNELS, n, n] float 0/1 in world axes (rows y)."""
        sim = self.sim
        wall = self.seen & (sim.grid > 0)
        floor = self.seen & (sim.grid == 0)
        B, n = sim.batch, sim.n
        objects = torch.zeros(B, len(COLOUR_NAMES), n, n, dtype=torch.bool, device=sim.device)
        colour = torch.arange(len(COLOUR_NAMES), device=sim.device)[None].expand(B, -1)
        b = sim._b[:, None].expand_as(colour)
        gx, gy = sim.goal_cells[..., 0], sim.goal_cells[..., 1]
        objects[b, colour, gy, gx] = self.found
        # A goal wall whose beacon was seen is known to be a wall.
        known_wall = (objects.any(1) & sim.goal_is_wall[:, None, None])
        return torch.cat([(wall | known_wall)[:, None], floor[:, None], objects], 1).float()

    def state(self) -> torch.Tensor:
        """[B, MAP_FLOATS] float32: ``pose_in_map``, then the egocentric window, channel-major."""
        sim = self.sim
        window = heading_window(self.cells(), sim.pos, sim.yaw)
        return torch.cat([pose_in_map(sim.pos, sim.yaw), window.flatten(1)], 1)


def map_info(state: torch.Tensor) -> dict[str, Any]:
    """One robot's ``SeenMap.state()`` row [MAP_FLOATS] as JSON: ``pose`` (MAP_POSE numbers, the
    float32 values exactly) and ``cells`` (the 0/1 window, channel-major, ``np.packbits`` order:
    the first cell is the first byte's highest bit; base64)."""
    row = state.detach().cpu().numpy().astype(np.float32)
    cells = row[MAP_POSE:]
    assert row.shape == (MAP_FLOATS,) and bool(((cells == 0) | (cells == 1)).all())
    return {"pose": [float(v) for v in row[:MAP_POSE]],
            "cells": base64.b64encode(np.packbits(cells.astype(np.uint8)).tobytes()).decode("ascii")}
