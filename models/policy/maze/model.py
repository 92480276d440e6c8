"""The maze policy network: ``flow.py``'s action expert behind a conv encoder for 64 x 64 frames.

    camera [B, 64, 64, 3] uint8 ──4 strided convs──> 4 x 4 image tokens [B, 16, d]
    state  [B, STATE_DIM]      ──linear──────────> state token
    prompt str                 ──hashed n-gram bag──> prompt token
    noise  [B, HORIZON, 8] ──> action expert (self-attn, cross-attn to the tokens, MLP) x L
                               Euler, t = 1 -> 0 in ``num_inference_steps`` steps

Everything after the image stem is ``FlowActionModel`` (pi0's convention:
x_t = t * noise + (1 - t) * actions). Actions are the 8 key bits per frame
scaled to -1 / +1; a key is held when the sampled value is above 0.

The state vector (``policy_state``) is what a robot knows without a map:
cos / sin of its heading, its pitch (divided by ``PITCH_MAX``) and the keys
it held in the last ``HISTORY`` frames, oldest first.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from models.policy.flow import FlowActionModel, FlowPolicyConfig
from models.world.maze.sim import H, PITCH_MAX, W

HORIZON = 8          # frames per predicted chunk
EXECUTE = 4          # frames a robot executes before it observes again
HISTORY = 4          # past frames of keys in the state
ACTION_DIM = 8
STATE_DIM = 3 + HISTORY * ACTION_DIM
IMAGE_KEY = "image"


def config(**over: object) -> FlowPolicyConfig:
    """The maze policy's shape (the trained weights' metadata may override sizes)."""
    base = dict(action_horizon=HORIZON, action_dim=ACTION_DIM, image_keys=(IMAGE_KEY,), image_resolution=(H, W),
                state_dim=STATE_DIM, d_model=128, num_heads=4, num_layers=4, num_inference_steps=10, max_batch=64)
    base.update(over)
    return FlowPolicyConfig(**base)  # type: ignore[arg-type]


class MazeFlowModel(FlowActionModel):
    """``FlowActionModel`` with a stem for one 64 x 64 camera (16 tokens instead of 4)."""

    def __init__(self, cfg: FlowPolicyConfig) -> None:
        super().__init__(cfg)
        d = cfg.d_model
        self.stem = nn.Sequential(
            nn.Conv2d(3, 32, 4, stride=2, padding=1), nn.GELU(),
            nn.Conv2d(32, 64, 4, stride=2, padding=1), nn.GELU(),
            nn.Conv2d(64, 128, 4, stride=2, padding=1), nn.GELU(),
            nn.Conv2d(128, d, 2, stride=2),
        )
        side = cfg.image_resolution[0] // 16
        self.image_pos = nn.Parameter(torch.randn(1, side * side, d) * 0.02)


def policy_state(yaw: torch.Tensor, pitch: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
    """[B] yaw, [B] pitch, [B, HISTORY, 8] past keys -> [B, STATE_DIM] float32."""
    return torch.cat([torch.cos(yaw)[:, None], torch.sin(yaw)[:, None], (pitch.float() / PITCH_MAX)[:, None],
                      history.flatten(1).float()], 1)


_SIZES = ("d_model", "num_heads", "num_layers", "num_inference_steps")


def save_policy(model: MazeFlowModel, path: str | Path, extra: dict | None = None) -> None:
    """fp16 safetensors; the sizes (and ``extra``) go in the header's metadata."""
    meta = {k: str(getattr(model.cfg, k)) for k in _SIZES}
    meta["info"] = json.dumps(extra or {})
    tensors = {k: v.detach().half().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(path), metadata=meta)


def load_policy(path: str | Path, device: str | torch.device = "cpu", **over: object) -> MazeFlowModel:
    """A ``MazeFlowModel`` from ``save_policy``'s file, in float32 on ``device``."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    sizes = {k: int(meta[k]) for k in _SIZES if k in meta}
    model = MazeFlowModel(config(**{**sizes, **over}))
    state = {k: v.float() for k, v in load_file(str(path)).items()}
    model.load_state_dict(state)
    return model.to(device).eval()
