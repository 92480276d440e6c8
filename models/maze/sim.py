"""A batched first-person raycast maze, rendered in torch (CPU or CUDA).

One ``MazeSim`` holds ``B`` independent mazes and their cameras as tensors, so a
whole batch moves and renders in a handful of tensor ops: the data for training
is made on the GPU beside the model, and the CPU tests use the same code.

Geometry
--------
A maze is an ``n x n`` grid (``n`` odd, 15 by default): cell value 0 is floor,
1..7 a wall of that palette colour. Corridors sit on odd coordinates; a DFS
carves a perfect maze and ``extra`` of the remaining inner walls are knocked out
so there are loops. The camera stands at a float ``(x, y)`` in grid units with a
``yaw`` (radians, 0 = +x) and an integer ``pitch`` (rows the horizon moves).

Actions are 8 bits per frame in ``protocols.world_v1.KEY_NAMES`` order::

    W A S D   move forward / strafe left / move back / strafe right
    I J K L   pitch up / turn left / pitch down / turn right

A move is split into its x and y parts and each part is kept only if the point
``COLLIDE_RADIUS`` ahead of the camera in that direction is floor: walking
straight into a wall stops, walking at it slantwise slides along it.

Rendering (64 x 64 RGB uint8 by default; ``height`` and ``width`` render the same view
larger, e.g. 480 x 832 for codec benchmarks, with pitch in rows scaled to the height and the
default size bit-identical to what the maze world was trained on): one DDA ray per column finds the first wall cell;
walls carry four vertical stripes per cell face and are darker on y-faces;
floor and ceiling are cast per pixel, the floor as a 2x2-per-cell checkerboard
so that strafing shows parallax. Everything dims with distance.

Goals (``goals.py``): ``MazeSim(seeds, goals=[GoalEpisode, ...])`` paints goal
walls or floor markers and their sky beacons over the same render; without
``goals`` nothing of that runs and every frame is bit-identical to the goal-less
simulator the world model was trained on.

Determinism: a maze, start pose and yaw depend only on the maze seed (Python's
``random.Random``), so the same seed gives the same world on any device. Frames
are bit-identical for the same seed and actions on the same device; CPU and CUDA
may differ in a few edge pixels (float rounding in the ray march).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from models.maze.goals import COLOUR_NAMES, GOAL_COLOURS, WALL_REACH, GoalEpisode

H = W = 64
FPS = 15.0           # the nominal frame rate (0.11 cells forward, 6 degrees of turn per frame)
FOV = math.radians(66.0)
MOVE = 0.11          # grid units per frame, forward/back
STRAFE = 0.09        # grid units per frame, sideways
TURN = math.radians(6.0)
PITCH_STEP = 3       # horizon rows per frame
PITCH_MAX = 12
COLLIDE_RADIUS = 0.2
MAZE_CELLS = 15
EXTRA_OPENINGS = 0.12

# Wall colours (index 1..7 in the grid), floor and ceiling, in 0..255.
PALETTE = (
    (200, 60, 60), (60, 160, 70), (70, 90, 200), (210, 180, 60),
    (160, 80, 170), (60, 170, 170), (220, 130, 60),
)
FLOOR_RGB = (90, 80, 70)
FLOOR_CHECK = 40
CEIL_RGB = (120, 140, 170)

# Action bit indices (KEY_NAMES order: w a s d i j k l).
KW, KA, KS, KD, KI, KJ, KK, KL = range(8)


def make_maze(seed: int, n: int = MAZE_CELLS, extra: float = EXTRA_OPENINGS) -> tuple[list[list[int]], tuple[float, float], float]:
    """One maze from ``seed``: the grid (rows of ints), a start ``(x, y)`` in a floor cell's centre, a yaw.

    Pure Python and ``random.Random(seed)``: the same seed gives the same maze
    everywhere. ~50 us per maze, so a few thousand per second on one core.
    """
    rng = random.Random(seed)
    g = [[1] * n for _ in range(n)]
    g[1][1] = 0
    stack = [(1, 1)]
    while stack:
        y, x = stack[-1]
        nbs = [(y + dy, x + dx) for dy, dx in ((2, 0), (-2, 0), (0, 2), (0, -2))
               if 0 < y + dy < n - 1 and 0 < x + dx < n - 1 and g[y + dy][x + dx]]
        if not nbs:
            stack.pop()
            continue
        ny, nx = nbs[rng.randrange(len(nbs))]
        g[(y + ny) // 2][(x + nx) // 2] = 0
        g[ny][nx] = 0
        stack.append((ny, nx))
    for y in range(1, n - 1):
        for x in range(1, n - 1):
            if g[y][x] and rng.random() < extra:
                g[y][x] = 0
    grid = [[rng.randrange(1, len(PALETTE) + 1) if g[y][x] else 0 for x in range(n)] for y in range(n)]
    free = [(x, y) for y in range(n) for x in range(n) if grid[y][x] == 0]
    sx, sy = free[rng.randrange(len(free))]
    yaw = rng.uniform(-math.pi, math.pi)
    return grid, (sx + 0.5, sy + 0.5), yaw


@dataclass
class SimState:
    """A copy of the cameras (the grids never change), for counterfactual rollouts."""

    pos: torch.Tensor
    yaw: torch.Tensor
    pitch: torch.Tensor


class MazeSim:
    """``B`` mazes and cameras on one device. ``step`` moves, ``render`` draws."""

    def __init__(self, seeds: list[int], device: str | torch.device = "cpu", n: int = MAZE_CELLS,
                 goals: list[GoalEpisode] | None = None, height: int = H, width: int = W) -> None:
        self.device = torch.device(device)
        self.height, self.width = height, width
        self.n = n
        self.seeds = list(seeds)
        grids, pos, yaw = [], [], []
        for s in self.seeds:
            g, p, a = make_maze(int(s), n)
            grids.append(g)
            pos.append(p)
            yaw.append(a)
        self.grid = torch.tensor(grids, dtype=torch.int64, device=self.device)  # [B, n, n]
        self.pos = torch.tensor(pos, dtype=torch.float32, device=self.device)   # [B, 2] (x, y)
        self.yaw = torch.tensor(yaw, dtype=torch.float32, device=self.device)   # [B]
        self.pitch = torch.zeros(len(self.seeds), dtype=torch.int64, device=self.device)
        self._b = torch.arange(len(self.seeds), device=self.device)
        pal = torch.tensor(PALETTE, dtype=torch.float32, device=self.device)
        self._palette = torch.cat([pal[:1], pal], 0)  # index 0 unused (floor)
        cam = (torch.arange(width, dtype=torch.float32, device=self.device) + 0.5) / width * 2 - 1
        self._ray_offset = torch.atan(cam * math.tan(FOV / 2))  # [W] angle of each column
        self._rows = torch.arange(height, dtype=torch.float32, device=self.device) + 0.5
        self.goals = None if goals is None else list(goals)
        if self.goals is not None:
            self._init_goals()

    def _init_goals(self) -> None:
        goals = self.goals
        assert goals is not None
        if len(goals) != self.batch or any(g.seed != s for g, s in zip(goals, self.seeds)):
            raise ValueError("goals must be one GoalEpisode per maze, for the same seeds in the same order")
        dev, n, B = self.device, self.n, self.batch
        self.goal_cells = torch.tensor([g.cells for g in goals], dtype=torch.int64, device=dev)   # [B, 3, 2]
        self.goal_target = torch.tensor([g.target for g in goals], dtype=torch.int64, device=dev)
        self.goal_is_wall = torch.tensor([g.kind == "wall" for g in goals], device=dev)
        self._goal_rgb = torch.tensor([GOAL_COLOURS[c] for c in COLOUR_NAMES], dtype=torch.float32, device=dev)
        # Per cell: 0, or 1 + the colour index of the goal wall / marker there.
        paint = torch.zeros(B, n, n, dtype=torch.int64, device=dev)
        b = self._b[:, None].expand(B, len(COLOUR_NAMES))
        colour = torch.arange(1, len(COLOUR_NAMES) + 1, device=dev)[None].expand(B, -1)
        paint[b, self.goal_cells[..., 1], self.goal_cells[..., 0]] = colour
        self._goal_wall = torch.where(self.goal_is_wall[:, None, None], paint, 0)
        self._goal_floor = torch.where(self.goal_is_wall[:, None, None], 0, paint)

    def reached(self) -> torch.Tensor:
        """[B] bool: each camera has reached its target goal (``goals.py``'s rule)."""
        return self.reached_objects()[self._b, self.goal_target]

    def reached_objects(self) -> torch.Tensor:
        """[B, 3] bool: each camera is at each of its goal objects (``goals.py``'s rule), the
        target and the distractors alike."""
        if self.goals is None:
            raise ValueError("this MazeSim has no goals")
        cells = self.goal_cells.float()                                      # [B, 3, 2]
        pos = self.pos[:, None]
        on_cell = (pos.floor() == cells).all(2)
        gap = torch.maximum(cells - pos, pos - (cells + 1)).clamp_min(0)
        near = gap.square().sum(2).sqrt() <= WALL_REACH
        return torch.where(self.goal_is_wall[:, None], near, on_cell)

    @property
    def target_cell(self) -> torch.Tensor:
        """[B, 2] (x, y) int64: each camera's target goal cell."""
        if self.goals is None:
            raise ValueError("this MazeSim has no goals")
        return self.goal_cells[self._b, self.goal_target]

    def object_bearings(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Where each goal object's cell centre is from each camera: its bearing from the heading
        (radians in [-pi, pi), positive to the right, the way L turns) and its distance in cells,
        each [B, 3] (``COLOUR_NAMES`` order)."""
        if self.goals is None:
            raise ValueError("this MazeSim has no goals")
        rel = self.goal_cells.float() + 0.5 - self.pos[:, None]
        bearing = torch.remainder(torch.atan2(rel[..., 1], rel[..., 0]) - self.yaw[:, None] + torch.pi,
                                  2 * torch.pi) - torch.pi
        return bearing, rel.norm(dim=-1)

    def target_bearing(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``object_bearings`` of each camera's target, each [B]."""
        bearing, distance = self.object_bearings()
        return bearing[self._b, self.goal_target], distance[self._b, self.goal_target]

    @property
    def batch(self) -> int:
        return len(self.seeds)

    def state(self) -> SimState:
        return SimState(self.pos.clone(), self.yaw.clone(), self.pitch.clone())

    def set_state(self, s: SimState) -> None:
        self.pos, self.yaw, self.pitch = s.pos.clone(), s.yaw.clone(), s.pitch.clone()

    def _is_floor(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        xi = x.floor().long().clamp(0, self.n - 1)
        yi = y.floor().long().clamp(0, self.n - 1)
        return self.grid[self._b, yi, xi] == 0

    def step(self, actions: torch.Tensor) -> None:
        """Apply one frame of held keys, ``actions`` [B, 8] (bool or 0/1)."""
        a = actions.to(self.device, torch.float32)
        self.yaw = self.yaw + TURN * (a[:, KL] - a[:, KJ])
        self.pitch = (self.pitch + PITCH_STEP * (a[:, KI] - a[:, KK]).long()).clamp(-PITCH_MAX, PITCH_MAX)
        fwd = MOVE * (a[:, KW] - a[:, KS])
        side = STRAFE * (a[:, KD] - a[:, KA])
        c, s = torch.cos(self.yaw), torch.sin(self.yaw)
        dx = fwd * c - side * s
        dy = fwd * s + side * c
        x, y = self.pos[:, 0], self.pos[:, 1]
        nx = x + dx
        x = torch.where(self._is_floor(nx + torch.sign(dx) * COLLIDE_RADIUS, y), nx, x)
        ny = y + dy
        y = torch.where(self._is_floor(x, ny + torch.sign(dy) * COLLIDE_RADIUS), ny, y)
        self.pos = torch.stack([x, y], 1)

    def render(self) -> torch.Tensor:
        """The current view of every camera, [B, height, width, 3] uint8 on the sim's device."""
        B, n, H, W = self.batch, self.n, self.height, self.width
        ang = self.yaw[:, None] + self._ray_offset[None]                    # [B, W]
        rdx, rdy = torch.cos(ang), torch.sin(ang)
        px, py = self.pos[:, :1], self.pos[:, 1:]                            # [B, 1]
        mx = px.floor().long().expand(B, W).clone()
        my = py.floor().long().expand(B, W).clone()
        ddx = 1.0 / rdx.abs().clamp_min(1e-9)
        ddy = 1.0 / rdy.abs().clamp_min(1e-9)
        sx = torch.where(rdx < 0, -1, 1)
        sy = torch.where(rdy < 0, -1, 1)
        sdx = torch.where(rdx < 0, (px - mx) * ddx, (mx + 1 - px) * ddx)
        sdy = torch.where(rdy < 0, (py - my) * ddy, (my + 1 - py) * ddy)
        hit = torch.zeros(B, W, dtype=torch.bool, device=self.device)
        side = torch.zeros(B, W, dtype=torch.bool, device=self.device)
        col = torch.ones(B, W, dtype=torch.int64, device=self.device)
        bi = self._b[:, None].expand(B, W)
        # The outer ring is all wall, so 2n DDA steps always reach one; a fixed
        # count keeps the loop free of host syncs on CUDA.
        for _ in range(2 * n):
            live = ~hit
            stepx = sdx < sdy
            adv_x = live & stepx
            adv_y = live & ~stepx
            sdx = torch.where(adv_x, sdx + ddx, sdx)
            mx = torch.where(adv_x, mx + sx, mx)
            sdy = torch.where(adv_y, sdy + ddy, sdy)
            my = torch.where(adv_y, my + sy, my)
            side = torch.where(live, ~stepx, side)
            cell = self.grid[bi, my.clamp(0, n - 1), mx.clamp(0, n - 1)]
            new = live & (cell > 0)
            col = torch.where(new, cell, col)
            hit = hit | new
        dist = torch.where(side, sdy - ddy, sdx - ddx)
        cos_off = torch.cos(self._ray_offset)[None]                          # [1, W]
        perp = (dist * cos_off).clamp_min(1e-3)
        wallx = torch.where(side, px + dist * rdx, py + dist * rdy)
        wallx = wallx - wallx.floor()
        line_h = H / perp                                                    # [B, W]
        horizon = H / 2 + self.pitch.float()[:, None] * (H / 64)             # [B, 1]
        rows = self._rows[None, :, None]                                     # [1, H, 1]
        top = horizon[:, :, None] - line_h[:, None, :] / 2
        bot = horizon[:, :, None] + line_h[:, None, :] / 2
        is_wall = (rows >= top) & (rows < bot)                               # [B, H, W]
        stripe = 0.75 + 0.25 * torch.remainder(torch.floor(wallx * 4), 2)
        shade = torch.where(side, 0.7, 1.0) * stripe / (1 + 0.08 * perp)    # [B, W]
        wall_rgb = self._palette[col] * shade[..., None]                     # [B, W, 3]
        # Floor/ceiling: the row's distance along the view axis, then the hit point.
        dyr = (self._rows[None, :] - horizon).abs() + 1e-3                  # [B, H]
        row_dist = (H / 2) / dyr
        along = row_dist[:, :, None] / cos_off[:, None, :]                  # [B, H, W]
        fx = px[:, :, None] + along * rdx[:, None, :]
        fy = py[:, :, None] + along * rdy[:, None, :]
        checker = torch.remainder(torch.floor(fx * 2) + torch.floor(fy * 2), 2)
        att = (1 + 0.05 * row_dist)[:, :, None, None]                        # [B, H, 1, 1]
        floor_base = torch.tensor(FLOOR_RGB, dtype=torch.float32, device=self.device)
        ceil_base = torch.tensor(CEIL_RGB, dtype=torch.float32, device=self.device)
        floor_rgb = (floor_base + FLOOR_CHECK * checker[..., None]) / att
        ceil_rgb = ceil_base / att
        below = (self._rows[None, :] >= horizon)[:, :, None, None]           # [B, H, 1, 1]
        bg = torch.where(below, floor_rgb, ceil_rgb)
        if self.goals is not None:
            gw = self._goal_wall[bi, my.clamp(0, n - 1), mx.clamp(0, n - 1)]  # [B, W] hit cell's paint
            flat = self._goal_rgb[(gw - 1).clamp_min(0)] * torch.where(side, 0.85, 1.0)[..., None]
            wall_rgb = torch.where((gw > 0)[..., None], flat, wall_rgb)
            fxi = fx.floor().long().clamp(0, n - 1)
            fyi = fy.floor().long().clamp(0, n - 1)
            gf = self._goal_floor[self._b[:, None, None], fyi, fxi]          # [B, H, W]
            tile = self._goal_rgb[(gf - 1).clamp_min(0)] / att
            floor_rgb = torch.where((gf > 0)[..., None], tile, floor_rgb)
            bg = torch.where(below, floor_rgb, ceil_rgb)
            bg = self._beacons(bg, below, is_wall)
        img = torch.where(is_wall[..., None], wall_rgb[:, None, :, :], bg)
        return img.clamp(0, 255).round().to(torch.uint8)

    def _beacons(self, bg: torch.Tensor, below: torch.Tensor, is_wall: torch.Tensor) -> torch.Tensor:
        """Paint each goal's beacon: a band of its colour on the ceiling pixels in its direction.

        The goal's centre in camera space gives its depth and its screen column
        (the inverse of the per-column ray angle); the band is wider when nearer.
        """
        centre = self.goal_cells.float() + 0.5                              # [B, 3, 2]
        rel = centre - self.pos[:, None]
        c, s = torch.cos(self.yaw)[:, None], torch.sin(self.yaw)[:, None]
        depth = rel[..., 0] * c + rel[..., 1] * s                            # [B, 3]
        lateral = -rel[..., 0] * s + rel[..., 1] * c
        cam = lateral / depth.clamp_min(1e-3) / math.tan(FOV / 2)
        W = self.width
        column = (cam + 1) / 2 * W                                           # [B, 3]
        half = (1.5 * W / 64 / depth.clamp_min(0.3) * 4).clamp(W / 64, 6.0 * W / 64)
        cols = torch.arange(W, dtype=torch.float32, device=self.device) + 0.5
        sky = ~below[..., 0] & ~is_wall                                      # [B, height, width]
        for j in range(len(COLOUR_NAMES)):
            band = (depth[:, j, None] > 0.05) & ((cols[None] - column[:, j, None]).abs() < half[:, j, None])
            paint = sky & band[:, None, :]
            bg = torch.where(paint[..., None], self._goal_rgb[j], bg)
        return bg
