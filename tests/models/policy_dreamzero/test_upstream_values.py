"""DreamZeroDiT against values recorded from upstream's ``CausalWanModel`` (fixtures/README.md).

Weights and inputs are closed-form (sines of the element index), not drawn from a random
generator, so the recorded values stay valid across torch versions. The recorded run is
upstream's inference path: the first frame's t=0 pass, a chunk at start frame 1, the t=0
pass of two observed frames, a chunk at start frame 3 (actions' 1-D RoPE at chunk 1).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from models.policy.dreamzero.config import TINY
from models.policy.dreamzero.model import DreamZeroDiT

FIXTURE = Path(__file__).with_name("fixtures") / "upstream_tiny.json"
# Upstream's MLPProj takes 1280-wide CLIP features whatever the DiT's size.
CONFIG = dataclasses.replace(TINY, image_dim=1280)
T = 937.0     # a timestep of the 16-step schedule


def det(shape: tuple[int, ...], salt: float, scale: float = 1.0) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    i = torch.arange(n, dtype=torch.float64)
    return (scale * torch.sin(0.37 * i + salt) * torch.cos(0.11 * i - 0.5 * salt)).float().reshape(shape)


def model() -> DreamZeroDiT:
    m = DreamZeroDiT(CONFIG).eval()
    with torch.no_grad():
        for k, (_, p) in enumerate(sorted(m.named_parameters())):
            p.copy_(det(tuple(p.shape), 1.3 * k, 0.2))
    return m


def inputs() -> dict[str, torch.Tensor]:
    c = CONFIG
    return {"text": det((1, c.text_len, c.text_dim), 0.1), "clip": det((1, 257, 1280), 0.2),
            "frames": det((1, 16, 3, 4, 4), 0.3), "ys": det((1, 20, 5, 4, 4), 0.4),
            "noise": det((1, 16, 2, 4, 4), 0.5), "actions": det((1, c.action_horizon, c.action_dim), 0.6),
            "state": det((1, 1, c.max_state_dim), 0.7)}


@torch.no_grad()
def run(m: DreamZeroDiT) -> dict[str, torch.Tensor]:
    x = inputs()
    t = torch.full((1,), T)
    cross = m.encode_context(x["text"], x["clip"])
    first = m(x["frames"][:, :, :1], x["ys"][:, :, :1], torch.zeros(1), 0, cross)
    chunk1 = m(x["noise"], x["ys"][:, :, 1:3], t, 1, cross, first.kv, actions=x["actions"], action_timestep=t,
               state=x["state"])
    observed = m(x["frames"][:, :, 1:3], x["ys"][:, :, 1:3], torch.zeros(1), 1, cross, first.kv)
    chunk3 = m(x["noise"], x["ys"][:, :, 3:5], t, 3, cross, observed.kv, actions=x["actions"], action_timestep=t,
               state=x["state"])
    return {"chunk1_video": chunk1.video, "chunk1_actions": chunk1.actions,
            "observed_k_last_layer": observed.kv[-1][0], "observed_v_last_layer": observed.kv[-1][1],
            "chunk3_video": chunk3.video, "chunk3_actions": chunk3.actions}


def test_matches_upstream_causal_wan_model():
    want = json.loads(FIXTURE.read_text())
    got = run(model())
    assert set(got) == set(want["values"])
    for name, value in got.items():
        ref = torch.tensor(want["values"][name])
        assert value.shape == ref.shape, name
        # float32 rounding: within 1e-5 of each tensor's largest value (a 1-D RoPE shifted by one
        # position moves the actions by 1e-4 of theirs, the video by 2e-4).
        tol = 1e-5 * ref.abs().max().item()
        assert (value - ref).abs().max().item() <= tol, (name, (value - ref).abs().max().item(), tol)


# -- the encoders, from Wan's names (fixtures/upstream_encoders.json) ---------------------------

ENCODERS = Path(__file__).with_name("fixtures") / "upstream_encoders.json"


def text_weights() -> dict[str, torch.Tensor]:
    """A 2-layer umt5 (width 16, 2 heads of 4, ffn 24, 8 buckets, vocabulary 30) in Wan's names."""
    shapes = {"token_embedding.weight": (30, 16), "norm.weight": (16,)}
    for i in range(2):
        shapes.update({f"blocks.{i}.norm1.weight": (16,), f"blocks.{i}.norm2.weight": (16,),
                       f"blocks.{i}.pos_embedding.embedding.weight": (8, 2),
                       f"blocks.{i}.ffn.gate.0.weight": (24, 16), f"blocks.{i}.ffn.fc1.weight": (24, 16),
                       f"blocks.{i}.ffn.fc2.weight": (16, 24)})
        shapes.update({f"blocks.{i}.attn.{p}.weight": (8, 16) if p != "o" else (16, 8) for p in "qkvo"})
    return {n: det(s, 0.7 * k, 0.4) for k, (n, s) in enumerate(sorted(shapes.items()))}


def image_weights() -> dict[str, torch.Tensor]:
    """A 3-block CLIP vision tower (width 160 = 2 heads of 80, 2x2 patches of a 4x4 image) in Wan's names."""
    shapes = {"model.log_scale": (), "model.visual.patch_embedding.weight": (160, 3, 2, 2),
              "model.visual.cls_embedding": (1, 1, 160), "model.visual.pos_embedding": (1, 5, 160),
              "model.visual.pre_norm.weight": (160,), "model.visual.pre_norm.bias": (160,),
              "model.visual.post_norm.weight": (160,), "model.visual.post_norm.bias": (160,),
              "model.visual.head": (160, 6)}
    for i in range(3):
        b = f"model.visual.transformer.{i}."
        shapes.update({b + "norm1.weight": (160,), b + "norm1.bias": (160,), b + "norm2.weight": (160,),
                       b + "norm2.bias": (160,), b + "attn.to_qkv.weight": (480, 160), b + "attn.to_qkv.bias": (480,),
                       b + "attn.proj.weight": (160, 160), b + "attn.proj.bias": (160,),
                       b + "mlp.0.weight": (320, 160), b + "mlp.0.bias": (320,), b + "mlp.2.weight": (160, 320),
                       b + "mlp.2.bias": (160,)})
    return {n: det(s, 0.9 * k, 0.3) for k, (n, s) in enumerate(sorted(shapes.items()))}


TEXT_IDS = torch.tensor([[5, 9, 13, 4, 1, 0, 0, 0], [7, 8, 1, 0, 0, 0, 0, 0]])
TEXT_MASK = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]])


def test_encoders_match_upstream():
    from models.policy.dreamzero.image_encoder import build_image_encoder
    from models.policy.dreamzero.text_encoder import build_text_encoder

    want = json.loads(ENCODERS.read_text())["values"]
    with torch.no_grad():
        text = build_text_encoder(text_weights())(input_ids=TEXT_IDS, attention_mask=TEXT_MASK).last_hidden_state
        image = build_image_encoder(image_weights()).model.visual(det((2, 3, 4, 4), 0.8))
    # Only the prompt's tokens: upstream zeroes the rest after the encoder anyway.
    text = text * TEXT_MASK[..., None]
    for name, value in (("text", text), ("image", image)):
        ref = torch.tensor(want[name])
        assert value.shape == ref.shape, name
        assert (value - ref).abs().max().item() <= 1e-5 * ref.abs().max().item(), name


VAE = Path(__file__).with_name("fixtures") / "upstream_vae.json"


def vae_weights() -> dict[str, torch.Tensor]:
    """Wan2.1's VAE at width 4 in its original names (shapes from diffusers' class)."""
    from models.policy.dreamzero.vae import diffusers_names, make_vae, wan_vae_names

    params = dict(make_vae(4, 16).named_parameters())
    names = diffusers_names(wan_vae_names())
    return {n: det(tuple(params[names[n]].shape), 0.3 * k, 0.2) for k, n in enumerate(sorted(names))}


def test_vae_matches_upstream():
    from models.policy.dreamzero.vae import build_vae

    want = json.loads(VAE.read_text())["values"]
    vae = build_vae(vae_weights())
    with torch.no_grad():
        mu = vae.encode(det((1, 3, 9, 8, 8), 0.9)).latent_dist.mode()
        frames = vae.decode(det((1, 16, 3, 1, 1), 1.1)).sample
    for name, value in (("encode", mu), ("decode", frames)):
        ref = torch.tensor(want[name])
        assert value.shape == ref.shape, name
        assert (value - ref).abs().max().item() <= 1e-5 * ref.abs().max().item(), name
