"""The fast path (cached prefix K/V, pure layer functions, compiled layers) against a plain reference.

The reference recomputes the whole sequence [prefix; suffix] at every Euler step through
both stacks with one joint attention per layer and pi0's full 2-D mask, the way LeRobot's
and openpi's training forward runs it, from the checkpoint's named (unfused) projections
and Gemma's norm written out. No K/V cache, no folded heads, no precomputed time half.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from models.policy.pi0 import layers, load_policy
from models.policy.pi0.model import make_att_2d_masks, suffix_ar, time_embedding
from models.policy.pi0.runner import buckets_for
from test_pi0_model import obs, work
from pi0_support import write_tiny


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("pi0_fast"))
    write_tiny(path)
    return path


def _norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return h * (1.0 + weight)


def _rot(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """x [B, N, heads, D] at positions [B, N] (rotate_half rope, theta 1e4)."""
    d = x.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = pos.float()[..., None] * inv
    cos, sin = torch.cat([ang, ang], -1).cos()[:, :, None], torch.cat([ang, ang], -1).sin()[:, :, None]
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


def reference_actions(model, images, present, tokens, valid, state, noise, steps: int) -> torch.Tensor:
    cfg = model.cfg
    with torch.no_grad():
        embs, pad = model.embed_prefix(images, present, tokens, valid)
        b, length = pad.shape
        full_pad = torch.cat([pad, torch.ones(b, cfg.suffix_len, dtype=torch.bool)], 1)
        ar = torch.tensor([0] * length + suffix_ar(cfg.chunk_size))[None].expand(b, -1)
        mask = make_att_2d_masks(full_pad, ar)  # [B, N, N]
        pos = torch.cumsum(full_pad.long(), 1) - 1
        x, dt = noise.clone(), -1.0 / steps
        for i in range(steps):
            t = torch.full((b,), 1.0 + i * dt)
            a = model.action_in_proj(x)
            temb = time_embedding(t, cfg.expert.width, cfg.min_period, cfg.max_period)
            at = torch.cat([a, temb[:, None].expand_as(a)], 2)
            at = model.action_time_mlp_out(F.silu(model.action_time_mlp_in(at)))
            hs = [embs, torch.cat([model.state_proj(state)[:, None], at], 1)]
            for lv, le in zip(model.vlm.layers, model.expert.layers):
                qs, ks, vs = [], [], []
                for h, lay in zip(hs, (lv, le)):
                    n = _norm(h, lay.input_layernorm.weight)
                    att = lay.self_attn
                    qs.append(att.q_proj(n).unflatten(-1, (cfg.vlm.num_heads, cfg.vlm.head_dim)))
                    ks.append(att.k_proj(n).unflatten(-1, (1, cfg.vlm.head_dim)))
                    vs.append(att.v_proj(n).unflatten(-1, (1, cfg.vlm.head_dim)))
                q, k, v = _rot(torch.cat(qs, 1), pos), _rot(torch.cat(ks, 1), pos), torch.cat(vs, 1)
                scores = torch.einsum("bqhd,bkd->bhqk", q, k[:, :, 0]) / math.sqrt(cfg.vlm.head_dim)
                scores = scores.masked_fill(~mask[:, None], float("-inf"))
                # A padding query sees no key under pi0's mask: its row is NaN, zeroed here (no
                # real token ever reads a padding position, so its value is irrelevant).
                probs = scores.softmax(-1).nan_to_num(0.0)
                out = torch.einsum("bhqk,bkd->bqhd", probs, v[:, :, 0]).flatten(2)
                new = []
                for h, o, lay in zip(hs, out.split([length, cfg.suffix_len], 1), (lv, le)):
                    h = h + lay.self_attn.o_proj(o)
                    n = _norm(h, lay.post_attention_layernorm.weight)
                    new.append(h + lay.mlp.down_proj(F.gelu(lay.mlp.gate_proj(n), approximate="tanh") * lay.mlp.up_proj(n)))
                hs = new
            vel = model.action_out_proj(_norm(hs[1][:, -cfg.chunk_size:], model.expert.norm.weight))
            x = x + dt * vel
        return x


def _inputs(policy, works):
    host = policy.prepare(works)
    img = torch.from_numpy(host["images"]).permute(0, 1, 4, 2, 3).float() * (2.0 / 255.0) - 1.0
    return (img, policy.present, torch.from_numpy(host["tokens"]), torch.from_numpy(host["valid"]),
            torch.from_numpy(host["state"]), torch.from_numpy(host["noise"]))


def test_cached_fast_path_equals_the_full_sequence_reference(folder):
    policy = load_policy(folder, max_batch=4)
    works = [work(f"r{i}", obs(i), seed=i) for i in range(3)]
    for steps in (1, 3):
        ws = [work(w.session_id, w.observation, seed=i, steps=steps) for i, w in enumerate(works)]
        got = np.stack([r["actions"] for r in policy.infer_batch(ws)])
        ref = reference_actions(policy.model, *_inputs(policy, ws), steps)[:, :, :policy.cfg.action_dim].numpy()
        np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)
        assert np.abs(ref).max() > 0.1  # the comparison is not between two near-zero chunks


def test_traced_layers_equal_the_eager_layers(folder):
    """The layers as torch.compile traces them (aot_eager: dynamo + functionalised K/V stores,
    no code generation, so it runs in seconds on CPU) give the eager answer, at batch 1 (the
    specialised trace) and at bucket 2 (the trace symbolic in the batch)."""
    eager = load_policy(folder, max_batch=4)
    traced = load_policy(folder, max_batch=4)
    traced.runner.fns = layers.compiled(backend="aot_eager")
    for n in (1, 2):
        works = [work(f"r{i}", obs(i), seed=i) for i in range(n)]
        ref = np.stack([r["actions"] for r in eager.infer_batch(works)])
        got = np.stack([r["actions"] for r in traced.infer_batch(works)])
        np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)


def test_layers_without_the_weight_stream(folder):
    """``weight_stream=False`` (the benchmarks' cuBLAS row) is bound into the Gemma layer functions,
    eager and as torch.compile traces them; on CPU every matmul is ``F.linear`` either way, so the
    actions are the default's (bit for bit eagerly). On CUDA: test_pi0_cuda.py."""
    default = load_policy(folder, max_batch=4)
    off = load_policy(folder, max_batch=4, weight_stream=False)
    assert default.runner.fns.weight_stream and not off.runner.fns.weight_stream
    assert off.runner.fns.prefix.keywords == off.runner.fns.expert.keywords == {"weight_stream": False}
    works = [work(f"r{i}", obs(i), seed=i) for i in range(2)]
    ref = np.stack([r["actions"] for r in default.infer_batch(works)])
    np.testing.assert_array_equal(np.stack([r["actions"] for r in off.infer_batch(works)]), ref)
    off.runner.fns = layers.compiled(backend="aot_eager", weight_stream=False)
    assert not off.runner.fns.weight_stream
    got = np.stack([r["actions"] for r in off.infer_batch(works)])
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)


def test_buckets():
    assert buckets_for(1) == (1,)
    assert buckets_for(12) == (1, 2, 4, 8, 12)
    assert buckets_for(32) == (1, 2, 4, 8, 16, 24, 32)
    assert buckets_for(40) == (1, 2, 4, 8, 16, 24, 32, 40)
