"""The DreamZero checkpoint folder (``GEAR-Dreams/DreamZero-DROID``): checked, then loaded.

Layout::

    config.json                        architectures ["VLA"], action_head_cfg.config...  (config.py)
    model.safetensors.index.json       weight_map: tensor name -> shard file
    model-0000N-of-00010.safetensors   the shards
    experiment_cfg/metadata.json       per embodiment: GR00T DatasetMetadata (statistics q01/q99, ...)
    experiment_cfg/conf.yaml           the training config (transforms, concat order)

Tensor names by prefix (upstream ``VLA`` -> ``WANPolicyHead``)::

    action_head.model.*           the DiT (model.py; 1317 tensors at 14B)
    action_head.text_encoder.*    Wan's umt5-xxl encoder (blocks.N.attn.q, ffn.gate.0, ...)
    action_head.image_encoder.*   Wan's CLIP ViT-H/14
    action_head.vae.model.*       the Wan2.1 VAE (original Wan names: encoder.conv1, ...)

Every name is accounted for before a byte of weights is read: a name outside these
prefixes, or one its component's module does not have, fails naming it ("unknown"), as
does a name a module needs that the index lacks ("missing"; the encoders' layer counts
are read from the names); a shard that lacks a name its index lists, or a tensor of
another shape, fails naming both. The DiT is built on the meta device and
filled shard by shard (one shard open at a time). The other components' tensors are read
into one name -> tensor map each (prefix removed) and then loaded, every name checked the
same way, into their modules: ``text_encoder.py`` (transformers' UMT5 encoder),
``image_encoder.py`` (the CLIP vision tower) and ``vae.py`` (diffusers' AutoencoderKLWan).
The umt5-xxl tokenizer is not part of the folder (upstream takes it from google/umt5-xxl).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import safe_open

from models.policy.dreamzero.config import ConfigError, DreamZeroConfig
from models.policy.dreamzero.model import DreamZeroDiT

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"
METADATA_PATH = Path("experiment_cfg") / "metadata.json"
CONF_PATH = Path("experiment_cfg") / "conf.yaml"

DIT_PREFIX = "action_head.model."
# component -> prefix of its tensors (the DiT is loaded into DreamZeroDiT, these as maps).
COMPONENT_PREFIXES = {
    "text_encoder": "action_head.text_encoder.",
    "image_encoder": "action_head.image_encoder.",
    "vae": "action_head.vae.model.",
}


class CheckpointError(ValueError):
    """A checkpoint folder that does not hold what this model expects (names the problem)."""


def shard_name(i: int, n: int) -> str:
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def _json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path.parent}: expected {path.name} ({what})")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not readable JSON ({e})") from None


def read_config(root: str | Path) -> DreamZeroConfig:
    path = Path(root) / CONFIG_NAME
    data = _json(path, "the VLA config")
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    try:
        return DreamZeroConfig.from_checkpoint_config(data)
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from None


def read_metadata(root: str | Path) -> dict[str, Any]:
    """``experiment_cfg/metadata.json``: embodiment tag -> its metadata (normalisation statistics
    under ``statistics``); what ``observation.Normalizer.from_metadata`` reads."""
    path = Path(root) / METADATA_PATH
    data = _json(path, "normalisation statistics per embodiment")
    if not isinstance(data, dict) or not data:
        raise CheckpointError(f"{path}: expected a JSON object with one entry per embodiment")
    return data


def weight_map(root: str | Path) -> dict[str, str]:
    path = Path(root) / INDEX_NAME
    data = _json(path, "the shard index")
    wm = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wm, dict) or not wm:
        raise CheckpointError(f"{path}: no weight_map")
    return {str(k): str(v) for k, v in wm.items()}


def dit_shapes(model: DreamZeroDiT) -> dict[str, tuple[int, ...]]:
    """The checkpoint's DiT names (``action_head.model.`` + parameter name) and shapes."""
    return {DIT_PREFIX + n: tuple(p.shape) for n, p in model.named_parameters()}


def _component_of(name: str) -> str | None:
    if name.startswith(DIT_PREFIX):
        return "dit"
    for comp, prefix in COMPONENT_PREFIXES.items():
        if name.startswith(prefix):
            return comp
    return None


def _expected_component_names(names: set[str]) -> set[str]:
    """The full names each component's module needs, sized from the names found (layer counts)."""
    from models.policy.dreamzero import image_encoder, text_encoder, vae

    modules = {"text_encoder": text_encoder, "image_encoder": image_encoder, "vae": vae}
    out: set[str] = set()
    for comp, prefix in COMPONENT_PREFIXES.items():
        found = {n[len(prefix):] for n in names if n.startswith(prefix)}
        if found:
            out |= {prefix + n for n in modules[comp].expected_names(found)}
    return out


def check_names(expected_dit: dict[str, tuple[int, ...]], names: set[str], where: str) -> None:
    """Every name belongs to a known component and is one its module has; every name the
    modules need is there. Checked before any tensor is read."""
    expected = set(expected_dit) | _expected_component_names(names)
    unknown = sorted(n for n in names if n not in expected)
    missing = sorted(expected - names)
    empty = [c for c, p in COMPONENT_PREFIXES.items() if not any(n.startswith(p) for n in names)]
    parts = []
    if missing:
        parts.append(f"missing {len(missing)} key(s), first {missing[:5]}")
    if unknown:
        parts.append(f"unknown {len(unknown)} key(s), first {unknown[:5]}")
    if empty:
        parts.append(f"no tensors for {empty} (prefixes {[COMPONENT_PREFIXES[c] for c in empty]})")
    if parts:
        raise CheckpointError(f"{where}: " + "; ".join(parts))


def validate_checkpoint(root: str | Path) -> DreamZeroConfig:
    """Check the folder's files, config and tensor names (no weights read); returns the config."""
    root = Path(root)
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a folder (expected a DreamZero checkpoint)")
    cfg = read_config(root)
    read_metadata(root)
    conf = root / CONF_PATH
    if not conf.is_file() or conf.stat().st_size == 0:
        raise CheckpointError(f"{conf.parent}: expected {conf.name} (the training config)")
    wm = weight_map(root)
    for shard in sorted(set(wm.values())):
        if not (root / shard).is_file():
            raise CheckpointError(f"{root}: shard {shard} listed in {INDEX_NAME} is missing")
    with torch.device("meta"):
        model = DreamZeroDiT(cfg)
    check_names(dit_shapes(model), set(wm), str(root / INDEX_NAME))
    return cfg


@dataclass
class Checkpoint:
    """A loaded folder: the DiT, the encoders and the VAE, and the metadata."""

    config: DreamZeroConfig
    dit: DreamZeroDiT
    text_encoder: Any        # transformers.UMT5EncoderModel
    image_encoder: Any       # image_encoder.WanImageEncoder
    vae: Any                 # diffusers.AutoencoderKLWan
    metadata: dict[str, Any] = field(repr=False)
    root: Path


def load_checkpoint(root: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                    on_shard: Callable[[int, int, str], None] | None = None,
                    vae_dtype: torch.dtype = torch.float32) -> Checkpoint:
    """Validate ``root``, then read every tensor of every shard exactly once: DiT tensors into
    the model, the rest into their component's map, then into its module (all ``dtype`` on
    ``device``, the VAE ``vae_dtype``). ``on_shard(i, n, file)`` runs after each shard is
    read and closed."""
    from models.policy.dreamzero.image_encoder import build_image_encoder
    from models.policy.dreamzero.text_encoder import build_text_encoder
    from models.policy.dreamzero.vae import build_vae

    root = Path(root)
    cfg = validate_checkpoint(root)
    wm = weight_map(root)
    with torch.device("meta"):
        model = DreamZeroDiT(cfg)
    model = model.to_empty(device=device).to(dtype)
    params = dict(model.named_parameters())
    components: dict[str, dict[str, torch.Tensor]] = {c: {} for c in COMPONENT_PREFIXES}
    by_shard: dict[str, list[str]] = {}
    for name, shard in wm.items():
        by_shard.setdefault(shard, []).append(name)
    loaded: set[str] = set()
    for i, (shard, names) in enumerate(sorted(by_shard.items())):
        path = root / shard
        with safe_open(str(path), framework="pt") as f:
            absent = sorted(set(names) - set(f.keys()))
            if absent:
                raise CheckpointError(f"{path}: the index lists {absent[:5]} here but the shard lacks them")
            for name in names:
                t = f.get_tensor(name)
                comp = _component_of(name)
                if comp == "dit":
                    p = params[name[len(DIT_PREFIX):]]
                    if tuple(t.shape) != tuple(p.shape):
                        raise CheckpointError(f"{path}: {name} has shape {tuple(t.shape)}, "
                                              f"expected {tuple(p.shape)}")
                    with torch.no_grad():
                        p.copy_(t)
                else:
                    components[comp][name[len(COMPONENT_PREFIXES[comp]):]] = t
                loaded.add(name)
        log.info("dreamzero: shard %d/%d read (%s, %d tensors)", i + 1, len(by_shard), shard, len(names))
        if on_shard is not None:
            on_shard(i, len(by_shard), shard)
    if loaded != set(wm):   # the index names what was read; nothing else can be
        raise CheckpointError(f"{root}: {sorted(set(wm) - loaded)[:5]} listed but not read")
    text = build_text_encoder(components.pop("text_encoder"), device, dtype)
    image = build_image_encoder(components.pop("image_encoder"), device, dtype)
    vae = build_vae(components.pop("vae"), device, vae_dtype)
    return Checkpoint(cfg, model.eval(), text, image, vae, read_metadata(root), root)
