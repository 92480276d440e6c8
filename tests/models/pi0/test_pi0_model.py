"""Native pi0 on a tiny checkpoint in LeRobot's layout: loading, forward, and the maths by hand."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import load_file, save_file

from models.base import ModelError
from models.policy.base import PolicyWork
from models.policy.pi0 import CheckpointError, build, load_policy
from models.policy.pi0.inputs import Stats, pad_to, unpad
from models.policy.pi0.model import euler_step, make_att_2d_masks, suffix_ar, suffix_mask, time_embedding
from models.policy.pi0.weights import EMBED_KEY, EXPERT_HEAD_KEY, TIED_HEAD_KEY, build_empty, load_weights
from protocols.openpi import Observation, SamplingParams
from pi0_support import TINY, write_tiny

CAMS = ("observation.images.base_0_rgb", "observation.images.left_wrist_0_rgb")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("pi0_tiny"))
    write_tiny(path)
    return path


@pytest.fixture(scope="module")
def policy(folder):
    return load_policy(folder, max_batch=4)


def obs(seed: int = 0, prompt: str | None = "pick up the red block", state=None) -> Observation:
    rng = np.random.default_rng(seed)
    images = {k: rng.integers(0, 256, (28, 28, 3), dtype=np.uint8) for k in CAMS}
    st = rng.standard_normal(5).astype(np.float32) if state is None else np.asarray(state, np.float32)
    return Observation(images, st, prompt)


def work(sid: str, o: Observation, seed: int | None = None, steps: int | None = None) -> PolicyWork:
    return PolicyWork(sid, f"{sid}:1", o, SamplingParams(num_inference_steps=steps, seed=seed))


# ----------------------------------------------------------------------------- loading


def test_loading_is_exact_and_consumes_every_tensor(folder):
    model = build_empty(TINY)
    n = load_weights(model, folder, device=torch.device("cpu"), dtype=torch.float32)
    on_disk = load_file(os.path.join(folder, "model.safetensors"))
    assert n == len(on_disk)
    assert TIED_HEAD_KEY in on_disk and EMBED_KEY not in on_disk and EXPERT_HEAD_KEY in on_disk
    state = {"model." + k: v for k, v in model.state_dict().items()}
    assert set(state) | {TIED_HEAD_KEY, EXPERT_HEAD_KEY} == set(on_disk) | {EMBED_KEY}
    for key, value in state.items():
        src = TIED_HEAD_KEY if key == EMBED_KEY else key
        assert torch.equal(value, on_disk[src]), key
    assert not any(b.is_meta for b in model.buffers())


def _rewrite(folder: str, dst: str, edit) -> str:
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(folder):
        if name != "model.safetensors":
            with open(os.path.join(folder, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
                g.write(f.read())
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    edit(tensors)
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    return dst


def test_unknown_missing_and_misshapen_tensors_fail_naming_the_key(folder, tmp_path):
    extra = _rewrite(folder, str(tmp_path / "extra"), lambda t: t.update({"model.lm_head.bias": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match=r"unknown tensor model\.lm_head\.bias"):
        load_policy(extra)
    key = "model.paligemma_with_expert.gemma_expert.model.layers.1.mlp.up_proj.weight"
    missing = _rewrite(folder, str(tmp_path / "missing"), lambda t: t.pop(key))
    with pytest.raises(CheckpointError, match=rf"missing tensor {key.replace('.', '[.]')}"):
        load_policy(missing)
    bad = _rewrite(folder, str(tmp_path / "bad"), lambda t: t.update({"model.state_proj.bias": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match=r"model\.state_proj\.bias has shape \[3\].*needs \[16\]"):
        load_policy(bad)
    no_embed = _rewrite(folder, str(tmp_path / "noembed"), lambda t: t.pop(TIED_HEAD_KEY))
    with pytest.raises(CheckpointError, match="missing tensor .*embed_tokens.weight"):
        load_policy(no_embed)


def test_files_without_the_expert_head_or_with_both_embedding_keys_load(folder, tmp_path, policy):
    def both(t):
        t[EMBED_KEY] = t[TIED_HEAD_KEY].clone()
        t.pop(EXPERT_HEAD_KEY)

    other = load_policy(_rewrite(folder, str(tmp_path / "both"), both))
    w = [work("a", obs(1), seed=5)]
    np.testing.assert_array_equal(other.infer_batch(w)[0]["actions"], policy.infer_batch(w)[0]["actions"])


def test_folder_errors_name_the_file(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        load_policy(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"type": "pi05"}))
    with pytest.raises(CheckpointError, match="type is 'pi05'"):
        load_policy(str(tmp_path))
    with pytest.raises(CheckpointError, match="checkpoint folder"):
        build(None, object())


def test_missing_tokenizer_is_named(folder, tmp_path):
    dst = _rewrite(folder, str(tmp_path / "notok"), lambda t: None)
    os.remove(os.path.join(dst, "tokenizer.json"))
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        load_policy(dst)


# ----------------------------------------------------------------------------- forward


def test_metadata(policy):
    m = policy.metadata
    assert (m.action_horizon, m.action_dim, m.state_dim, m.image_resolution) == (6, 4, 5, (28, 28))
    assert m.image_keys == CAMS
    assert m.extra["policy"] == "pi0" and m.extra["num_inference_steps"] == 3 and m.extra["max_prompt_tokens"] == 12


def test_forward_is_deterministic_for_fixed_noise_and_batch_independent(policy):
    a = policy.run_batch([work("a", obs(1), seed=7)])[0].actions
    b = policy.run_batch([work("b", obs(1), seed=7)])[0].actions
    assert a.shape == (6, 4) and a.dtype == np.float32 and np.isfinite(a).all()
    np.testing.assert_array_equal(a, b)
    c = policy.run_batch([work("c", obs(1), seed=8)])[0].actions
    assert np.abs(a - c).max() > 1e-3
    # In a batch of three (padded to the bucket of 4) the same robot gets the same answer.
    batch = policy.run_batch([work("x", obs(2), seed=1), work("y", obs(1), seed=7), work("z", obs(3), seed=2)])
    np.testing.assert_allclose(batch[1].actions, a, atol=1e-5)
    # Every input matters: prompt, state, cameras.
    for other in (obs(1, prompt="open the drawer"), obs(1, state=np.ones(5)), obs(9)):
        if other.prompt == "open the drawer" or other.state[0] == 1.0:
            other = Observation(obs(1).images, other.state, other.prompt)
        out = policy.run_batch([work("d", other, seed=7)])[0].actions
        assert np.abs(out - a).max() > 1e-4


def test_session_noise_replays_after_reset(policy):
    first = policy.run_batch([work("arm", obs(1))])[0].actions
    policy.end_tick("arm", True)
    second = policy.run_batch([work("arm", obs(1))])[0].actions
    policy.end_tick("arm", True)
    assert np.abs(second - first).max() > 1e-3
    policy.reset("arm")
    np.testing.assert_array_equal(policy.run_batch([work("arm", obs(1))])[0].actions, first)


def test_prompt_too_long_fails_naming_the_field(policy):
    with pytest.raises(ModelError, match=r"'prompt' is \d+ tokens, over pi0's 12"):
        policy.infer_batch([work("a", obs(1, prompt="pick up the red block and stack the blocks"))])


def test_image_key_map_and_a_missing_camera(folder):
    p = load_policy(folder, image_key_map={"cam_high": CAMS[0]})
    assert p.metadata.image_keys == ("cam_high",)
    assert p.metadata.extra["image_key_map"] == {"cam_high": CAMS[0]}
    o = obs(1)
    only = Observation({"cam_high": o.images[CAMS[0]]}, o.state, o.prompt)
    a = p.infer_batch([work("a", only, seed=3)])[0]["actions"]
    # pi0's missing camera (-1 image, mask false) is invisible: any pixels there change nothing.
    cfg = p.cfg
    tokens, valid = (torch.from_numpy(x)[None] for x in p.tokenizer.encode(o.prompt))
    img = torch.from_numpy(o.images[CAMS[0]])[None, None].permute(0, 1, 4, 2, 3).float() * (2 / 255) - 1
    embs, pad = p.model.embed_prefix(img, (0,), tokens, valid)
    assert not pad[0, cfg.tokens_per_image:2 * cfg.tokens_per_image].any() and pad[0, :cfg.tokens_per_image].all()
    assert a.shape == (6, 4) and np.isfinite(a).all()
    with pytest.raises(ValueError, match="not cameras of this checkpoint"):
        load_policy(folder, image_key_map={"cam": "observation.images.top"})


# ----------------------------------------------------------------------------- the maths by hand


def test_attention_mask_two_cameras_three_prompt_tokens():
    # Tokens: camera 1, camera 2 (one token each here), prompt p1 p2 p3, state s, actions a1 a2.
    pad = torch.ones(1, 8, dtype=torch.bool)
    ar = torch.tensor([[0, 0, 0, 0, 0] + suffix_ar(2)])
    assert ar.tolist() == [[0, 0, 0, 0, 0, 1, 1, 0]]
    expected = torch.tensor([
        # c1 c2 p1 p2 p3 s  a1 a2
        [1, 1, 1, 1, 1, 0, 0, 0],  # c1: the prefix sees the prefix only
        [1, 1, 1, 1, 1, 0, 0, 0],  # c2
        [1, 1, 1, 1, 1, 0, 0, 0],  # p1
        [1, 1, 1, 1, 1, 0, 0, 0],  # p2
        [1, 1, 1, 1, 1, 0, 0, 0],  # p3
        [1, 1, 1, 1, 1, 1, 0, 0],  # s: the prefix and itself
        [1, 1, 1, 1, 1, 1, 1, 1],  # a1: the prefix, the state, every action
        [1, 1, 1, 1, 1, 1, 1, 1],  # a2
    ], dtype=torch.bool)
    assert torch.equal(make_att_2d_masks(pad, ar)[0], expected)
    # Camera 2 missing and p3 padding: their rows and columns go dark.
    pad[0, 1] = pad[0, 4] = False
    dark = expected.clone()
    dark[[1, 4], :] = False
    dark[:, [1, 4]] = False
    assert torch.equal(make_att_2d_masks(pad, ar)[0], dark)


def test_suffix_mask_matches_the_full_matrix(policy):
    cfg = policy.cfg
    pad = torch.ones(1, cfg.prefix_len, dtype=torch.bool)
    pad[0, -3:] = False  # three prompt pads
    ar = torch.tensor([[0] * cfg.prefix_len + suffix_ar(cfg.chunk_size)])
    mask = suffix_mask(pad, ar, cfg.suffix_len, cfg.kv_len)[0]
    full = make_att_2d_masks(torch.cat([pad, torch.ones(1, cfg.suffix_len, dtype=torch.bool)], 1), ar)[0]
    n = cfg.prefix_len + cfg.suffix_len
    assert cfg.kv_len % 16 == 0 and cfg.kv_len >= n
    assert torch.equal(mask[:, :n], full[-cfg.suffix_len:]) and not mask[:, n:].any()
    assert mask[0, cfg.prefix_len:n].tolist() == [True] + [False] * cfg.chunk_size  # the state row
    # The bias the expert uses: one row per (token, head), token-major.
    _, bias, _, _ = policy.model.suffix_inputs(torch.zeros(1, cfg.max_state_dim), pad, ar)
    heads = cfg.expert.num_heads
    assert bias.shape == (1, 1, cfg.suffix_len * heads, cfg.kv_len)
    assert torch.equal(bias[0, 0] == 0, mask.repeat_interleave(heads, dim=0))


def test_time_embedding_at_0_half_and_1():
    # dim 4: periods 0.004 and 4 -> angular rates 500 pi and pi / 2.
    t = torch.tensor([0.0, 0.5, 1.0])
    r = math.sqrt(0.5)
    expected = torch.tensor([
        [0.0, 0.0, 1.0, 1.0],  # sin(0), sin(0), cos(0), cos(0)
        [0.0, r, 1.0, r],  # sin(250 pi), sin(pi / 4), cos(250 pi), cos(pi / 4)
        [0.0, 1.0, 1.0, 0.0],  # sin(500 pi), sin(pi / 2), cos(500 pi), cos(pi / 2)
    ])
    torch.testing.assert_close(time_embedding(t, 4, 4e-3, 4.0), expected, atol=1e-6, rtol=0)


def test_one_euler_step_and_a_constant_velocity(policy):
    x = torch.tensor([[1.0, 2.0]])
    torch.testing.assert_close(euler_step(x, torch.tensor([[3.0, -1.0]]), -0.5), torch.tensor([[-0.5, 2.5]]))
    # With action_out_proj = 0 * h + b the velocity is b everywhere: from t = 1 to 0 the
    # chunk is noise - b, whatever the steps.
    m = policy.model
    cfg = m.cfg
    saved = (m.action_out_proj.weight.detach().clone(), m.action_out_proj.bias.detach().clone())
    b = torch.arange(cfg.max_action_dim, dtype=torch.float32) / 4
    try:
        with torch.no_grad():
            m.action_out_proj.weight.zero_()
            m.action_out_proj.bias.copy_(b)
        o = obs(1)
        for steps in (1, 3):
            out = policy.infer_batch([work("v", o, seed=4, steps=steps)])[0]["actions"]
            noise = torch.randn(cfg.chunk_size, cfg.max_action_dim, generator=torch.Generator().manual_seed(4))
            np.testing.assert_allclose(out, (noise - b)[:, :cfg.action_dim].numpy(), atol=1e-5)
    finally:
        with torch.no_grad():
            m.action_out_proj.weight.copy_(saved[0])
            m.action_out_proj.bias.copy_(saved[1])


def test_padding_and_unpadding(policy):
    np.testing.assert_array_equal(pad_to(np.array([[1.0, 2.0, 3.0]]), 5), [[1, 2, 3, 0, 0]])
    np.testing.assert_array_equal(unpad(np.arange(10.0).reshape(2, 5), 2), [[0, 1], [5, 6]])
    with pytest.raises(ValueError):
        pad_to(np.zeros(6), 5)
    host = policy.prepare([work("p", obs(1, state=[1, 2, 3, 4, 5]), seed=0)])
    np.testing.assert_array_equal(host["state"], [[1, 2, 3, 4, 5, 0, 0, 0]])
    assert host["noise"].shape == (1, 6, 8) and host["tokens"].shape == (1, 12)


def test_normalisation_round_trip_and_checkpoint_stats(folder, tmp_path, policy):
    ms = Stats("MEAN_STD", np.array([1.0, 2.0]), np.array([2.0, 4.0]))
    np.testing.assert_allclose(ms.normalize(np.array([3.0, 6.0])), [1.0, 1.0])
    mm = Stats("MIN_MAX", np.array([0.0, -1.0]), np.array([2.0, 1.0]))
    np.testing.assert_allclose(mm.normalize(np.array([1.0, 0.0])), [0.0, 0.0], atol=1e-7)
    np.testing.assert_allclose(mm.normalize(np.array([2.0, 1.0])), [1.0, 1.0], atol=1e-7)
    x = np.array([0.3, -7.0])
    for s in (ms, mm, Stats("IDENTITY")):
        np.testing.assert_allclose(s.unnormalize(s.normalize(x)), x, rtol=1e-6)
    # Stats files beside the weights, as LeRobot's processors save them.
    dst = _rewrite(folder, str(tmp_path / "stats"), lambda t: None)
    mean, std = np.arange(4, dtype=np.float32), np.full(4, 2.0, np.float32)
    save_numpy({"action.mean": mean, "action.std": std},
               os.path.join(dst, "policy_postprocessor_step_0_unnormalizer_processor.safetensors"))
    s_mean = np.full(5, 0.5, np.float32)
    save_numpy({"observation.state.mean": s_mean, "observation.state.std": np.ones(5, np.float32)},
               os.path.join(dst, "policy_preprocessor_step_3_normalizer_processor.safetensors"))
    normed = load_policy(dst)
    o = obs(1)
    raw = policy.infer_batch([work("n", Observation(o.images, o.state - 0.5, o.prompt), seed=2)])[0]["actions"]
    out = normed.infer_batch([work("n", o, seed=2)])[0]["actions"]
    np.testing.assert_allclose(out, raw * (std + 1e-8) + mean, atol=1e-5)
    assert normed.describe()["normalisation"] == {"state": "MEAN_STD", "action": "MEAN_STD"}


def test_folded_multi_query_attention_equals_per_head_softmax():
    from models.policy.pi0.layers import attend as _attend
    from models.policy.pi0.model import _bias

    g = torch.Generator().manual_seed(0)
    b, t, h, d, keys = 2, 3, 4, 8, 5
    q, k, v = torch.randn(b, t, h, d, generator=g), torch.randn(b, keys, d, generator=g), torch.randn(b, keys, d, generator=g)
    mask = torch.rand(b, t, keys, generator=g) > 0.3
    mask[..., 0] = True
    got = _attend(q, k, v, _bias(mask.repeat_interleave(h, dim=1)[:, None], torch.float32))
    scores = torch.einsum("bthd,bkd->bthk", q, k) / math.sqrt(d)
    scores = scores.masked_fill(~mask[:, :, None, :], float("-inf"))
    want = torch.einsum("bthk,bkd->bthd", scores.softmax(-1), v).reshape(b, t, h * d)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_fused_projections_equal_the_named_ones(folder):
    model = build_empty(TINY)
    load_weights(model, folder, device=torch.device("cpu"), dtype=torch.float32)
    layer = model.expert.layers[0]
    x = torch.randn(2, 3, TINY.expert.width, generator=torch.Generator().manual_seed(1))
    ref = (layer.self_attn.project(x), layer.mlp(x), layer.input_layernorm(x))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.fuse()
    torch.testing.assert_close(layer.self_attn.project(x), ref[0])
    torch.testing.assert_close(layer.mlp(x), ref[1])
    torch.testing.assert_close(layer.input_layernorm(x), ref[2], atol=1e-5, rtol=1e-5)
    after = model.state_dict()  # the checkpoint's names still reach the same numbers
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_fused_vision_layers_equal_transformers_siglip(folder):
    """``_VisionTower``'s forward (layers.vision_layer over q|k|v stacked) gives what
    transformers' own SiglipVisionModel forward gives, and the checkpoint's names still
    reach the same numbers after the fuse."""
    model = build_empty(TINY)
    load_weights(model, folder, device=torch.device("cpu"), dtype=torch.float32)
    tower = model.paligemma_with_expert.paligemma.model.vision_tower
    pixels = torch.rand(3, 3, *TINY.image_resolution, generator=torch.Generator().manual_seed(2)) * 2 - 1
    ref = tower.vision_model(pixel_values=pixels).last_hidden_state
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.fuse()
    assert tower._weights is not None and len(tower._weights) == TINY.vision.layers
    torch.testing.assert_close(tower(pixels), ref, atol=1e-5, rtol=1e-5)
    assert ref.abs().max() > 0.1
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
