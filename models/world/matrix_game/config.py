"""Matrix-Game 2.0's configuration: the published ``config.json`` of each distilled variant.

Each variant folder of ``Skywork/Matrix-Game-2.0`` holds a ``config.json`` for the
``CausalWanModel`` beside its weights; ``MatrixGameConfig.from_config`` reads it. All three
published configs share the 1.8B trunk (dim 1536, 30 layers, 12 heads, FFN 8960, 36 input
channels = 16 noisy latents + 4 mask + 16 first-image latents, patch 1x2x2) and an action
module in blocks 0..14; they differ in the action inputs and the window:

    variant      folder                      keyboard  mouse  local_attn_size  steps
    universal    base_distilled_model        4 (WASD)  2      6                1000, 666, 333
    gta_drive    gta_distilled_model         2 (W/S)   2      4                1000, 666, 333
    templerun    templerun_distilled_model   7         none   6                1000, 750, 500, 250

``sink_size`` is 0 in all three. ``local_attn_size`` is the most latent frames one block
attends to, itself included (the reference allocates its rolling caches at that size), for
the self-attention and for both action attentions. The denoising steps, the timestep shift
(5.0) and the block of 3 latent frames come from the variant's ``inference_yaml``; they are
not in ``config.json`` and live in ``Variant`` below.

Topology the code implements and refuses to change (a config naming another value fails,
naming the field): ``model_type`` i2v (CLIP image tokens through ``img_emb``, no text), the
affine cross-attention LayerNorm, RMS q/k norm, a temporal patch of 1, the action q/k norm
(whose weights exist in the checkpoint but which the reference never multiplies), no qkv
bias in the action module, and a time-only action RoPE (its height and width sizes are 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

# Image-to-video input: noisy latents, a 4-channel first-frame mask, the image latents.
LATENT_CHANNELS = 16
MASK_CHANNELS = 4
CLIP_DIM = 1280             # open-clip xlm-roberta-large vit-huge-14 penultimate width
CLIP_TOKENS = 257
VAE_TEMPORAL_STRIDE = 4     # video frames per latent frame (after the first)
VAE_SPATIAL_STRIDE = 8
FRAMES_PER_BLOCK = 3        # latent frames per block (inference_yaml num_frame_per_block)
TIMESTEP_SHIFT = 5.0        # inference_yaml model_kwargs.timestep_shift
CONTEXT_NOISE = 0           # the committing pass's timestep (inference_yaml context_noise)


class ConfigError(ValueError):
    """A config or checkpoint this code does not implement; the message names the field or key."""


@dataclass(frozen=True)
class ActionConfig:
    """``action_config`` of ``config.json``: the keyboard and mouse modules of ``blocks``."""

    blocks: tuple[int, ...] = tuple(range(15))
    enable_keyboard: bool = True
    enable_mouse: bool = True
    keyboard_dim_in: int = 4
    mouse_dim_in: int = 2
    hidden_size: int = 128              # per-video-frame keyboard embedding
    keyboard_hidden_dim: int = 1024
    mouse_hidden_dim: int = 1024
    heads_num: int = 16
    img_hidden_size: int = 1536         # = the trunk's dim
    mouse_qk_dim_list: tuple[int, ...] = (8, 28, 28)   # RoPE split of the action head dim
    rope_dim_list: tuple[int, ...] = (8, 28, 28)       # read by nothing upstream; kept for the file
    rope_theta: float = 256.0
    vae_time_compression_ratio: int = VAE_TEMPORAL_STRIDE
    windows_size: int = 3               # latent frames of actions one latent frame sees
    patch_size: tuple[int, int, int] = (1, 2, 2)
    qk_norm: bool = True
    qkv_bias: bool = False

    @property
    def window_video_frames(self) -> int:
        """Video frames of actions behind one latent frame: 4 x 3 = 12."""
        return self.vae_time_compression_ratio * self.windows_size


@dataclass(frozen=True)
class MatrixGameConfig:
    """``CausalWanModel``'s config; the defaults are the universal (base) variant."""

    dim: int = 1536
    ffn_dim: int = 8960
    freq_dim: int = 256
    in_dim: int = 36
    out_dim: int = LATENT_CHANNELS
    num_heads: int = 12
    num_layers: int = 30
    eps: float = 1e-6
    patch_size: tuple[int, int, int] = (1, 2, 2)
    local_attn_size: int = 6
    sink_size: int = 0
    text_len: int = 512
    action: ActionConfig = field(default_factory=ActionConfig)

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    def __post_init__(self) -> None:
        if self.dim % self.num_heads or self.head_dim % 2:
            raise ConfigError(f"dim {self.dim} is not num_heads {self.num_heads} heads of an even width")
        if self.in_dim != 2 * LATENT_CHANNELS + MASK_CHANNELS or self.out_dim != LATENT_CHANNELS:
            raise ConfigError(f"in_dim/out_dim must be {2 * LATENT_CHANNELS + MASK_CHANNELS}/"
                              f"{LATENT_CHANNELS} (i2v latents), got {self.in_dim}/{self.out_dim}")
        if self.patch_size[0] != 1:
            raise ConfigError(f"patch_size {self.patch_size}: only a temporal patch of 1 is implemented")
        if self.local_attn_size < FRAMES_PER_BLOCK + self.sink_size:
            raise ConfigError(f"local_attn_size {self.local_attn_size} must hold the sink "
                              f"({self.sink_size}) and one block ({FRAMES_PER_BLOCK}); -1 (global) "
                              f"is not served")
        a = self.action
        if any(not 0 <= b < self.num_layers for b in a.blocks):
            raise ConfigError(f"action_config.blocks {a.blocks} outside 0..{self.num_layers - 1}")
        if a.img_hidden_size != self.dim:
            raise ConfigError(f"action_config.img_hidden_size {a.img_hidden_size} != dim {self.dim}")
        if not a.enable_keyboard:
            raise ConfigError("action_config.enable_keyboard false: every published variant has a keyboard")
        for name, width in (("keyboard_hidden_dim", a.keyboard_hidden_dim),
                            ("mouse_hidden_dim", a.mouse_hidden_dim)):
            if width % a.heads_num:
                raise ConfigError(f"action_config.{name} {width} is not heads_num {a.heads_num} heads")
        if a.enable_mouse and a.keyboard_hidden_dim != a.mouse_hidden_dim:
            # One RoPE table (mouse_qk_dim_list) serves both attentions upstream.
            raise ConfigError("action_config.keyboard_hidden_dim must equal mouse_hidden_dim")
        if sum(a.mouse_qk_dim_list) != a.keyboard_hidden_dim // a.heads_num:
            # Read for the keyboard too, so a keyboard-only config (templerun) relies on its default.
            raise ConfigError(f"action_config.mouse_qk_dim_list {a.mouse_qk_dim_list} must sum to the "
                              f"action head dim {a.keyboard_hidden_dim // a.heads_num}")
        if a.mouse_qk_dim_list[0] % 2:
            raise ConfigError(f"action_config.mouse_qk_dim_list[0] {a.mouse_qk_dim_list[0]} must be even")
        if not a.qk_norm or a.qkv_bias or tuple(a.patch_size) != tuple(self.patch_size):
            raise ConfigError("action_config: qk_norm true, qkv_bias false and the trunk's patch_size "
                              "are the implemented wiring")

    # -- the published file ---------------------------------------------------------------

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "MatrixGameConfig":
        """Parse a variant's ``config.json``; an unknown field or another wiring fails naming it."""
        cfg = dict(config)
        if cfg.pop("_class_name", "CausalWanModel") != "CausalWanModel":
            raise ConfigError(f"_class_name {config['_class_name']!r}: expected 'CausalWanModel'")
        for key in [k for k in cfg if k.startswith("_")]:
            cfg.pop(key)
        for key, want in (("model_type", "i2v"), ("inject_sample_info", False), ("qk_norm", True),
                          ("cross_attn_norm", True)):
            if key in cfg and cfg.pop(key) != want:
                raise ConfigError(f"{key} {config[key]!r}: only {want!r} is implemented")
        action = cfg.pop("action_config", None)
        if not action:
            raise ConfigError("action_config missing: Matrix-Game variants all have an action module")
        known = {f.name for f in fields(cls)} - {"action"}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise ConfigError(f"unknown config field {unknown[0]!r}")
        if "patch_size" in cfg:
            cfg["patch_size"] = tuple(cfg["patch_size"])
        return cls(**cfg, action=_action_from_config(action))

    def to_config(self) -> dict[str, Any]:
        """The ``config.json`` dict this config was (or would be) read from."""
        a = self.action
        action: dict[str, Any] = {
            "blocks": list(a.blocks), "enable_keyboard": a.enable_keyboard, "enable_mouse": a.enable_mouse,
            "heads_num": a.heads_num, "hidden_size": a.hidden_size, "img_hidden_size": a.img_hidden_size,
            "keyboard_dim_in": a.keyboard_dim_in, "keyboard_hidden_dim": a.keyboard_hidden_dim,
            "patch_size": list(a.patch_size), "qk_norm": a.qk_norm, "qkv_bias": a.qkv_bias,
            "rope_dim_list": list(a.rope_dim_list), "rope_theta": _number(a.rope_theta),
            "vae_time_compression_ratio": a.vae_time_compression_ratio, "windows_size": a.windows_size}
        if a.enable_mouse:
            action.update(mouse_dim_in=a.mouse_dim_in, mouse_hidden_dim=a.mouse_hidden_dim)
        if a.enable_mouse or a.mouse_qk_dim_list != ActionConfig.mouse_qk_dim_list:
            action["mouse_qk_dim_list"] = list(a.mouse_qk_dim_list)
        return {"_class_name": "CausalWanModel", "_diffusers_version": "0.35.0.dev0",
                "action_config": dict(sorted(action.items())), "dim": self.dim, "eps": self.eps,
                "ffn_dim": self.ffn_dim, "freq_dim": self.freq_dim, "in_dim": self.in_dim,
                "inject_sample_info": False, "local_attn_size": self.local_attn_size, "model_type": "i2v",
                "num_heads": self.num_heads, "num_layers": self.num_layers, "out_dim": self.out_dim,
                "sink_size": self.sink_size, "text_len": self.text_len}


def _number(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


def _action_from_config(action: Mapping[str, Any]) -> ActionConfig:
    a = dict(action)
    a.pop("local_attn_size", None)   # the reference passes the trunk's value in; never read from here
    known = {f.name for f in fields(ActionConfig)}
    unknown = sorted(set(a) - known)
    if unknown:
        raise ConfigError(f"unknown action_config field {unknown[0]!r}")
    for key in ("blocks", "mouse_qk_dim_list", "rope_dim_list", "patch_size"):
        if key in a:
            a[key] = tuple(a[key])
    if "rope_theta" in a:
        a["rope_theta"] = float(a["rope_theta"])
    return ActionConfig(**a)


# -- the three published variants ------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    """A published variant: its folder and weights file under the checkpoint root, and the
    few-step schedule of its ``inference_yaml`` (``denoising_step_list``, warped)."""

    name: str
    folder: str
    weights: str
    steps: tuple[int, ...]
    keyboard_dim: int
    mouse: bool


VARIANTS: dict[str, Variant] = {
    "universal": Variant("universal", "base_distilled_model", "base_distill.safetensors",
                         (1000, 666, 333), 4, True),
    "gta_drive": Variant("gta_drive", "gta_distilled_model", "gta_keyboard2dim.safetensors",
                         (1000, 666, 333), 2, True),
    "templerun": Variant("templerun", "templerun_distilled_model", "templerun_7dim_onlykey.safetensors",
                         (1000, 750, 500, 250), 7, False),
}

# The published configs (full size), as ``from_config`` reads them.
FULL: dict[str, MatrixGameConfig] = {
    "universal": MatrixGameConfig(),
    "gta_drive": MatrixGameConfig(local_attn_size=4, action=ActionConfig(keyboard_dim_in=2)),
    "templerun": MatrixGameConfig(action=ActionConfig(keyboard_dim_in=7, enable_mouse=False)),
}

# Tiny configs for tests: the same wiring (action modules in the first blocks, the variants'
# key counts and windows) at widths that run in milliseconds on a CPU.
_TINY_ACTION = ActionConfig(blocks=(0, 1), hidden_size=8, keyboard_hidden_dim=16, mouse_hidden_dim=16,
                            heads_num=2, img_hidden_size=32, mouse_qk_dim_list=(4, 2, 2),
                            rope_dim_list=(4, 2, 2))
TINY_BASE = MatrixGameConfig(dim=32, ffn_dim=64, freq_dim=16, num_heads=2, num_layers=3,
                             action=_TINY_ACTION)
TINY: dict[str, MatrixGameConfig] = {
    "universal": TINY_BASE,
    "gta_drive": replace(TINY_BASE, local_attn_size=4, action=replace(_TINY_ACTION, keyboard_dim_in=2)),
    # The keyboard-only file carries no mouse fields, so its tiny config keeps their defaults.
    "templerun": replace(TINY_BASE, action=replace(_TINY_ACTION, keyboard_dim_in=7, enable_mouse=False,
                                                   mouse_hidden_dim=ActionConfig.mouse_hidden_dim)),
}
