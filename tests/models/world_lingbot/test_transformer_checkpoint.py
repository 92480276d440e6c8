"""The transformer against the public checkpoint's recorded names and shapes, and its loader."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from models.world.lingbot.config import CHECKPOINT_CONFIG, ConfigError, LingBotTransformerConfig
from models.world.lingbot.transformer import CausalLingBotWorldTransformer3DModel, checkpoint_shapes
from models.world.lingbot.weights import (INDEX_NAME, CheckpointError, load_transformer,
                                          save_transformer)
from tests.models.world_lingbot.conftest import TINY, fixture

ISSUE_DEFAULTS = dict(in_channels=36, out_channels=16, num_layers=40, num_attention_heads=40,
                      attention_head_dim=128, patch_size=(1, 2, 2), text_dim=4096, ffn_dim=13824,
                      freq_dim=256, rope_max_seq_len=1024, eps=1e-6, cross_attn_norm=True,
                      qk_norm="rms_norm_across_heads", sink_size=9, num_frames_per_block=3,
                      sliding_window_num_frames=18, local_attn_size=-1)


def _meta_model() -> CausalLingBotWorldTransformer3DModel:
    with torch.device("meta"):
        return CausalLingBotWorldTransformer3DModel(CHECKPOINT_CONFIG)


def test_full_model_name_set_equals_the_checkpoint_index():
    names = fixture("transformer_weight_index_names.json")
    shapes = checkpoint_shapes(_meta_model())
    assert len(shapes) == names["index_parameter_count"] == 1421
    digest = hashlib.sha256("\n".join(sorted(shapes)).encode()).hexdigest()
    assert digest == names["canonical_name_set_sha256"]
    top = sorted({n.split(".")[0] for n in shapes})
    assert top == names["top_level_modules"]
    assert sorted(n for n in shapes if not n.startswith("blocks.")) == names["non_block_parameters"]
    assert sorted(n[len("blocks.7."):] for n in shapes if n.startswith("blocks.7.")) == \
        names["block_parameter_suffixes"]


def test_full_model_shapes_equal_the_recorded_ones():
    want = fixture("transformer_official_shapes.json")["parameter_shapes"]
    shapes = checkpoint_shapes(_meta_model())
    for name, shape in want.items():
        assert shapes[name] == tuple(shape), name


def test_defaults_are_the_checkpoint_config():
    cfg = LingBotTransformerConfig()
    for name, value in ISSUE_DEFAULTS.items():
        assert getattr(cfg, name) == value, name
    assert cfg.rolling_frames == 6 and cfg.camera_in_features == 1536


def test_from_config_takes_the_diffusers_config_and_ignores_metadata():
    d = {"_class_name": "CausalLingBotWorldTransformer3DModel", "_diffusers_version": "0.35.0.dev0",
         **{k: list(v) if isinstance(v, tuple) else v for k, v in ISSUE_DEFAULTS.items()},
         "image_dim": None, "added_kv_proj_dim": None, "pos_embed_seq_len": None}
    assert LingBotTransformerConfig.from_config(d) == CHECKPOINT_CONFIG
    assert LingBotTransformerConfig.from_config(json.loads(json.dumps(TINY.to_config()))) == TINY


@pytest.mark.parametrize("field,value", [("qk_norm", "layer_norm"), ("cross_attn_norm", False),
                                         ("image_dim", 1280), ("added_kv_proj_dim", 5120),
                                         ("local_attn_size", 12), ("in_channels", 16),
                                         ("patch_size", [2, 2, 2]), ("sink_size", 4)])
def test_from_config_refuses_a_topology_change_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        LingBotTransformerConfig.from_config({**TINY.to_config(), field: value})


def test_from_config_refuses_an_unknown_field():
    with pytest.raises(ConfigError, match="'num_experts'"):
        LingBotTransformerConfig.from_config({**TINY.to_config(), "num_experts": 2})


def _tiny_model(seed: int = 0) -> CausalLingBotWorldTransformer3DModel:
    torch.manual_seed(seed)
    m = CausalLingBotWorldTransformer3DModel(TINY)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.2)
    return m


@pytest.mark.parametrize("shard_bytes", [None, 20_000])
def test_save_then_load_round_trips_with_q_k_v_in_the_fused_projection(tmp_path, shard_bytes):
    m = _tiny_model()
    files = save_transformer(m, tmp_path, max_shard_bytes=shard_bytes)
    assert (len(files) > 3) == (shard_bytes is not None)
    assert (tmp_path / INDEX_NAME).is_file() == (shard_bytes is not None)
    got = load_transformer(tmp_path)
    for (n1, p1), (n2, p2) in zip(m.named_parameters(), got.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    from safetensors.torch import load_file
    state = {}
    for f in files:
        state.update(load_file(str(tmp_path / f)))
    attn = got.blocks[1].self_attn.qkv.weight
    assert torch.equal(attn, torch.cat([state[f"blocks.1.self_attn.{p}.weight"] for p in "qkv"]))


def _edit_index(folder: Path, edit) -> None:
    path = folder / INDEX_NAME
    index = json.loads(path.read_text())
    edit(index["weight_map"])
    path.write_text(json.dumps(index))


def test_a_missing_key_fails_naming_it(tmp_path):
    save_transformer(_tiny_model(), tmp_path, max_shard_bytes=20_000)
    _edit_index(tmp_path, lambda wm: wm.pop("blocks.1.cam_scale_layer.bias"))
    with pytest.raises(CheckpointError, match=r"missing 1 key.*blocks\.1\.cam_scale_layer\.bias"):
        load_transformer(tmp_path)


def test_an_unknown_key_fails_naming_it(tmp_path):
    save_transformer(_tiny_model(), tmp_path, max_shard_bytes=20_000)
    _edit_index(tmp_path, lambda wm: wm.update({"img_emb.proj.0.weight": next(iter(wm.values()))}))
    with pytest.raises(CheckpointError, match=r"unknown 1 key.*img_emb\.proj\.0\.weight"):
        load_transformer(tmp_path)


def test_a_wrong_shape_fails_naming_the_tensor(tmp_path):
    from safetensors.torch import save_file
    save_transformer(_tiny_model(), tmp_path)
    from safetensors.torch import load_file
    state = load_file(str(tmp_path / "diffusion_pytorch_model.safetensors"))
    state["head.head.weight"] = torch.zeros(3, 3)
    save_file(state, str(tmp_path / "diffusion_pytorch_model.safetensors"))
    with pytest.raises(CheckpointError, match=r"head\.head\.weight has shape \(3, 3\)"):
        load_transformer(tmp_path)


_PROBE = textwrap.dedent("""
    import json, resource, sys, torch
    from models.world.lingbot.config import LingBotTransformerConfig
    from models.world.lingbot.weights import load_transformer, read_config
    from models.world.lingbot.transformer import CausalLingBotWorldTransformer3DModel
    folder = sys.argv[1]
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    # The first meta-device build costs ~70 MB once (torch's lazy set-up): pay it first.
    with torch.device("meta"):
        CausalLingBotWorldTransformer3DModel(read_config(__import__("pathlib").Path(folder)))
    base = rss()
    peaks = []
    model = load_transformer(folder, on_shard=lambda i, n, f: peaks.append(rss()))
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    # VmHWM: this process's own peak RSS (ru_maxrss would carry the parent's over exec).
    with open("/proc/self/status") as f:
        peak = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
    print(json.dumps({"base": base, "peak": peak, "model": model_bytes, "after": peaks}))
""")


def test_loading_streams_shard_by_shard(tmp_path):
    # About 36 MB of weights in 5 shards of at most 8 MB: loading every shard at once would
    # add ~36 MB of host memory on top of the model; streaming adds about one shard (6 MB
    # measured on the dev machine).
    cfg = LingBotTransformerConfig(num_attention_heads=4, attention_head_dim=64, text_dim=64,
                                   freq_dim=16, ffn_dim=1024, num_layers=6, sink_size=3,
                                   sliding_window_num_frames=12)
    with torch.no_grad():
        m = CausalLingBotWorldTransformer3DModel(cfg)
    shard = 8 << 20
    files = save_transformer(m, tmp_path, max_shard_bytes=shard)
    del m
    assert len(files) >= 5
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path)], capture_output=True,
                         text=True, cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                         timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    extra = r["peak"] - r["base"] - r["model"]
    # Peak beyond the model: at most ~1.5 shards (the mapped shard plus allocator slack).
    assert extra < 1.5 * shard, (extra / 2**20, r)


def test_a_full_geometry_block_runs_on_the_meta_device():
    # The 14B model at 480x832 (60x104 latents, 1560 tokens per frame) through a kv pool
    # on the meta device: every shape of the real forward, no memory, no compute.
    from kv import PagedKVCache
    from kv.capacity import pool_blocks
    from models.world.lingbot.attention import BlockKV, write_text
    from models.world.lingbot.cache import kv_geometry

    model = _meta_model()
    g = kv_geometry(CHECKPOINT_CONFIG, 60, 104, dtype=torch.bfloat16)
    assert g.tokens_per_frame == 1560 and (g.sink_frames, g.window_frames, g.frames_per_tick) == (9, 6, 3)
    cache = PagedKVCache(g, pool_blocks(g, 1), "meta", max_sessions=1, attention_backend="gather_sdpa")
    cache.open("a")
    text_kv = model.project_text(torch.empty(1, 512, 4096, device="meta"))
    write_text(cache, "a", [(k[0], v[0]) for k, v in text_kv])
    kv = BlockKV(cache, cache.begin_batch(["a"]))
    out = model(torch.empty(1, 36, 3, 60, 104, device="meta"), torch.zeros(1, device="meta"), kv,
                torch.empty(1, 384, 3, 60, 104, device="meta"), update_cache=True)
    assert out.shape == (1, 16, 3, 60, 104)
