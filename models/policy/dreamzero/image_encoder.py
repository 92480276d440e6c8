"""Wan's CLIP image encoder: the one definition is ``models/world/wan_clip.py`` (Matrix-Game
2.0 uses it too); DreamZero's checkpoint errors are ``CheckpointError``."""

from __future__ import annotations

import torch

from models.world.wan_clip import (CLIP_MEAN, CLIP_STD, HEAD_WIDTH, ClipError, WanImageEncoder,
                                   build_image_encoder as _build, expected_names)


__all__ = ["CLIP_MEAN", "CLIP_STD", "HEAD_WIDTH", "WanImageEncoder", "build_image_encoder", "expected_names"]


def build_image_encoder(weights: dict[str, torch.Tensor], device: torch.device | str = "cpu",
                        dtype: torch.dtype = torch.float32) -> WanImageEncoder:
    """The encoder holding exactly ``weights`` (``action_head.image_encoder.`` stripped); an
    unknown or missing name, or another shape, fails naming it."""
    from models.policy.dreamzero.checkpoint import CheckpointError

    try:
        return _build(weights, device, dtype)
    except ClipError as e:
        raise CheckpointError(str(e)) from None
