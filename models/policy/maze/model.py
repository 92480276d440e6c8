"""The maze policy network: ``flow.py``'s action expert behind a conv encoder for 64 x 64 frames.

    camera [B, 64, 64, 3] uint8 ──4 strided convs──> 4 x 4 image tokens [B, 16, d]
    state  [B, STATE_DIM]      ──linear──────────> state token
    prompt str                 ──hashed n-gram bag──> prompt token
    noise  [B, HORIZON, 8] ──> action expert (self-attn, cross-attn to the tokens, MLP) x L
                               Euler, t = 1 -> 0 in ``num_inference_steps`` steps

Everything after the image stem is ``FlowActionModel`` (pi0's convention:
x_t = t * noise + (1 - t) * actions). Actions are the 8 key bits per frame
scaled to -1 / +1; a key is held when the sampled value is above 0.

The state vector (``policy_state``) is what a robot knows without the maze's
map. Three layouts (``STATE_LAYOUTS``; the weights' metadata names theirs, the server's
OpenPI metadata advertises it as ``state_layout``):

* ``keys`` (the first shipped weights, 35 floats): cos / sin of the heading,
  the pitch (divided by ``PITCH_MAX``) and the keys held in the last
  ``HISTORY`` frames, oldest first. A reactive policy: it cannot remember
  which corridor it already tried.
* ``memory`` (120 floats): ``keys`` then the robot's own odometry memory
  (``visit_memory``): its displacement from the start (x, y, divided by the
  maze size), its offset from the centre of its cell, and a
  ``VISIT_WINDOW`` x ``VISIT_WINDOW`` window of how long it has stood in each
  cell around it (world axes, rows = y, saturating at ``VISIT_SATURATE``
  frames), then a panorama of the sky (``panorama_update``): for each of
  ``PANORAMA_BINS`` world bearings, the mean and the max RGB of the top
  ``SKY_ROWS`` rows of the columns that last looked that way, sent turned to
  the heading (``egocentric``: row 0 is the bearing ahead). The goal's
  beacon is on the sky, so the panorama is what remembers where the target was
  seen after the camera turned away (it is in view in about a third of the
  planner's frames, at the start in 5-12% of episodes). All of it follows from
  the robot's own camera and motion (a start is always a cell centre, so
  odometry gives the cell); none of it is the map.
* ``map`` (``KEYS_STATE + MAP_FLOATS`` floats): ``keys`` then the robot's map
  as seen (``models/maze/seen_map.py``: the corridors it has looked down and the goal
  objects whose beacons it has seen, a window around it turned to its
  heading), which ``map_planner.py``'s learnt value iteration reads.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from models.maze.seen_map import MAP_FLOATS
from models.maze.sim import FOV, H, PITCH_MAX, W
from models.policy.flow import FlowActionModel, FlowPolicyConfig
from models.policy.maze.map_planner import MapPlanner

HORIZON = 8          # frames per predicted chunk
EXECUTE = 4          # frames a robot executes before it observes again
HISTORY = 4          # past frames of keys in the state
ACTION_DIM = 8
IMAGE_KEY = "image"
VISIT_RADIUS = 4     # cells each side of the robot's in the visit window
VISIT_WINDOW = 2 * VISIT_RADIUS + 1
VISIT_SATURATE = 16  # frames in a cell that count as fully visited (a corridor cell takes ~9)
ODOMETRY = 4         # displacement from the start (x, y), offset in the cell (x, y)
PANORAMA_BINS = 16   # world bearings of 22.5 degrees; the camera spans 66, about 3 bins
SKY_ROWS = 8         # top rows of the frame (sky unless a wall is within ~1.3 cells)
PANORAMA = PANORAMA_BINS * 6  # mean RGB, max RGB per bin, in 0..1
KEYS_STATE = 3 + HISTORY * ACTION_DIM  # the keys layout, which the others begin with
STATE_LAYOUTS: dict[str, int] = {
    "keys": KEYS_STATE,
    "memory": KEYS_STATE + ODOMETRY + VISIT_WINDOW * VISIT_WINDOW + PANORAMA,
    "map": KEYS_STATE + MAP_FLOATS,
}
LAYOUT = "map"       # what training makes (the shipped weights' layout); weights without the metadata key are "keys"
STATE_DIM = STATE_LAYOUTS[LAYOUT]
FILM_CHANNELS = 32   # the stem's first feature maps, which the prompt conditions (prompt_film)
TARGET_AUX = 3       # target_aux's guess: cos / sin of the target's bearing from the heading, distance / 8


def config(layout: str = LAYOUT, **over: object) -> FlowPolicyConfig:
    """The maze policy's shape for a state ``layout`` (the trained weights' metadata may override sizes)."""
    if layout not in STATE_LAYOUTS:
        raise ValueError(f"state layout must be one of {list(STATE_LAYOUTS)}, got {layout!r}")
    base = dict(action_horizon=HORIZON, action_dim=ACTION_DIM, image_keys=(IMAGE_KEY,), image_resolution=(H, W),
                state_dim=STATE_LAYOUTS[layout], d_model=128, num_heads=4, num_layers=4, num_inference_steps=10, max_batch=64)
    base.update(over)
    return FlowPolicyConfig(**base)  # type: ignore[arg-type]


class MazeFlowModel(FlowActionModel):
    """``FlowActionModel`` with a stem for one 64 x 64 camera (16 tokens instead of 4).

    ``prompt_film``: the prompt embedding scales and shifts the stem's first feature maps
    (FiLM), so that what the encoder brings out depends on the colour the prompt names. Without
    it the prompt is one token the action expert attends to beside the image's, and weights trained
    that way walked to a distractor as often as to the named goal
    (``bench/results/maze_policy_goals_cpu.json``).
    """

    def __init__(self, cfg: FlowPolicyConfig, prompt_film: bool = False, target_aux: bool = False,
                 prompt_state: bool = False) -> None:
        super().__init__(cfg)
        d = cfg.d_model
        self.stem = nn.Sequential(
            nn.Conv2d(3, FILM_CHANNELS, 4, stride=2, padding=1), nn.GELU(),
            nn.Conv2d(FILM_CHANNELS, 64, 4, stride=2, padding=1), nn.GELU(),
            nn.Conv2d(64, 128, 4, stride=2, padding=1), nn.GELU(),
            nn.Conv2d(128, d, 2, stride=2),
        )
        side = cfg.image_resolution[0] // 16
        self.image_pos = nn.Parameter(torch.randn(1, side * side, d) * 0.02)
        self.prompt_film = prompt_film
        if prompt_film:
            # Zero at the start: the stem begins as it would without the prompt.
            self.film = nn.Linear(d, 2 * FILM_CHANNELS)
            nn.init.zeros_(self.film.weight)
            nn.init.zeros_(self.film.bias)
        if target_aux:
            # Training only (``train.py --target-aux``; not saved): from the image tokens and the
            # state token, guess where the target the prompt names is. Its loss teaches the FiLM'd
            # stem to find the named colour, which imitation alone did not (run 4 reached
            # distractors nearly as often; run 5, whose guess read the image tokens only, less).
            side = cfg.image_resolution[0] // 16
            self.target_head = nn.Sequential(nn.Linear((side * side + 1) * d, d), nn.GELU(), nn.Linear(d, TARGET_AUX))
        self.prompt_state = prompt_state
        if cfg.state_dim == STATE_LAYOUTS["memory"]:
            # The memory's useful facts are nonlinear in it (which panorama bin holds the
            # prompt's colour, which neighbour cell is unvisited): an MLP, not one linear map.
            # With prompt_state it also reads the prompt's embedding: which bin matters depends on it.
            width = cfg.state_dim + (d if prompt_state else 0)
            self.state_in = nn.Sequential(nn.Linear(width, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        elif cfg.state_dim == STATE_LAYOUTS["map"]:
            # The map as seen goes through a learnt planner that reads the prompt (map_planner.py).
            self.state_in = MapPlanner(d, KEYS_STATE)
        if prompt_state and cfg.state_dim != STATE_LAYOUTS["memory"]:
            raise ValueError("prompt_state reads the memory layout's state (an MLP); this layout has none")

    def state_features(self, state: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        if isinstance(self.state_in, MapPlanner):
            return self.state_in(state, prompt)
        return self.state_in(torch.cat([state, prompt], 1) if self.prompt_state else state)

    def image_features(self, x: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        if not self.prompt_film:
            return self.stem(x)
        first = self.stem[:2](x)                                            # conv + GELU: [N, FILM_CHANNELS, 32, 32]
        cams = x.shape[0] // prompt.shape[0]                                # one camera: no copy
        gamma, beta = self.film(prompt if cams == 1 else prompt.repeat_interleave(cams, 0)).chunk(2, dim=-1)
        return self.stem[2:](first * (1 + gamma[:, :, None, None]) + beta[:, :, None, None])

    def target_guess(self, cond: torch.Tensor) -> torch.Tensor:
        """``target_aux``'s guess [B, TARGET_AUX] from ``condition``'s image tokens and state token."""
        side = self.cfg.image_resolution[0] // 16
        return self.target_head(cond[:, :side * side + 1].flatten(1))

    @property
    def state_layout(self) -> str:
        return layout_of(self.cfg.state_dim)


def layout_of(state_dim: int) -> str:
    """The layout name of a state width (``STATE_LAYOUTS``)."""
    for name, dim in STATE_LAYOUTS.items():
        if dim == state_dim:
            return name
    raise ValueError(f"no maze state layout is {state_dim} floats wide ({STATE_LAYOUTS})")


def policy_state(yaw: torch.Tensor, pitch: torch.Tensor, history: torch.Tensor,
                 memory: torch.Tensor | None = None) -> torch.Tensor:
    """[B] yaw, [B] pitch, [B, HISTORY, 8] past keys (, [B, M] ``visit_memory``) -> [B, S] float32.

    Without ``memory`` it is the ``keys`` layout, with it the ``memory`` layout.
    """
    parts = [torch.cos(yaw)[:, None], torch.sin(yaw)[:, None], (pitch.float() / PITCH_MAX)[:, None],
             history.flatten(1).float()]
    if memory is not None:
        parts.append(memory.float())
    return torch.cat(parts, 1)


def visit_memory(pos: torch.Tensor, start: torch.Tensor, visits: torch.Tensor) -> torch.Tensor:
    """The ``memory`` layout's tail, [B, ODOMETRY + VISIT_WINDOW**2].

    ``pos``, ``start`` [B, 2] (x, y) in cell units; ``visits`` [B, n, n] frames spent
    per cell (rows y). The window is centred on the robot's cell; cells beyond the
    maze's edge read 0 like unvisited ones::

        window row r, column c  <->  cell (x0 - R + c, y0 - R + r),  R = VISIT_RADIUS
    """
    b, n = visits.shape[0], visits.shape[-1]
    r = VISIT_RADIUS
    padded = torch.nn.functional.pad(visits.float(), (r, r, r, r))        # [B, n + 2R, n + 2R]
    cell = pos.floor().long().clamp(0, n - 1)                              # [B, 2]
    offs = torch.arange(VISIT_WINDOW, device=pos.device)
    rows = (cell[:, 1, None] + offs)[:, :, None]                           # padded index = cell - R + offs + R
    cols = (cell[:, 0, None] + offs)[:, None, :]
    window = padded[torch.arange(b, device=pos.device)[:, None, None], rows, cols]
    window = (window / VISIT_SATURATE).clamp(max=1.0)
    odo = torch.cat([(pos - start) / n, pos - pos.floor() - 0.5], 1)
    return torch.cat([odo, window.flatten(1)], 1)


def column_bearings(yaw: torch.Tensor) -> torch.Tensor:
    """[B] yaw -> [B, W] the world bearing each camera column looks along (the sim's ray angles)."""
    cam = (torch.arange(W, dtype=torch.float32, device=yaw.device) + 0.5) / W * 2 - 1
    return yaw[:, None].float() + torch.atan(cam * math.tan(FOV / 2))[None]


def bearing_bin(bearing: torch.Tensor) -> torch.Tensor:
    """World bearing (radians) -> panorama bin; bin k is centred on k * 360 / PANORAMA_BINS degrees."""
    width = 2 * math.pi / PANORAMA_BINS
    return torch.remainder(torch.floor(bearing / width + 0.5).long(), PANORAMA_BINS)


def egocentric(pano: torch.Tensor, yaw: torch.Tensor) -> torch.Tensor:
    """The panorama [B, K, 6] turned to the heading: row j is the bin j bins right of the one ahead.

    (Right = the direction L turns, increasing yaw.) A fixed row then means a fixed turn, whatever
    the heading; the robot does this on its side, as a map would be drawn heading-up.
    """
    k = pano.shape[1]
    rows = torch.remainder(bearing_bin(yaw)[:, None] + torch.arange(k, device=pano.device)[None], k)
    return pano.gather(1, rows[..., None].expand(-1, -1, pano.shape[2]))


def panorama_update(pano: torch.Tensor, image: torch.Tensor, yaw: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """The sky panorama [B, PANORAMA_BINS, 6] after seeing ``image`` [B, H, W, 3] uint8 at ``yaw`` [B].

    Each bin a column of the frame falls in (by its world bearing) is overwritten
    with the mean and max RGB / 255 of the top ``SKY_ROWS`` rows of those columns;
    bins out of view, and rows where ``live`` [B] is false, keep what they had.
    """
    sky = image[:, :SKY_ROWS].float() / 255.0                             # [B, R, W, 3]
    bins = bearing_bin(column_bearings(yaw))
    onehot = torch.nn.functional.one_hot(bins, PANORAMA_BINS).float()      # [B, W, K]
    count = onehot.sum(1)                                                  # [B, K]
    mean = torch.einsum("bwk,bwc->bkc", onehot, sky.mean(1)) / count.clamp_min(1)[..., None]
    peak = (onehot[..., None] * sky.amax(1)[:, :, None, :]).amax(1)        # [B, K, 3]; colours >= 0
    seen = (count > 0) & live[:, None]
    return torch.where(seen[..., None], torch.cat([mean, peak], -1), pano)


_SIZES = ("d_model", "num_heads", "num_layers", "num_inference_steps")


def save_policy(model: MazeFlowModel, path: str | Path, extra: dict | None = None) -> None:
    """fp16 safetensors; the sizes, the state layout (and ``extra``) go in the header's metadata."""
    meta = {k: str(getattr(model.cfg, k)) for k in _SIZES}
    meta["state_layout"] = model.state_layout
    meta["prompt_film"] = str(int(model.prompt_film))
    meta["prompt_state"] = str(int(model.prompt_state))
    meta["info"] = json.dumps(extra or {})
    # The training-only target head is not part of the policy.
    tensors = {k: v.detach().half().cpu().contiguous() for k, v in model.state_dict().items()
               if not k.startswith("target_head.")}
    save_file(tensors, str(path), metadata=meta)


def load_policy(path: str | Path, device: str | torch.device = "cpu", **over: object) -> MazeFlowModel:
    """A ``MazeFlowModel`` from ``save_policy``'s file, in float32 on ``device``."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    sizes = {k: int(meta[k]) for k in _SIZES if k in meta}
    # The first shipped weights predate the key: they read the reactive "keys" state.
    model = MazeFlowModel(config(meta.get("state_layout", "keys"), **{**sizes, **over}),
                          prompt_film=meta.get("prompt_film", "0") == "1",
                          prompt_state=meta.get("prompt_state", "0") == "1")
    state = {k: v.float() for k, v in load_file(str(path)).items()}
    model.load_state_dict(state)
    return model.to(device).eval()
