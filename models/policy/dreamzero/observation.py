"""DreamZero-DROID's observation and action transforms, as its upstream eval path applies them.

Read off ``dreamzero0/dreamzero`` (ab790c1): the RoboArena server wrapper
``socket_test_optimized_AR.py`` (``ARDroidRoboarenaPolicy``), the DROID data config
``groot/vla/configs/data/dreamzero/base_48_wan_fine_aug_relative.yaml`` + ``droid_relative.yaml``
with the training script's ``image_resolution_height=176 width=320``, the transforms
``groot/vla/data/transform/{video,state_action}.py``, the model transform
``groot/vla/model/dreamzero/transform/dreamzero_cotrain.py`` and ``groot/vla/model/n1_5/sim_policy.py``.

Cameras. The robot sends RoboArena's keys (0-indexed); DreamZero's DROID names are 1-indexed::

    observation/exterior_image_0_left -> exterior_image_1_left  (left exterior)
    observation/exterior_image_1_left -> exterior_image_2_left  (right exterior)
    observation/wrist_image_left      -> wrist_image_left

(RoboArena's evaluator numbers the exteriors from 1, ``exterior_image_1_left`` and ``_2_left``; the
protocol layer reads those as 0 and 1: ``protocols/roboarena.py``, ``sent_cameras``.)

Each frame (uint8 [180, 320, 3]) goes through the eval transforms: to float32 / 255, a centre
crop to ``int(H * 0.95) x int(W * 0.95)`` (torchvision's ``CenterCrop``: offsets rounded half to
even), a bilinear resize to 176 x 320 (torchvision's ``Resize``, antialiased), then ``* 255`` cast
to uint8 (truncated, not rounded). The three views are stitched into one 352 x 640 frame::

    +-------------------------------------------+
    |  wrist, each column repeated twice        |  rows 0..175
    +---------------------+---------------------+
    |  left exterior      |  right exterior     |  rows 176..351
    +---------------------+---------------------+
       columns 0..319        columns 320..639

State. ``observation/joint_position`` (7) and ``observation/gripper_position`` (1), each
normalised per dimension with the checkpoint's q01/q99 (``2 (x - q01) / (q99 - q01) - 1``,
clipped to [-1, 1]; a dimension with q01 == q99 passes through, then is clipped), concatenated
joints first and zero-padded to ``max_state_dim`` 64.

Actions. The model's normalised chunk [24, 8] (joints, gripper) is unnormalised with the action
stats (``(a + 1) / 2 (q99 - q01) + q01``, not clipped); the joints are relative
(``relative_action_keys: [joint_position]``), so the last joint state is added back; the
gripper is absolute.

Stats. ``experiment_cfg/metadata.json`` is one ``DatasetMetadata`` per embodiment tag::

    {"oxe_droid": {"statistics": {"state":  {"joint_position":   {"q01": [7], "q99": [7], ...},
                                             "gripper_position": {"q01": [1], "q99": [1], ...}},
                                  "action": {"joint_position": {...}, "gripper_position": {...}}},
                   "modalities": {...}, "embodiment_tag": "oxe_droid"}, ...}

(each stats map also holds max, min, mean and std). Stats are float32 as upstream's
``torch.tensor(list)`` makes them; the state is normalised in float64, as the server feeds it.

Prompt. The task is wrapped in the fixed DROID template, lower-cased, twice (``prompt_text``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np
import torch
import torch.nn.functional as F

from protocols.openpi import Observation, PolicyMetadata, ProtocolError, _session_id, validate_observation as _wire_check
from protocols.roboarena import GRIPPER_POSITION, JOINT_POSITION, WRIST_IMAGE, RoboArenaConfig, exterior_image

EMBODIMENT = "oxe_droid"
EXTERIOR_LEFT = exterior_image(0)
EXTERIOR_RIGHT = exterior_image(1)
WRIST = WRIST_IMAGE
CAMERA_KEYS = (EXTERIOR_LEFT, EXTERIOR_RIGHT, WRIST)
# What the robot sends (RoboArena's image_resolution for DreamZero) and what the model sees.
IMAGE_RESOLUTION = (180, 320)
FRAME_HEIGHT, FRAME_WIDTH = 352, 640
CROP_SCALE = 0.95
JOINTS = 7
ACTION_HORIZON = 24
ACTION_DIM = JOINTS + 1
MAX_STATE_DIM = 64
# Frames one camera may carry in a call: upstream clients send 1, then 4 (offsets -23, -16, -8, 0
# of the last chunk); one per action of a 24-step chunk is the most a robot can have seen since.
MAX_FRAMES = ACTION_HORIZON
# The task text is at most this long. The text encoder (umT5, 512 tokens, truncating) sees the
# task twice inside a ~90-token template, so a task past ~200 tokens is already cut; this bound
# only keeps a hostile prompt cheap (it is parsed as a Python literal below, as upstream does).
MAX_TASK_CHARS = 1024

ROBOARENA = RoboArenaConfig(image_resolution=IMAGE_RESOLUTION, needs_wrist_camera=True, n_external_cameras=2,
                            needs_stereo_camera=False, needs_session_id=True, action_space="joint_position")

TEMPLATE_HEAD = "A multi-view video shows that a robot "
TEMPLATE_MIDDLE = (
    " The video is split into three views: The top view shows the camera view from the robot's wrist, the "
    "bottom-left view shows the camera view from the left exterior camera, and the bottom-right view shows the "
    "camera view from the right exterior camera. During training, one of the two bottom exterior views may be a "
    "black screen (dropped view). The robot "
)
# Markers upstream's language transform removes from the raw instruction.
_MARKERS = ("<LAPA>", "<DREAM>", "<COTRAIN>")


def policy_metadata(**extra: Any) -> PolicyMetadata:
    """What DreamZero-DROID advertises: RoboArena's config for it, plus OpenPI's keys."""
    return PolicyMetadata(
        action_horizon=ACTION_HORIZON, action_dim=ACTION_DIM, image_keys=CAMERA_KEYS,
        image_resolution=IMAGE_RESOLUTION, state_dim=0, max_frames=MAX_FRAMES, max_prompt_chars=MAX_TASK_CHARS,
        roboarena=ROBOARENA, extra=extra,
    )


METADATA = policy_metadata()


# --------------------------------------------------------------------------- cameras


def center_crop_box(height: int, width: int, scale: float = CROP_SCALE) -> tuple[int, int, int, int]:
    """(top, left, crop height, crop width) of upstream's centre crop of an image ``height x width``.

    The crop is ``int(height * scale) x int(width * scale)``; torchvision centres it with
    ``int(round((H - h) / 2))``, Python's round (half to even)::

        180 x 320 at 0.95 -> 171 x 304, top round(4.5) = 4, left round(8.0) = 8
        rows 0..3 | 4 ........ 174 | 175..179      cols 0..7 | 8 ....... 311 | 312..319
          cut       kept (171)       cut (5)                   kept (304)
    """
    crop_h, crop_w = int(height * scale), int(width * scale)
    return int(round((height - crop_h) / 2.0)), int(round((width - crop_w) / 2.0)), crop_h, crop_w


def crop_and_resize(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 [T, H, W, 3] -> the centre crop resized to uint8 [T, height, width, 3], as upstream:
    float32 / 255, crop, antialiased bilinear resize (half-pixel centres), ``* 255`` truncated."""
    top, left, crop_h, crop_w = center_crop_box(frames.shape[1], frames.shape[2])
    frames = np.ascontiguousarray(frames)
    if not frames.flags.writeable:
        frames = frames.copy()  # the wire's arrays are read-only, which torch.from_numpy warns about
    x = torch.from_numpy(frames).to(torch.float32) / 255.0
    x = x.permute(0, 3, 1, 2)[:, :, top:top + crop_h, left:left + crop_w]
    if (crop_h, crop_w) != (height, width):
        x = F.interpolate(x, size=(height, width), mode="bilinear", align_corners=False, antialias=True)
    return (x.permute(0, 2, 3, 1) * 255).to(torch.uint8).numpy()


def stitch_cameras(images: Mapping[str, np.ndarray], height: int = FRAME_HEIGHT,
                   width: int = FRAME_WIDTH) -> np.ndarray:
    """The three cameras (``CAMERA_KEYS``, uint8 [H, W, 3] or [T, H, W, 3], the same T) as one
    uint8 frame [height, width, 3] (or [T, height, width, 3]): the wrist on top at twice its width,
    the left and right exteriors below (module docstring)."""
    if height % 2 or width % 2:
        raise ValueError(f"the stitched frame must have an even height and width, got {height} x {width}")
    missing = [k for k in CAMERA_KEYS if k not in images]
    if missing:
        raise ValueError(f"missing camera {missing[0]!r}")
    single = images[WRIST].ndim == 3
    views = {}
    for key in CAMERA_KEYS:
        img = np.asarray(images[key])
        if img.dtype != np.uint8 or img.ndim != (3 if single else 4) or img.shape[-1] != 3:
            raise ValueError(f"camera {key!r} must be uint8 [{'' if single else 'T, '}H, W, 3], got "
                             f"{img.dtype} {list(img.shape)}")
        views[key] = img[None] if single else img
    if len({v.shape[0] for v in views.values()}) != 1:
        raise ValueError("every camera must carry the same number of frames")
    h, w = height // 2, width // 2
    out = np.empty((views[WRIST].shape[0], height, width, 3), np.uint8)
    out[:, :h] = np.repeat(crop_and_resize(views[WRIST], h, w), 2, axis=2)
    out[:, h:, :w] = crop_and_resize(views[EXTERIOR_LEFT], h, w)
    out[:, h:, w:] = crop_and_resize(views[EXTERIOR_RIGHT], h, w)
    return out[0] if single else out


# --------------------------------------------------------------------------- state and actions


@dataclass(frozen=True)
class Normalizer:
    """q01/q99 of the state and the actions, [joints (7), gripper (1)] each, float32."""

    state_q01: np.ndarray = field(repr=False)
    state_q99: np.ndarray = field(repr=False)
    action_q01: np.ndarray = field(repr=False)
    action_q99: np.ndarray = field(repr=False)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], embodiment: str = EMBODIMENT) -> Normalizer:
        """From ``experiment_cfg/metadata.json`` as loaded; a ``ValueError`` names a missing or bad entry."""
        if not isinstance(metadata, Mapping) or embodiment not in metadata:
            known = sorted(metadata) if isinstance(metadata, Mapping) else []
            raise ValueError(f"metadata has no embodiment {embodiment!r} (has {known})")
        stats: dict[str, np.ndarray] = {}
        for group in ("state", "action"):
            for q in ("q01", "q99"):
                parts = [_stat(metadata, embodiment, group, key, q, n)
                         for key, n in (("joint_position", JOINTS), ("gripper_position", 1))]
                stats[f"{group}_{q}"] = np.concatenate(parts)
        return cls(**stats)

    def state(self, joint_position: np.ndarray, gripper: np.ndarray) -> np.ndarray:
        """The model's state: float32 [64], the normalised joints and gripper, then zeros."""
        x = np.concatenate([np.asarray(joint_position, np.float64).reshape(JOINTS),
                            np.asarray(gripper, np.float64).reshape(1)])
        q01, q99 = self.state_q01.astype(np.float64), self.state_q99.astype(np.float64)
        spread = q99 != q01
        scaled = np.divide(x - q01, q99 - q01, out=np.zeros_like(x), where=spread)
        normalized = np.clip(np.where(spread, 2 * scaled - 1, x), -1.0, 1.0)
        out = np.zeros(MAX_STATE_DIM, np.float32)
        out[:ACTION_DIM] = normalized
        return out

    def actions(self, normalized: np.ndarray, last_state: np.ndarray) -> np.ndarray:
        """The robot's chunk float32 [T, 8]: ``normalized`` [T, 8] unnormalised, the joints made
        absolute by adding ``last_state``'s joints (its first 7 values: the joint position sent)."""
        a = np.asarray(normalized, np.float32)
        if a.ndim != 2 or a.shape[1] != ACTION_DIM:
            raise ValueError(f"normalized actions must be [T, {ACTION_DIM}], got {list(a.shape)}")
        last = np.asarray(last_state, np.float64).reshape(-1)
        if last.shape[0] not in (JOINTS, ACTION_DIM):
            raise ValueError(f"last_state must hold {JOINTS} joints (and maybe the gripper), got {last.shape[0]} values")
        # float32 as upstream's torch inverse; the float64 state added as its numpy sum does.
        unnormalized = (a + 1) / 2 * (self.action_q99 - self.action_q01) + self.action_q01
        out = unnormalized.astype(np.float64)
        out[:, :JOINTS] += last[:JOINTS]
        return out.astype(np.float32)


def _stat(metadata: Mapping[str, Any], embodiment: str, group: str, key: str, q: str, n: int) -> np.ndarray:
    path = f"metadata[{embodiment!r}]['statistics'][{group!r}][{key!r}][{q!r}]"
    node: Any = metadata[embodiment]
    for part in ("statistics", group, key, q):
        if not isinstance(node, Mapping) or part not in node:
            raise ValueError(f"{path} is missing")
        node = node[part]
    try:
        values = np.asarray(node, dtype=np.float32)
    except (TypeError, ValueError):
        raise ValueError(f"{path} must be a list of {n} finite number{'s' if n > 1 else ''}") from None
    if values.shape != (n,) or not np.isfinite(values).all():
        raise ValueError(f"{path} must be a list of {n} finite number{'s' if n > 1 else ''}, got {node!r}")
    return values


# --------------------------------------------------------------------------- prompt


def prompt_text(task: str) -> str:
    """The text DreamZero's encoder tokenises for ``task``: the DROID template around it, twice.

    As upstream's collate: the markers ``<LAPA>``, ``<DREAM>``, ``<COTRAIN>`` are removed; a task that
    parses as a Python literal is replaced by it (a list or tuple by its first item: ``"['pick up']"``
    -> ``"pick up"``), anything else is kept as is; then it is lower-cased. (The tokenizer's own
    clean-up, ftfy and collapsed whitespace, is the text encoder's.)"""
    if not isinstance(task, str):
        raise TypeError(f"task must be a string, got {type(task).__name__}")
    if len(task) > MAX_TASK_CHARS:
        raise ValueError(f"task is over {MAX_TASK_CHARS} characters")
    for marker in _MARKERS:
        task = task.replace(marker, "")
    text = task
    try:
        parsed = ast.literal_eval(task)
        text = str(parsed[0]) if isinstance(parsed, (list, tuple)) else str(parsed)
    except (ValueError, SyntaxError, TypeError, IndexError, MemoryError, RecursionError):
        pass  # upstream: ValueError, SyntaxError, TypeError; an empty list or a deep nest crashed it
    text = text.lower()
    return TEMPLATE_HEAD + text + TEMPLATE_MIDDLE + text


# --------------------------------------------------------------------------- one observation


@dataclass(frozen=True)
class DroidObservation:
    """One checked DROID observation: every camera as uint8 [T, 180, 320, 3] (one frame: T = 1)."""

    images: Mapping[str, np.ndarray] = field(repr=False)
    joint_position: np.ndarray = field(repr=False)  # float64 [7], read-only
    gripper_position: np.ndarray = field(repr=False)  # float64 [1], read-only
    task: str = ""
    session_id: str | None = None

    @classmethod
    def from_wire(cls, observation: Observation, session_id: str | None = None) -> DroidObservation:
        """From an observation the OpenPI layer checked against ``METADATA``."""
        images = {k: (v[None] if v.ndim == 3 else v) for k, v in observation.images.items()}
        return cls(MappingProxyType(images), observation.extras[JOINT_POSITION], observation.extras[GRIPPER_POSITION],
                   observation.prompt or "", session_id)

    @property
    def frames(self) -> int:
        return self.images[WRIST].shape[0]


def validate_observation(obs: Mapping[str, Any]) -> DroidObservation:
    """Check one observation as a RoboArena client sends it; a ``ProtocolError`` (a ``ValueError``)
    names the first bad field: a missing camera, a camera of the wrong dtype or shape (uint8
    [180, 320, 3] or [T, 180, 320, 3], T at most ``MAX_FRAMES``, the same T for all), a missing or
    non-finite joint or gripper position, a prompt that is not a string or is over
    ``MAX_TASK_CHARS``, a ``session_id`` that is not 1-128 characters of ``[A-Za-z0-9_.:@/+-]``."""
    if not isinstance(obs, Mapping):
        raise ProtocolError(f"observation must be a map, got {type(obs).__name__}")
    checked = _wire_check(obs, METADATA)
    return DroidObservation.from_wire(checked, _session_id(obs.get("session_id"), "session_id"))


# --------------------------------------------------------------------------- a client's observation
# Frames a camera carries after the first call: upstream's DROID client sends the last 4.
CLIENT_FRAMES = 4


def droid_observation(seed: int, call: int, session_id: str | None = None,
                      prompt: str = "put the cup in the sink") -> dict[str, Any]:
    """Call ``call`` of episode ``seed`` as DreamZero's DROID client sends it, with random contents
    drawn from ``[seed, call]`` (for tests and benches): every camera uint8 [180, 320, 3] on the first
    call, then its last ``CLIENT_FRAMES``; 7 joint positions in [-1, 1), the gripper in [0, 1), the
    ``session_id`` when given, and the prompt."""
    rng = np.random.default_rng([seed, call])
    frame = (*IMAGE_RESOLUTION, 3)
    shape = frame if call == 0 else (CLIENT_FRAMES, *frame)
    obs: dict[str, Any] = {k: rng.integers(0, 256, shape, dtype=np.uint8) for k in METADATA.image_keys}
    obs.update({"observation/joint_position": rng.uniform(-1, 1, JOINTS),
                "observation/gripper_position": rng.uniform(0, 1, 1), "prompt": prompt})
    if session_id is not None:
        obs["session_id"] = session_id
    return obs
