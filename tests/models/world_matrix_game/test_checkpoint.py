"""Exact loading of a variant folder: every tensor in place, an unknown or a missing key
named, the key count taken from the variant's config."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from models.world.matrix_game.checkpoint import load_variant, variant_folder
from models.world.matrix_game.config import FULL, TINY, VARIANTS, ConfigError, MatrixGameConfig
from models.world.matrix_game.model import MatrixGameDiT


@pytest.mark.parametrize("variant,keys,mouse", [("universal", 4, True), ("gta_drive", 2, True),
                                                ("templerun", 7, False)])
def test_tiny_variant_loads_every_tensor_in_place(tiny_root, variant, keys, mouse):
    folder = variant_folder(tiny_root, variant)
    model, found = load_variant(folder)
    assert found == VARIANTS[variant]
    assert model.config == TINY[variant]
    written = load_file(str(folder / VARIANTS[variant].weights))
    state = model.state_dict()
    assert sorted("model." + k for k in state) == sorted(written)
    for name, t in written.items():
        assert torch.equal(state[name[len("model."):]], t), name
    act = model.blocks[0].action_model
    assert act.keyboard_embed[0].weight.shape == (8, keys)
    assert hasattr(act, "mouse_mlp") == mouse
    assert model.blocks[2].action_model is None     # tiny: actions in blocks 0 and 1 only


def _copy(tiny_root, tmp_path, variant):
    dst = tmp_path / VARIANTS[variant].folder
    shutil.copytree(variant_folder(tiny_root, variant), dst)
    return dst, dst / VARIANTS[variant].weights


def test_an_extra_key_fails_naming_it(tiny_root, tmp_path):
    folder, path = _copy(tiny_root, tmp_path, "universal")
    state = load_file(str(path))
    state["model.blocks.0.action_model.extra.weight"] = torch.zeros(2)
    save_file(state, str(path))
    with pytest.raises(ConfigError, match=r"unknown tensor 'model\.blocks\.0\.action_model\.extra\.weight'"):
        load_variant(folder)


def test_a_missing_key_fails_naming_it(tiny_root, tmp_path):
    folder, path = _copy(tiny_root, tmp_path, "gta_drive")
    state = load_file(str(path))
    del state["model.blocks.1.action_model.img_attn_k_norm.weight"]
    save_file(state, str(path))
    with pytest.raises(ConfigError, match=r"missing tensor 'model\.blocks\.1\.action_model\.img_attn_k_norm\.weight'"):
        load_variant(folder)


def test_the_key_count_comes_from_the_config(tiny_root, tmp_path):
    # A universal file (4 keys) beside a config that says 7: the shapes are off the config.
    folder, path = _copy(tiny_root, tmp_path, "universal")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["action_config"]["keyboard_dim_in"] = 7
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="7 keys"):
        load_variant(folder)
    # Templerun's file with a mouse-enabled config: the mouse tensors are missing, named.
    folder, path = _copy(tiny_root, tmp_path, "templerun")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["action_config"].update(enable_mouse=True, mouse_dim_in=2, mouse_hidden_dim=16, mouse_qk_dim_list=[4, 2, 2])
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="mouse True"):
        load_variant(folder)


def test_an_unknown_config_field_fails_naming_it():
    cfg = FULL["universal"].to_config()
    cfg["num_registers"] = 4
    with pytest.raises(ConfigError, match="'num_registers'"):
        MatrixGameConfig.from_config(cfg)
    cfg = FULL["universal"].to_config()
    cfg["action_config"]["enable_gamepad"] = True
    with pytest.raises(ConfigError, match="'enable_gamepad'"):
        MatrixGameConfig.from_config(cfg)


# Parameter counts of the published configs; at float32 they are the published files' sizes
# (base_distill 6.48 GB, gta_keyboard2dim 6.48 GB, templerun_7dim_onlykey 6.03 GB).
PARAMS = {"universal": 1_619_242_304, "gta_drive": 1_619_238_464, "templerun": 1_508_715_584}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_published_configs_round_trip_and_match_the_file_sizes(variant):
    cfg = FULL[variant]
    assert MatrixGameConfig.from_config(cfg.to_config()) == cfg
    with torch.device("meta"):
        model = MatrixGameDiT(cfg)
    assert sum(p.numel() for p in model.parameters()) == PARAMS[variant]
    assert round(PARAMS[variant] * 4 / 1e9, 2) == {"universal": 6.48, "gta_drive": 6.48, "templerun": 6.03}[variant]


# -- the root's shared files ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def full_root(tmp_path_factory):
    from models.world.matrix_game.tiny_checkpoint import write_tiny_root

    return write_tiny_root(tmp_path_factory.mktemp("matrix_game_full_root"), ("universal",))


def _copy_root(full_root, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(full_root, root)
    return root


def test_the_root_loads_the_vae_and_the_clip_vision_tower_exactly(full_root):
    from models.world.matrix_game.checkpoint import CLIP_FILE, VAE_FILE, load_clip, load_vae

    vae, clip = load_vae(full_root), load_clip(full_root)
    vae_file = torch.load(full_root / VAE_FILE, weights_only=True)
    clip_file = torch.load(full_root / CLIP_FILE, weights_only=True)
    assert torch.equal(dict(vae.named_parameters())["encoder.conv_in.weight"], vae_file["encoder.conv1.weight"])
    params = dict(clip.named_parameters())
    assert len(params) == len([k for k in clip_file if not k.startswith("textual.")])
    assert torch.equal(params["model.visual.transformer.0.attn.to_qkv.weight"],
                       clip_file["visual.transformer.0.attn.to_qkv.weight"])


@pytest.mark.parametrize("file, edit, text", [
    ("clip", lambda sd: sd.update({"visual.extra": torch.zeros(1)}), "unknown"),
    ("clip", lambda sd: sd.pop("visual.head"), "missing"),
    ("vae", lambda sd: sd.pop("decoder.conv1.bias"), "missing"),
    ("vae", lambda sd: sd.update({"decoder.conv1.bias": torch.zeros(3)}), "shape"),
])
def test_a_vae_or_clip_file_off_the_layout_fails_naming_it(full_root, tmp_path, file, edit, text):
    from models.world.matrix_game.checkpoint import CLIP_FILE, VAE_FILE, load_clip, load_vae

    root = _copy_root(full_root, tmp_path)
    name, load = (CLIP_FILE, load_clip) if file == "clip" else (VAE_FILE, load_vae)
    sd = torch.load(root / name, weights_only=True)
    edit(sd)
    torch.save(sd, root / name)
    with pytest.raises(ConfigError, match=text) as info:
        load(root)
    assert name in str(info.value)


def test_validate_root_names_the_first_missing_file(full_root, tmp_path):
    from models.world.matrix_game.checkpoint import VAE_FILE, validate_root

    root = _copy_root(full_root, tmp_path)
    assert validate_root(root, "universal") == variant_folder(root, "universal")
    with pytest.raises(ConfigError, match="gta_distilled_model/config.json: missing"):
        validate_root(root, "gta_drive")
    (root / VAE_FILE).unlink()
    with pytest.raises(ConfigError, match="Wan2.1_VAE.pth: missing"):
        validate_root(root, "universal")
    with pytest.raises(ConfigError, match="not a folder"):
        validate_root(root / "nope", "universal")
