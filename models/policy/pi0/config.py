"""pi0's geometry, read from LeRobot's ``config.json`` (``PI0Config`` as LeRobot saves it).

LeRobot names the two Gemma sizes by variant (``paligemma_variant: "gemma_2b"``,
``action_expert_variant: "gemma_300m"``, the values openpi's ``gemma.get_config``
defines) and fixes the SigLIP So400m/14 tower in code. Everything else a forward
needs is in the file: the input features (cameras in order, the state), the action
feature, chunk size, padded dims, steps, tokenizer length, the time-embedding periods
and the normalisation modes. Training-only keys are ignored.

One extension, for tiny test and benchmark checkpoints only: a ``"pi0_native"`` map
with ``"paligemma"``, ``"action_expert"``, ``"vision"`` and ``"vocab_size"`` overrides.
A real LeRobot config has no such key, so the full sizes apply.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

VOCAB_SIZE = 257152  # PaliGemma's vocabulary (Gemma's 256000 + 1024 loc + 128 seg tokens)
ROPE_THETA = 10000.0
RMS_EPS = 1e-6
LAYER_NORM_EPS = 1e-6  # SigLIP's


@dataclass(frozen=True)
class GemmaSpec:
    """One Gemma stack (openpi ``gemma.Config``)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class VisionSpec:
    """The SigLIP vision tower (So400m/14 at 224 in PaliGemma)."""

    hidden: int = 1152
    intermediate: int = 4304
    layers: int = 27
    heads: int = 16
    patch: int = 14


GEMMA_VARIANTS: Mapping[str, GemmaSpec] = {
    "gemma_2b": GemmaSpec(width=2048, depth=18, mlp_dim=16384, num_heads=8, num_kv_heads=1, head_dim=256),
    "gemma_300m": GemmaSpec(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
}

NORM_MODES = ("IDENTITY", "MEAN_STD", "MIN_MAX")


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be served as pi0; the message names the file and field."""


@dataclass(frozen=True)
class Pi0Config:
    """What the native pi0 needs from LeRobot's config.json."""

    image_features: tuple[str, ...]  # the checkpoint's camera features, in its order
    state_feature: str | None
    state_dim: int
    action_dim: int
    image_resolution: tuple[int, int] = (224, 224)
    chunk_size: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    num_inference_steps: int = 10
    tokenizer_max_length: int = 48
    min_period: float = 4e-3
    max_period: float = 4.0
    vlm: GemmaSpec = GEMMA_VARIANTS["gemma_2b"]
    expert: GemmaSpec = GEMMA_VARIANTS["gemma_300m"]
    vision: VisionSpec = VisionSpec()
    vocab_size: int = VOCAB_SIZE
    state_norm: str = "MEAN_STD"
    action_norm: str = "MEAN_STD"

    def __post_init__(self) -> None:
        h, w = self.image_resolution
        if h != w or h % self.vision.patch:
            raise CheckpointError(f"config.json: image_resolution {list(self.image_resolution)} must be square and a "
                                  f"multiple of the patch size {self.vision.patch}")
        if not self.image_features:
            raise CheckpointError("config.json: input_features has no VISUAL feature")
        if self.state_dim > self.max_state_dim or self.action_dim > self.max_action_dim:
            raise CheckpointError(f"config.json: state {self.state_dim} / action {self.action_dim} dims exceed "
                                  f"max_state_dim {self.max_state_dim} / max_action_dim {self.max_action_dim}")
        if self.vlm.depth != self.expert.depth or self.vlm.head_dim != self.expert.head_dim or \
                self.vlm.num_kv_heads != self.expert.num_kv_heads or self.vlm.num_heads != self.expert.num_heads:
            raise CheckpointError("config.json: the action expert must match the VLM's depth and attention heads")

    @property
    def tokens_per_image(self) -> int:
        return (self.image_resolution[0] // self.vision.patch) ** 2

    @property
    def prefix_len(self) -> int:
        """Image tokens of every camera, then the (padded) prompt tokens."""
        return len(self.image_features) * self.tokens_per_image + self.tokenizer_max_length

    @property
    def suffix_len(self) -> int:
        """The state token, then one token per action."""
        return 1 + self.chunk_size

    @property
    def kv_len(self) -> int:
        """Keys per layer: prefix, suffix, then masked padding up to a multiple of 16
        (attention kernels want the mask's rows aligned; 816 + 51 -> 880 at full size)."""
        return -(-(self.prefix_len + self.suffix_len) // 16) * 16


def _feature_shape(spec: Any, name: str) -> tuple[int, ...]:
    shape = spec.get("shape") if isinstance(spec, Mapping) else None
    if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
        raise CheckpointError(f"config.json: feature {name!r} has no integer 'shape'")
    return tuple(shape)


def parse_config(raw: Mapping[str, Any]) -> Pi0Config:
    """A LeRobot ``PI0Config`` dict -> ``Pi0Config`` (``CheckpointError`` naming the field)."""
    if raw.get("type", "pi0") != "pi0":
        raise CheckpointError(f"config.json: type is {raw.get('type')!r}, not 'pi0'")
    inputs = raw.get("input_features")
    outputs = raw.get("output_features")
    if not isinstance(inputs, Mapping) or not isinstance(outputs, Mapping):
        raise CheckpointError("config.json: input_features and output_features must be maps")
    images, state_feature, state_dim = [], None, 0
    for name, spec in inputs.items():
        kind = spec.get("type") if isinstance(spec, Mapping) else None
        if kind == "VISUAL":
            images.append(str(name))
        elif kind == "STATE":
            state_feature, state_dim = str(name), _feature_shape(spec, name)[0]
    # LeRobot's empty_cameras: extra camera slots that are always filled as missing.
    images += [f"observation.images.empty_camera_{i}" for i in range(int(raw.get("empty_cameras", 0) or 0))]
    action = outputs.get("action")
    if action is None:
        raise CheckpointError("config.json: output_features has no 'action'")
    action_dim = _feature_shape(action, "action")[0]

    try:
        vlm = GEMMA_VARIANTS[raw.get("paligemma_variant", "gemma_2b")]
        expert = GEMMA_VARIANTS[raw.get("action_expert_variant", "gemma_300m")]
    except KeyError as exc:
        raise CheckpointError(f"config.json: unknown Gemma variant {exc} (known: {sorted(GEMMA_VARIANTS)})") from None
    vision, vocab = VisionSpec(), VOCAB_SIZE
    native = raw.get("pi0_native") or {}
    try:
        if "paligemma" in native:
            vlm = GemmaSpec(**native["paligemma"])
        if "action_expert" in native:
            expert = GemmaSpec(**native["action_expert"])
        if "vision" in native:
            vision = VisionSpec(**native["vision"])
        vocab = int(native.get("vocab_size", vocab))
    except TypeError as exc:
        raise CheckpointError(f"config.json: pi0_native: {exc}") from None

    res = raw.get("image_resolution") or raw.get("resize_imgs_with_padding") or (224, 224)
    mapping = raw.get("normalization_mapping") or {}
    state_norm, action_norm = str(mapping.get("STATE", "MEAN_STD")), str(mapping.get("ACTION", "MEAN_STD"))
    for field_name, mode in (("STATE", state_norm), ("ACTION", action_norm)):
        if mode not in NORM_MODES:
            raise CheckpointError(f"config.json: normalization_mapping.{field_name} {mode!r} is not one of {NORM_MODES}")
    return Pi0Config(
        image_features=tuple(images),
        state_feature=state_feature,
        state_dim=int(state_dim),
        action_dim=int(action_dim),
        image_resolution=(int(res[0]), int(res[1])),
        chunk_size=int(raw.get("chunk_size", 50)),
        max_state_dim=int(raw.get("max_state_dim", 32)),
        max_action_dim=int(raw.get("max_action_dim", 32)),
        # Newer LeRobot writes num_inference_steps, older num_steps.
        num_inference_steps=int(raw.get("num_inference_steps", raw.get("num_steps", 10))),
        tokenizer_max_length=int(raw.get("tokenizer_max_length", 48)),
        min_period=float(raw.get("min_period", 4e-3)),
        max_period=float(raw.get("max_period", 4.0)),
        vlm=vlm,
        expert=expert,
        vision=vision,
        vocab_size=vocab,
        state_norm=state_norm,
        action_norm=action_norm,
    )


def load_config(folder: str) -> Pi0Config:
    path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{folder}: no config.json (expected LeRobot's pi0 layout)") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    return parse_config(raw)


def full_size(**over: Any) -> Pi0Config:
    """pi_0 base geometry (3 cameras, 32-dim state and actions), for random-weight benchmarks."""
    base = Pi0Config(
        image_features=("observation.images.base_0_rgb", "observation.images.left_wrist_0_rgb",
                        "observation.images.right_wrist_0_rgb"),
        state_feature="observation.state", state_dim=32, action_dim=32,
    )
    known = {f.name for f in fields(Pi0Config)}
    return replace(base, **{k: v for k, v in over.items() if k in known})
