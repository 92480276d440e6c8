"""DreamZero's configuration, read from the checkpoint's ``config.json``.

``GEAR-Dreams/DreamZero-DROID``'s ``config.json`` is a resolved Hydra config of the
``VLA`` class (``architectures: ["VLA"]``); the network lives under
``action_head_cfg.config``::

    action_head_cfg.config
        action_dim 32, action_horizon 24, num_frames 33, num_frame_per_block 2, ...
        diffusion_model_cfg            CausalWanModel(**fields), Wan2.1-I2V-14B sized
            model_type "i2v", dim 5120, in_dim 36, ffn_dim 13824, out_dim 16, freq_dim 256,
            num_heads 40, num_layers 40, eps 1e-6, frame_seqlen 880, max_chunk_size 4,
            num_frame_per_block 2, num_action_per_block 24, num_state_per_block 1

Fields CausalWanModel takes but the config does not set keep that class's defaults
(text_dim 4096, text_len 512, action_dim 32, max_state_dim 64, hidden_size 1024);
``DreamZeroConfig()`` is the released DROID model. Fields fall in two groups, as in
``models/world/lingbot/config.py``: sizes (any positive value builds a model; tests
use tiny ones) and topology (how the network is wired: I2V with the first-frame latent
concatenated, q/k RMS norm, the cross-attention LayerNorm), which this code builds one
way only and refuses by name otherwise.

The attention window: ``local_attn_size = max_chunk_size * num_frame_per_block + 1``
latent frames (9 for DROID): the first frame and 4 chunks of 2. A session's KV restarts
when the next chunk would start at or beyond it, i.e. every ``max_chunk_size`` chunks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

# The I2V condition: a 4-channel first-frame mask and the VAE latents of the first frame.
MASK_CHANNELS = 4
# CLIP ViT-H/14 penultimate-layer tokens (1 class + 16 x 16 patches) and their width.
IMAGE_TOKENS = 257
IMAGE_DIM = 1280
VAE_SPATIAL_STRIDE = 8
VAE_TEMPORAL_STRIDE = 4


class ConfigError(ValueError):
    """A config this code cannot build, naming the field."""


@dataclass(frozen=True)
class DreamZeroConfig:
    """The DiT (``action_head.model``) and the action head's chunk geometry."""

    # -- CausalWanModel (diffusion_model_cfg) --
    model_type: str = "i2v"
    patch_size: tuple[int, int, int] = (1, 2, 2)
    frame_seqlen: int = 880
    text_len: int = 512
    in_dim: int = 36
    dim: int = 5120
    ffn_dim: int = 13824
    freq_dim: int = 256
    text_dim: int = 4096
    out_dim: int = 16
    num_heads: int = 40
    num_layers: int = 40
    max_chunk_size: int = 4
    sink_size: int = 0
    qk_norm: bool = True
    cross_attn_norm: bool = True
    eps: float = 1e-6
    num_frame_per_block: int = 2
    action_dim: int = 32
    max_state_dim: int = 64
    hidden_size: int = 1024
    num_action_per_block: int = 24
    num_state_per_block: int = 1
    concat_first_frame_latent: bool = True
    image_dim: int = IMAGE_DIM          # fixed at 1280 upstream (MLPProj(1280, dim)); tiny tests shrink it
    # -- the action head (action_head_cfg.config) --
    action_horizon: int = 24
    num_frames: int = 33

    def __post_init__(self) -> None:
        object.__setattr__(self, "patch_size", tuple(int(p) for p in self.patch_size))
        for name in ("frame_seqlen", "text_len", "in_dim", "dim", "ffn_dim", "freq_dim", "text_dim",
                     "out_dim", "num_heads", "num_layers", "max_chunk_size", "num_frame_per_block",
                     "action_dim", "max_state_dim", "hidden_size", "num_action_per_block",
                     "num_state_per_block", "image_dim", "action_horizon", "num_frames"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if len(self.patch_size) != 3 or self.patch_size[0] != 1 or min(self.patch_size) < 1:
            raise ConfigError(f"patch_size must be (1, ph, pw), got {self.patch_size}")
        if self.dim % self.num_heads:
            raise ConfigError(f"dim={self.dim} is not a multiple of num_heads={self.num_heads}")
        if self.head_dim % 2 or self.head_dim < 6:
            raise ConfigError(f"head dim {self.head_dim} must be even and >= 6 (3-D RoPE)")
        if self.freq_dim % 2:
            raise ConfigError(f"freq_dim must be even, got {self.freq_dim}")
        fixed = {"model_type": "i2v", "qk_norm": True, "cross_attn_norm": True,
                 "concat_first_frame_latent": True, "sink_size": 0}
        for name, want in fixed.items():
            if getattr(self, name) != want:
                raise ConfigError(f"{name}={getattr(self, name)!r} changes the topology; "
                                  f"this model is built with {name}={want!r}")
        if self.in_dim != 2 * self.out_dim + MASK_CHANNELS:
            raise ConfigError(f"in_dim={self.in_dim} changes the topology: I2V input is latents + "
                              f"{MASK_CHANNELS} mask channels + first-frame latents = "
                              f"{2 * self.out_dim + MASK_CHANNELS} for out_dim={self.out_dim}")
        if self.action_horizon != self.num_action_per_block:
            raise ConfigError(f"action_horizon={self.action_horizon} must equal num_action_per_block="
                              f"{self.num_action_per_block}: one action block per chunk")
        if (self.num_frames - 1) % VAE_TEMPORAL_STRIDE:
            raise ConfigError(f"num_frames={self.num_frames} must be 1 + 4n video frames")

    # -- derived ---------------------------------------------------------------------

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def local_attn_size(self) -> int:
        """Latent frames one chunk attends to at most: the first frame and ``max_chunk_size`` chunks."""
        return self.max_chunk_size * self.num_frame_per_block + 1

    @property
    def register_tokens(self) -> int:
        """Action and state tokens appended to each chunk's video tokens."""
        return self.num_action_per_block + self.num_state_per_block

    @property
    def condition_latents(self) -> int:
        """Latent frames of the first-frame condition ``y`` (9 for 33 video frames)."""
        return 1 + (self.num_frames - 1) // VAE_TEMPORAL_STRIDE

    def tokens_per_frame(self, latent_height: int, latent_width: int) -> int:
        ph, pw = self.patch_size[1:]
        if latent_height % ph or latent_width % pw:
            raise ConfigError(f"latent {latent_height}x{latent_width} is not whole {ph}x{pw} patches")
        return (latent_height // ph) * (latent_width // pw)

    # -- config.json ----------------------------------------------------------------------

    @classmethod
    def from_checkpoint_config(cls, config: Mapping[str, Any]) -> "DreamZeroConfig":
        """Build from the checkpoint's ``config.json`` dict (see the module docstring)."""
        arch = config.get("architectures")
        if not isinstance(arch, list) or "VLA" not in arch:
            raise ConfigError(f"architectures is {arch!r}, expected ['VLA']")
        head = config.get("action_head_cfg")
        if not isinstance(head, Mapping) or not isinstance(head.get("config"), Mapping):
            raise ConfigError("action_head_cfg.config is missing")
        head = head["config"]
        dit = head.get("diffusion_model_cfg")
        if not isinstance(dit, Mapping):
            raise ConfigError("action_head_cfg.config.diffusion_model_cfg is missing")
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in dit.items():
            if key.startswith("_") or key == "diffusion_model_pretrained_path":
                continue   # Hydra bookkeeping; the pretrained path is a training-time source
            if key in ("action_horizon", "num_frames") or key not in names:
                raise ConfigError(f"unknown diffusion_model_cfg field {key!r}")
            kwargs[key] = tuple(value) if key == "patch_size" else value
        for key in ("action_horizon", "num_frames"):
            if key in head:
                kwargs[key] = head[key]
        if "num_frame_per_block" in head and head["num_frame_per_block"] != kwargs.get(
                "num_frame_per_block", cls.num_frame_per_block):
            raise ConfigError(f"action head num_frame_per_block={head['num_frame_per_block']} differs "
                              f"from the DiT's {kwargs.get('num_frame_per_block')}")
        if "action_dim" in head and head["action_dim"] != kwargs.get("action_dim", cls.action_dim):
            raise ConfigError(f"action head action_dim={head['action_dim']} differs from the DiT's "
                              f"{kwargs.get('action_dim', cls.action_dim)}")
        return cls(**kwargs)

    def to_checkpoint_config(self) -> dict[str, Any]:
        """A ``config.json`` dict in the published layout (the tiny checkpoint writes it)."""
        dit = {"_target_": "groot.vla.model.dreamzero.modules.wan_video_dit_action_casual_chunk.CausalWanModel",
               "_convert_": "object", "diffusion_model_pretrained_path": None}
        for f in dataclasses.fields(self):
            if f.name in ("action_horizon", "num_frames"):
                continue
            value = getattr(self, f.name)
            dit[f.name] = list(value) if f.name == "patch_size" else value
        head = {"_target_": "groot.vla.model.dreamzero.action_head.wan_flow_matching_action_tf.WANPolicyHeadConfig",
                "action_dim": self.action_dim, "action_horizon": self.action_horizon,
                "num_frames": self.num_frames, "num_frame_per_block": self.num_frame_per_block,
                "model_dtype": "float32", "diffusion_model_cfg": dit}
        return {"architectures": ["VLA"], "model_type": "vla",
                "action_head_cfg": {"_target_": "groot.vla.model.dreamzero.action_head."
                                                "wan_flow_matching_action_tf.WANPolicyHead",
                                    "config": head}}


DROID = DreamZeroConfig()

# Every code path of the 14B model at a size that runs in milliseconds on CPU: 2 layers,
# 2 heads of 12, latents of 4x4 (4 tokens a frame), 3 actions and 1 state per chunk.
TINY = DreamZeroConfig(frame_seqlen=4, text_len=6, dim=24, ffn_dim=32, freq_dim=8, text_dim=16,
                       num_heads=2, num_layers=2, max_chunk_size=2, action_dim=5, max_state_dim=6,
                       hidden_size=10, num_action_per_block=3, image_dim=8, action_horizon=3,
                       num_frames=9)

# TINY with DROID's action register (24 actions of 32 values, a 64-wide state): it serves the
# DROID protocol (observation.METADATA: 24 x 8 actions) through the same code as the 14B model.
TINY_DROID = dataclasses.replace(TINY, num_action_per_block=24, action_horizon=24, action_dim=32, max_state_dim=64)
