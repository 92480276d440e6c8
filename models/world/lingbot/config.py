"""The transformer's configuration, in the checkpoint's own (diffusers) field names.

``transformer/config.json`` of ``robbyant/lingbot-world-v2-14b-causal-fast-diffusers``
holds these fields; the defaults here are that checkpoint's values, so
``LingBotTransformerConfig()`` is the 14B model. Fields fall in two groups:

* sizes (heads, head dim, layers, widths, channels): any positive value builds a
  model; the tests use tiny ones;
* topology: how the network is wired (the cross-attention LayerNorm, RMS q/k norm
  across heads, no image-embedding branch, a temporal patch of 1, the sink +
  window cache). This code implements exactly the checkpoint's wiring, so a config
  that changes one of these is refused, naming the field.

The cache geometry: ``sliding_window_num_frames`` is the most latent frames one
block attends to, the sink and the block itself included (the reference allocates
its rolling cache at that size). With sink 9 and blocks of 3 that leaves 6 rolling
frames kept between blocks::

    frames attended by one block:  [ sink 0..8 ][ 6 most recent ][ block (3) ] = 18
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

# Keys of a diffusers config.json that describe the file, not the network.
_METADATA_PREFIX = "_"

# Plücker rays have 6 channels; one latent pixel covers 8x8 video pixels (the Wan VAE's
# spatial stride), folded into channels before the patch embedding.
PLUCKER_CHANNELS = 6
VAE_SPATIAL_STRIDE = 8
VAE_TEMPORAL_STRIDE = 4
CAMERA_CHANNELS = PLUCKER_CHANNELS * VAE_SPATIAL_STRIDE * VAE_SPATIAL_STRIDE  # 384
# Image-to-video input: noisy latents, a 4-channel first-frame mask, the image latents.
MASK_CHANNELS = VAE_TEMPORAL_STRIDE


class ConfigError(ValueError):
    """A transformer config this code cannot build, naming the field."""


@dataclass(frozen=True)
class LingBotTransformerConfig:
    patch_size: tuple[int, int, int] = (1, 2, 2)
    num_attention_heads: int = 40
    attention_head_dim: int = 128
    in_channels: int = 36
    out_channels: int = 16
    text_dim: int = 4096
    freq_dim: int = 256
    ffn_dim: int = 13824
    num_layers: int = 40
    cross_attn_norm: bool = True
    eps: float = 1e-6
    image_dim: int | None = None
    added_kv_proj_dim: int | None = None
    rope_max_seq_len: int = 1024
    pos_embed_seq_len: int | None = None
    qk_norm: str = "rms_norm_across_heads"
    sink_size: int = 9
    num_frames_per_block: int = 3
    sliding_window_num_frames: int = 18
    local_attn_size: int = -1

    def __post_init__(self) -> None:
        object.__setattr__(self, "patch_size", tuple(int(p) for p in self.patch_size))
        if len(self.patch_size) != 3 or min(self.patch_size) < 1:
            raise ConfigError(f"patch_size must be three positive integers, got {self.patch_size}")
        for name in ("num_attention_heads", "attention_head_dim", "in_channels", "out_channels",
                     "text_dim", "freq_dim", "ffn_dim", "num_layers", "rope_max_seq_len",
                     "num_frames_per_block", "sliding_window_num_frames"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.attention_head_dim % 2 or self.attention_head_dim < 6:
            # 3-D RoPE rotates pairs: time gets d - 4*(d//6) dims, height and width 2*(d//6) each.
            raise ConfigError(f"attention_head_dim must be even and >= 6, got {self.attention_head_dim}")
        if self.freq_dim % 2:
            raise ConfigError(f"freq_dim must be even, got {self.freq_dim}")
        # Topology: wired one way only.
        fixed = {"cross_attn_norm": True, "image_dim": None, "added_kv_proj_dim": None,
                 "pos_embed_seq_len": None, "qk_norm": "rms_norm_across_heads",
                 "local_attn_size": -1}
        for name, want in fixed.items():
            if getattr(self, name) != want:
                raise ConfigError(f"{name}={getattr(self, name)!r} changes the topology; "
                                  f"this model is built with {name}={want!r}")
        if self.patch_size[0] != 1:
            raise ConfigError(f"patch_size[0] (temporal patch) must be 1, got {self.patch_size[0]}")
        if self.in_channels != 2 * self.out_channels + MASK_CHANNELS:
            raise ConfigError(
                f"in_channels={self.in_channels} changes the topology: image-to-video input is "
                f"latents + {MASK_CHANNELS} mask channels + image latents = "
                f"{2 * self.out_channels + MASK_CHANNELS} for out_channels={self.out_channels}")
        if self.sink_size < 0:
            raise ConfigError(f"sink_size must be >= 0, got {self.sink_size}")
        if self.sink_size % self.num_frames_per_block:
            raise ConfigError(f"sink_size={self.sink_size} must be whole blocks of "
                              f"num_frames_per_block={self.num_frames_per_block}")
        if self.rolling_frames < 0 or self.rolling_frames % self.num_frames_per_block:
            raise ConfigError(
                f"sliding_window_num_frames={self.sliding_window_num_frames} must hold the sink "
                f"({self.sink_size}), the block ({self.num_frames_per_block}) and whole blocks "
                f"of recent frames")

    # -- derived ---------------------------------------------------------------

    @property
    def dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def rolling_frames(self) -> int:
        """Recent frames kept between blocks, besides the sink."""
        return self.sliding_window_num_frames - self.sink_size - self.num_frames_per_block

    @property
    def camera_in_features(self) -> int:
        p = self.patch_size
        return CAMERA_CHANNELS * p[0] * p[1] * p[2]

    def tokens_per_frame(self, latent_height: int, latent_width: int) -> int:
        ph, pw = self.patch_size[1], self.patch_size[2]
        if latent_height % ph or latent_width % pw:
            raise ConfigError(f"latent {latent_height}x{latent_width} is not whole patches of {ph}x{pw}")
        return (latent_height // ph) * (latent_width // pw)

    # -- diffusers config.json ----------------------------------------------------

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "LingBotTransformerConfig":
        """Build from a diffusers ``config.json`` dict; ``_class_name`` and other ``_`` keys
        are ignored, an unknown field is refused by name, missing fields take the defaults."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in config.items():
            if key.startswith(_METADATA_PREFIX):
                continue
            if key not in names:
                raise ConfigError(f"unknown transformer config field {key!r}")
            kwargs[key] = tuple(value) if key == "patch_size" else value
        return cls(**kwargs)

    def to_config(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["patch_size"] = list(self.patch_size)
        return {"_class_name": "CausalLingBotWorldTransformer3DModel", **d}

    def differences(self, other: "LingBotTransformerConfig") -> list[str]:
        """Fields whose values differ, as ``name: mine != theirs``."""
        return [f"{f.name}: {getattr(self, f.name)!r} != {getattr(other, f.name)!r}"
                for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(other, f.name)]


CHECKPOINT_CONFIG = LingBotTransformerConfig()
