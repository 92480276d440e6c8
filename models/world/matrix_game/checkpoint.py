"""Loading a published Matrix-Game 2.0 variant exactly.

Layout of ``Skywork/Matrix-Game-2.0`` (one folder per variant beside the shared VAE and CLIP)::

    ROOT/
      Wan2.1_VAE.pth
      models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth
      base_distilled_model/       config.json  base_distill.safetensors
      gta_distilled_model/        config.json  gta_keyboard2dim.safetensors
      templerun_distilled_model/  config.json  templerun_7dim_onlykey.safetensors

The weights file is the state dict of upstream's ``WanDiffusionWrapper``, so every name
carries the ``model.`` prefix (``model.blocks.0.action_model.keyboard_embed.0.weight``). The
loader reads the config, builds the network it describes (the key count and the mouse come
from ``action_config``), and then requires the file to hold exactly that network's tensors:
an unknown key, a missing key or a shape off the config fails naming the first such key,
before any tensor is copied.

The shared files beside the variants (``load_vae``, ``load_clip``): ``Wan2.1_VAE.pth`` is the
state dict of Wan's ``WanVAE_`` in its original names (loaded into diffusers'
``AutoencoderKLWan`` by the name map DreamZero's loader uses, every name required); the CLIP
file is the state dict of open-clip's ``XLMRobertaCLIP``: its vision tower and logit scale
(``visual.*``, ``log_scale``) load into ``models/world/wan_clip.py`` exactly, its text tower
(``textual.*``) is skipped, since Matrix-Game conditions on the image alone, and any other
name fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from models.world.matrix_game.config import VARIANTS, ConfigError, MatrixGameConfig, Variant
from models.world.matrix_game.model import MatrixGameDiT

PREFIX = "model."
CONFIG_NAME = "config.json"
VAE_FILE = "Wan2.1_VAE.pth"
CLIP_FILE = "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"
CLIP_TEXT_PREFIX = "textual."


def variant_folder(root: str | Path, variant: str) -> Path:
    """``ROOT/<variant folder>`` of a published variant (``universal``, ``gta_drive``, ``templerun``)."""
    if variant not in VARIANTS:
        raise ConfigError(f"unknown variant {variant!r}; expected one of {sorted(VARIANTS)}")
    return Path(root) / VARIANTS[variant].folder


def find_variant(folder: str | Path) -> Variant:
    """The variant whose weights file ``folder`` holds (exactly one of the published names)."""
    folder = Path(folder)
    found = [v for v in VARIANTS.values() if (folder / v.weights).is_file()]
    if len(found) != 1:
        names = ", ".join(v.weights for v in VARIANTS.values())
        raise ConfigError(f"{folder}: expected exactly one of {names}, found "
                          f"{[v.weights for v in found] or 'none'}")
    return found[0]


def read_config(folder: str | Path) -> MatrixGameConfig:
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        raise ConfigError(f"{path}: missing (the variant's CausalWanModel config)")
    with open(path) as f:
        return MatrixGameConfig.from_config(json.load(f))


def expected_shapes(model: MatrixGameDiT) -> dict[str, tuple[int, ...]]:
    """The file's names (with the prefix) and shapes for ``model``."""
    return {PREFIX + name: tuple(p.shape) for name, p in model.named_parameters()}


def check_keys(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], path: Path) -> None:
    """Fail naming the first unknown key, then the first missing key, then the first shape off."""
    unknown = sorted(set(found) - set(expected))
    if unknown:
        raise ConfigError(f"{path}: unknown tensor {unknown[0]!r} ({len(unknown)} unknown)")
    missing = sorted(set(expected) - set(found))
    if missing:
        raise ConfigError(f"{path}: missing tensor {missing[0]!r} ({len(missing)} missing)")
    for name in sorted(expected):
        if found[name] != expected[name]:
            raise ConfigError(f"{path}: tensor {name!r} has shape {found[name]}, the config makes "
                              f"{expected[name]}")


def load_variant(folder: str | Path, *, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> tuple[MatrixGameDiT, Variant]:
    """Build and load the variant in ``folder`` (its ``config.json`` and weights file)."""
    folder = Path(folder)
    variant = find_variant(folder)
    cfg = read_config(folder)
    keys = cfg.action.keyboard_dim_in
    if (keys, cfg.action.enable_mouse) != (variant.keyboard_dim, variant.mouse):
        # The config decides the network; a published file name with another action set is a
        # config from a different variant, worth a clear word before the shapes disagree.
        raise ConfigError(f"{folder / CONFIG_NAME}: {keys} keys, mouse {cfg.action.enable_mouse}; "
                          f"{variant.weights} is {variant.name} ({variant.keyboard_dim} keys, "
                          f"mouse {variant.mouse})")
    with torch.device("meta"):
        model = MatrixGameDiT(cfg)
    path = folder / variant.weights
    with safe_open(str(path), framework="pt") as f:
        found = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        check_keys(expected_shapes(model), found, path)
        state = {name[len(PREFIX):]: f.get_tensor(name).to(device=device, dtype=dtype) for name in found}
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval().requires_grad_(False), variant


def _read_pth(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ConfigError(f"{path}: missing")
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:   # a file torch cannot read as a plain state dict
        raise ConfigError(f"{path}: not a state dict of tensors ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"{path}: not a state dict of tensors")
    return state


def load_vae(root: str | Path, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
    """``ROOT/Wan2.1_VAE.pth`` as diffusers' ``AutoencoderKLWan`` (every original name required)."""
    from models.world.wan_vae_build import build_vae

    path = Path(root) / VAE_FILE
    try:
        return build_vae(_read_pth(path), device, dtype)
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None


def load_clip(root: str | Path, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
    """The CLIP vision tower of ``ROOT/models_clip_...pth`` (``wan_clip.WanImageEncoder``)."""
    from models.world.wan_clip import ClipError, build_image_encoder

    path = Path(root) / CLIP_FILE
    state = _read_pth(path)
    vision = {PREFIX + k: v for k, v in state.items() if not k.startswith(CLIP_TEXT_PREFIX)}
    try:
        return build_image_encoder(vision, device, dtype)
    except ClipError as e:
        raise ConfigError(f"{path}: {e}") from None


def validate_root(root: str | Path, variant: str) -> Path:
    """The variant's folder under ``root`` once the files a server needs are there (before any
    is read): the variant's config and weights, the VAE, the CLIP file."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"{root}: not a folder (the Matrix-Game-2.0 checkpoint root)")
    folder = variant_folder(root, variant)
    v = VARIANTS[variant]
    for path in (folder / CONFIG_NAME, folder / v.weights, root / VAE_FILE, root / CLIP_FILE):
        if not path.is_file():
            raise ConfigError(f"{path}: missing (expected the Skywork/Matrix-Game-2.0 layout)")
    return folder
