"""Goals in the maze: coloured goal walls or floor markers, seeded, with a sky beacon each.

A goal *episode* is a maze seed plus a goal kind. It holds three goal objects of
that kind, one per colour in ``GOAL_COLOURS``; the prompt names one of them, the
*target*, and the other two are distractors::

    kind "wall":    an inner wall cell beside a corridor, painted in the goal colour
                    (flat, undimmed, no stripes: unlike any palette wall)
    kind "marker":  a floor cell painted in the goal colour

Every goal object also shows a *beacon*: a vertical band of its colour drawn on
the ceiling pixels in its direction, so it can be seen above the walls from
anywhere in the maze (the policy has no map; the beacon is what makes "find" a
visual task rather than blind search).

Placement (``make_goals``) uses ``random.Random(f"goals:{seed}:{kind}")``,
independent of ``make_maze``'s stream, so mazes and starts are unchanged. The
target is at a shortest-path distance of ``MIN_PATH``..``MAX_PATH`` grid cells
from the start cell; the distractors are anywhere else.

Success (``reached``), checked after every frame:

* marker: the camera stands inside the target cell;
* wall:   the camera is within ``WALL_REACH`` grid units of the target wall
          cell's square (the closest a camera can get is ``COLLIDE_RADIUS`` = 0.2;
          the centre of the neighbouring floor cell is 0.5 away).
"""

from __future__ import annotations

import collections
import random
import re
from dataclasses import dataclass

GOAL_KINDS: tuple[str, ...] = ("wall", "marker")
# Saturated colours, brighter than any palette wall (max 220 per channel there).
GOAL_COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (255, 0, 40),
    "yellow": (255, 245, 0),
    "blue": (0, 120, 255),
}
COLOUR_NAMES: tuple[str, ...] = tuple(GOAL_COLOURS)
MIN_PATH = 4
MAX_PATH = 14
WALL_REACH = 0.6
# A few phrasings per kind; training samples them, the evaluation uses the first.
PROMPTS: dict[str, tuple[str, ...]] = {
    "wall": ("go to the {c} wall", "walk to the {c} wall", "find the {c} wall", "reach the {c} wall"),
    "marker": ("find the {c} marker", "go to the {c} marker", "walk to the {c} marker", "reach the {c} marker"),
}
_PROMPT_RE = re.compile(r"\b(" + "|".join(COLOUR_NAMES) + r")\s+(" + "|".join(GOAL_KINDS) + r")\b")

Cell = tuple[int, int]  # (x, y) grid indices


@dataclass(frozen=True)
class GoalEpisode:
    """One maze's goal objects of one kind and the target the prompt names."""

    seed: int
    kind: str
    cells: tuple[Cell, ...]        # one per colour, in COLOUR_NAMES order
    target: int                    # index into cells / COLOUR_NAMES

    @property
    def colour(self) -> str:
        return COLOUR_NAMES[self.target]

    @property
    def target_cell(self) -> Cell:
        return self.cells[self.target]

    def prompt(self, variant: int = 0) -> str:
        forms = PROMPTS[self.kind]
        return forms[variant % len(forms)].format(c=self.colour)


def parse_prompt(prompt: str) -> tuple[str, str]:
    """``"go to the red wall"`` -> ``("wall", "red")``; ``ValueError`` if it names no goal."""
    m = _PROMPT_RE.search(prompt.lower())
    if m is None:
        raise ValueError(f"prompt {prompt!r} names no goal (a colour of {list(COLOUR_NAMES)} "
                         f"then one of {list(GOAL_KINDS)})")
    return m.group(2), m.group(1)


def floor_distances(grid: list[list[int]], sources: list[Cell]) -> dict[Cell, int]:
    """Shortest 4-neighbour path length over floor cells from any of ``sources`` (BFS)."""
    n = len(grid)
    dist = {s: 0 for s in sources}
    queue = collections.deque(sources)
    while queue:
        x, y = queue.popleft()
        for nx, ny in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
            if 0 <= nx < n and 0 <= ny < n and grid[ny][nx] == 0 and (nx, ny) not in dist:
                dist[(nx, ny)] = dist[(x, y)] + 1
                queue.append((nx, ny))
    return dist


def approach_cells(grid: list[list[int]], kind: str, cell: Cell) -> list[Cell]:
    """The floor cells a planner steers to: the marker itself, or a wall's floor neighbours."""
    if kind == "marker":
        return [cell]
    n, (x, y) = len(grid), cell
    return [(nx, ny) for nx, ny in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1))
            if 0 <= nx < n and 0 <= ny < n and grid[ny][nx] == 0]


def make_goals(seed: int, kind: str, grid: list[list[int]], start: tuple[float, float],
               colour: str | None = None) -> GoalEpisode:
    """Place three goal objects of ``kind`` in the maze of ``seed`` (see the module docstring)."""
    if kind not in GOAL_KINDS:
        raise ValueError(f"goal kind must be one of {list(GOAL_KINDS)}, got {kind!r}")
    if colour is not None and colour not in GOAL_COLOURS:
        raise ValueError(f"goal colour must be one of {list(COLOUR_NAMES)}, got {colour!r}")
    rng = random.Random(f"goals:{seed}:{kind}")
    n = len(grid)
    s = (int(start[0]), int(start[1]))
    from_start = floor_distances(grid, [s])
    if kind == "marker":
        candidates = sorted(c for c in from_start if c != s)
        path = {c: from_start[c] for c in candidates}
    else:
        candidates = [(x, y) for y in range(1, n - 1) for x in range(1, n - 1)
                      if grid[y][x] and approach_cells(grid, kind, (x, y))]
        path = {c: 1 + min(from_start.get(a, 10**6) for a in approach_cells(grid, kind, c)) for c in candidates}
    near = [c for c in candidates if MIN_PATH <= path[c] <= MAX_PATH]
    if not near or len(candidates) < len(COLOUR_NAMES):
        # A few seeds start in a walled-in cell (an opening knocked into a pillar):
        # nothing to reach. ``goal_seeds`` skips them.
        raise ValueError(f"maze {seed} has no {kind} goal {MIN_PATH}-{MAX_PATH} cells from its start")
    target_colour = COLOUR_NAMES.index(colour) if colour is not None else rng.randrange(len(COLOUR_NAMES))
    target_cell = near[rng.randrange(len(near))]
    rest = [c for c in candidates if c != target_cell]
    others = rng.sample(rest, len(COLOUR_NAMES) - 1)
    cells = others[:target_colour] + [target_cell] + others[target_colour:]
    return GoalEpisode(seed, kind, tuple(cells), target_colour)


def has_goals(seed: int, grid: list[list[int]], start: tuple[float, float]) -> bool:
    """Whether both goal kinds can be placed in this maze (false for a walled-in start)."""
    try:
        for kind in GOAL_KINDS:
            make_goals(seed, kind, grid, start)
    except ValueError:
        return False
    return True


def reached(kind: str, cell: Cell, x: float, y: float) -> bool:
    """Whether a camera at ``(x, y)`` has reached the target (the module docstring's rule)."""
    cx, cy = cell
    if kind == "marker":
        return int(x // 1) == cx and int(y // 1) == cy
    dx = max(cx - x, 0.0, x - (cx + 1))
    dy = max(cy - y, 0.0, y - (cy + 1))
    return (dx * dx + dy * dy) ** 0.5 <= WALL_REACH
