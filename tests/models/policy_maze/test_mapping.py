"""The ``map`` state layout: the robot's map as seen, turned to its heading, and the planner that reads it."""

import math

import torch

from models.maze.planner import goal_seeds
from models.maze.seen_map import MAP_RADIUS, MAP_SIDE, heading_window
from models.policy.maze.episodes import Episodes
from models.policy.maze.map_planner import neighbour_max
from models.policy.maze.model import STATE_LAYOUTS, MazeFlowModel, config

_AHEAD = ((1, 0), (0, 1), (-1, 0), (0, -1))
_RIGHT = ((0, 1), (-1, 0), (0, -1), (1, 0))


def _argmax_cell(window: torch.Tensor) -> tuple[int, int]:
    i, j = divmod(int(window.flatten().argmax()), MAP_SIDE)
    return i - MAP_RADIUS, j - MAP_RADIUS


def test_the_window_puts_ahead_along_columns_and_right_along_rows_for_every_quarter() -> None:
    for q in range(4):
        (ax, ay), (rx, ry) = _AHEAD[q], _RIGHT[q]
        cells = torch.zeros(1, 1, 15, 15)
        cells[0, 0, 7 + 3 * ay + 2 * ry, 7 + 3 * ax + 2 * rx] = 1  # 3 ahead, 2 to the right
        yaw = torch.tensor([q * math.pi / 2 + 0.3])                  # within 45 degrees of the quarter
        assert _argmax_cell(heading_window(cells, torch.tensor([[7.5, 7.5]]), yaw)) == (2, 3)


def test_the_map_grows_only_with_what_was_seen_and_the_state_has_the_layouts_width() -> None:
    ep = Episodes(goal_seeds(0, 3), "marker", layout="map")
    _, state = ep.observe()
    assert state.shape == (3, STATE_LAYOUTS["map"])
    seen0 = ep.map.seen.clone()
    for _ in range(12):
        ep.step(torch.tensor([[1.0, 0, 0, 0, 0, 0, 0, 1.0]] * 3))
    assert bool((ep.map.seen >= seen0).all()) and bool((ep.map.seen.sum((1, 2)) >= seen0.sum((1, 2))).all())
    # A seen cell is a wall or a floor, never both.
    cells = ep.map.cells()
    assert bool(((cells[:, 0] + cells[:, 1]) <= 1).all())
    assert bool(((cells[:, 0] + cells[:, 1])[ep.map.seen] == 1).all())


def test_neighbour_max_takes_the_four_grid_neighbours_only() -> None:
    v = torch.zeros(1, 1, 5, 5)
    v[0, 0, 2, 2] = 1.0
    out = neighbour_max(v)[0, 0]
    assert out[1, 2] == out[3, 2] == out[2, 1] == out[2, 3] == 1.0
    assert out[1, 1] == out[2, 2] == 0.0


def test_a_map_policy_runs_and_is_deterministic_for_fixed_noise() -> None:
    torch.manual_seed(0)
    model = MazeFlowModel(config("map", d_model=32, num_heads=2, num_layers=1), prompt_film=True).eval()
    assert model.state_layout == "map"
    ep = Episodes(goal_seeds(0, 2), "wall", layout="map")
    image, state = ep.observe()
    ids, offsets = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 2])
    noise = torch.randn(2, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = model.sample(noise, model.encode(image[:, None], state, ids, offsets), 3)
        b = model.sample(noise, model.encode(image[:, None], state, ids, offsets), 3)
    assert a.shape == (2, 8, 8) and torch.equal(a, b)
