"""The checkpoint folder: exact load of the tiny one; extra, missing and misplaced keys named."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from models.policy.dreamzero.checkpoint import (DIT_PREFIX, INDEX_NAME, CheckpointError, load_checkpoint,
                                                validate_checkpoint)
from models.policy.dreamzero.config import DROID, TINY, ConfigError, DreamZeroConfig
from models.policy.dreamzero.tiny_checkpoint import tiny_metadata
from models.policy.dreamzero.vae import wan_vae_names


def _all_tensors(folder):
    wm = json.loads((folder / INDEX_NAME).read_text())["weight_map"]
    out = {}
    for shard in sorted(set(wm.values())):
        with safe_open(str(folder / shard), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return wm, out


def test_tiny_folder_loads_every_tensor_exactly(tiny_folder, tiny):
    wm, stored = _all_tensors(tiny_folder)
    assert set(wm) == set(stored) and len(set(wm.values())) == 3
    assert tiny.config == TINY
    dit = dict(tiny.dit.named_parameters())
    assert {DIT_PREFIX + n for n in dit} == {n for n in stored if n.startswith(DIT_PREFIX)}
    for n, p in dit.items():
        assert torch.equal(p, stored[DIT_PREFIX + n]), n
    te = dict(tiny.text_encoder.named_parameters())
    assert torch.equal(te["encoder.block.0.layer.1.DenseReluDense.wi_0.weight"],
                       stored["action_head.text_encoder.blocks.0.ffn.gate.0.weight"])
    assert torch.equal(te["shared.weight"], stored["action_head.text_encoder.token_embedding.weight"])
    ie = dict(tiny.image_encoder.named_parameters())
    assert torch.equal(ie["model.visual.transformer.1.attn.to_qkv.weight"],
                       stored["action_head.image_encoder.model.visual.transformer.1.attn.to_qkv.weight"])
    vae = dict(tiny.vae.named_parameters())
    assert torch.equal(vae["decoder.up_blocks.1.resnets.0.conv_shortcut.weight"],
                       stored["action_head.vae.model.decoder.upsamples.4.shortcut.weight"])
    # Every stored tensor went somewhere: the modules hold as many tensors as the folder.
    assert len(dit) + len(te) + len(ie) + len(vae) == len(stored)
    assert tiny.metadata == tiny_metadata()


def test_published_structure_counts():
    # The 14B checkpoint's tensors per prefix (a public debugging note): DiT 1317, text
    # encoder 242, image encoder 393, VAE 194; the modules here hold exactly as many.
    from transformers import UMT5Config, UMT5EncoderModel

    from models.policy.dreamzero.image_encoder import WanImageEncoder
    from models.policy.dreamzero.model import DreamZeroDiT

    with torch.device("meta"):
        assert len(list(DreamZeroDiT(DROID).named_parameters())) == 1317
        umt5_xxl = UMT5Config(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                              relative_attention_num_buckets=32, feed_forward_proj="gated-gelu")
        assert len(list(UMT5EncoderModel(umt5_xxl).named_parameters())) == 242
        vit_h14 = WanImageEncoder(dim=1280, patch=14, grid=16, layers=32, mlp=5120, out_dim=1024)
        assert len(list(vit_h14.named_parameters())) == 393
    assert len(wan_vae_names()) == 194


def _copy(tiny_folder, tmp_path):
    dst = tmp_path / "ck"
    shutil.copytree(tiny_folder, dst)
    return dst


def _add_tensor(folder, name, tensor):
    index = json.loads((folder / INDEX_NAME).read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    data = load_file(str(folder / shard))
    data[name] = tensor
    save_file(data, str(folder / shard))
    index["weight_map"][name] = shard
    (folder / INDEX_NAME).write_text(json.dumps(index))


@pytest.mark.parametrize("name", [
    "action_head.model.blocks.0.self_attn.extra.weight",   # in the DiT, not the model's
    "backbone.proj.weight",                                  # outside every known prefix
])
def test_an_extra_key_fails_naming_it(tiny_folder, tmp_path, name):
    folder = _copy(tiny_folder, tmp_path)
    _add_tensor(folder, name, torch.zeros(2))
    with pytest.raises(CheckpointError, match="unknown 1 key") as e:
        validate_checkpoint(folder)
    assert name in str(e.value)


@pytest.mark.parametrize("name", [
    "action_head.vae.model.decoder.upsamples.99.residual.0.gamma",
    "action_head.text_encoder.blocks.0.ffn.gate.1.weight",
    "action_head.image_encoder.model.visual.transformer.0.attn.q.weight",
])
def test_an_extra_component_key_fails_before_any_tensor_is_read(tiny_folder, tmp_path, name):
    folder = _copy(tiny_folder, tmp_path)
    _add_tensor(folder, name, torch.zeros(2))
    with pytest.raises(CheckpointError, match=r"unknown 1 key") as e:
        validate_checkpoint(folder)
    assert name in str(e.value)


def test_a_missing_key_fails_naming_it(tiny_folder, tmp_path):
    folder = _copy(tiny_folder, tmp_path)
    index = json.loads((folder / INDEX_NAME).read_text())
    gone = ["action_head.model.blocks.1.cross_attn.k_img.weight", "action_head.text_encoder.blocks.0.ffn.fc1.weight",
            "action_head.image_encoder.model.visual.transformer.1.mlp.2.bias", "action_head.vae.model.conv2.bias"]
    for name in gone:
        del index["weight_map"][name]
    (folder / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="missing 4 key") as e:
        validate_checkpoint(folder)
    for name in gone:
        assert name in str(e.value)


def test_the_builders_check_their_names_too(tiny):
    from models.policy.dreamzero.text_encoder import build_text_encoder, wan_name
    from models.policy.dreamzero.vae import build_vae

    wan = {wan_name(n): p.detach() for n, p in tiny.text_encoder.named_parameters()}
    del wan["blocks.0.ffn.fc1.weight"]
    with pytest.raises(CheckpointError, match=r"text encoder: missing 1 key.*blocks\.0\.ffn\.fc1\.weight"):
        build_text_encoder(wan)
    with pytest.raises(CheckpointError, match=r"vae: missing .*conv1\.weight"):
        build_vae({"extra.weight": torch.zeros(1)})


def test_a_shard_lacking_an_indexed_key_and_a_wrong_shape_are_named(tiny_folder, tmp_path):
    folder = _copy(tiny_folder, tmp_path)
    index = json.loads((folder / INDEX_NAME).read_text())
    name = "action_head.model.head.modulation"
    shard = index["weight_map"][name]
    data = load_file(str(folder / shard))
    data[name] = torch.zeros(3)
    save_file(data, str(folder / shard))
    with pytest.raises(CheckpointError, match=r"head\.modulation has shape \(3,\), expected \(1, 2, 24\)"):
        load_checkpoint(folder)
    del data[name]
    save_file(data, str(folder / shard))
    with pytest.raises(CheckpointError, match=r"lists \['action_head\.model\.head\.modulation'\]"):
        load_checkpoint(folder)


def test_config_round_trip_and_refusals():
    assert DreamZeroConfig.from_checkpoint_config(DROID.to_checkpoint_config()) == DROID
    assert DROID.local_attn_size == 9 and DROID.head_dim == 128 and DROID.condition_latents == 9
    cfg = DROID.to_checkpoint_config()
    cfg["action_head_cfg"]["config"]["diffusion_model_cfg"]["window"] = 3
    with pytest.raises(ConfigError, match="unknown diffusion_model_cfg field 'window'"):
        DreamZeroConfig.from_checkpoint_config(cfg)
    with pytest.raises(ConfigError, match="model_type='t2v' changes the topology"):
        DreamZeroConfig(model_type="t2v")
    with pytest.raises(ConfigError, match="architectures"):
        DreamZeroConfig.from_checkpoint_config({"architectures": ["Other"]})


def test_prompts_are_cleaned_padded_and_zeroed(tiny):
    from models.policy.dreamzero.text_encoder import NEGATIVE_PROMPT, clean_prompt, encode_prompts
    from models.world.lingbot.tiny_checkpoint import tiny_tokenizer

    assert clean_prompt("  pick&amp;amp;place \n the   cup ") == "pick&place the cup"
    assert NEGATIVE_PROMPT.startswith("Vibrant colors, overexposed") and NEGATIVE_PROMPT.endswith("walking backwards.")
    states = encode_prompts(tiny.text_encoder, tiny_tokenizer(), ["ab", "a  b"], length=6)
    assert states.shape == (2, 6, TINY.text_dim)
    # "ab" is the word marker, a, b, </s>; "a b" one marker more: zeros after each prompt's end.
    assert states[0, 4:].abs().sum() == 0 and states[0, :4].abs().sum() > 0
    assert states[1, 5:].abs().sum() == 0 and states[1, :5].abs().sum() > 0
