"""The pipeline on a tiny checkpoint written in the real layout: loading, validation, blocks."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from models.world.lingbot.checkpoint import load_components, validate_checkpoint
from models.world.lingbot.pipeline import BlockRequest, LingBotPipeline, shifted_sigma
from models.world.lingbot.weights import CheckpointError

H = W = 16


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint


@pytest.fixture(scope="module")
def components(checkpoint):
    return load_components(checkpoint)


def _pipeline(components, sessions=2):
    return LingBotPipeline(components, height=H, width=W, max_sessions=sessions, text_tokens=8,
                           condition_latents=2)


def test_tiny_checkpoint_has_the_diffusers_layout(checkpoint):
    names = sorted(p.name for p in checkpoint.iterdir())
    assert names == ["model_index.json", "scheduler", "text_encoder", "tokenizer", "transformer", "vae"]
    t = sorted(p.name for p in (checkpoint / "transformer").iterdir())
    assert "diffusion_pytorch_model.safetensors.index.json" in t and "config.json" in t
    assert sum(n.endswith(".safetensors") for n in t) > 1           # sharded like the real one
    index = json.loads((checkpoint / "model_index.json").read_text())
    fixture = json.loads((__import__("pathlib").Path(__file__).with_name("fixtures") /
                          "model_index.json").read_text())
    assert {k: v for k, v in index.items() if k != "_diffusers_version"} == \
        {k: v for k, v in fixture.items() if k != "_diffusers_version"}
    sched = json.loads((checkpoint / "scheduler" / "scheduler_config.json").read_text())
    assert sched == json.loads((__import__("pathlib").Path(__file__).with_name("fixtures") /
                                "scheduler_config.json").read_text())
    validate_checkpoint(checkpoint)


def _broken(checkpoint, tmp_path, edit):
    root = tmp_path / "broken"
    shutil.copytree(checkpoint, root)
    edit(root)
    return root


def _set_json(path, **changes):
    d = json.loads(path.read_text())
    d.update(changes)
    path.write_text(json.dumps(d))


@pytest.mark.parametrize("edit,match", [
    (lambda r: (r / "vae" / "config.json").unlink(), r"/vae: expected config.json \(AutoencoderKLWan config\)"),
    (lambda r: shutil.rmtree(r / "tokenizer"), r"/tokenizer: missing folder \(expected the T5TokenizerFast"),
    (lambda r: _set_json(r / "model_index.json", text_encoder=["transformers", "T5EncoderModel"]),
     r"text_encoder is \['transformers', 'T5EncoderModel'\], expected \['transformers', 'UMT5EncoderModel'\]"),
    (lambda r: _set_json(r / "scheduler" / "scheduler_config.json", flow_shift=3.0),
     r"/scheduler/scheduler_config.json: flow_shift is 3.0, expected 5.0"),
    (lambda r: _set_json(r / "transformer" / "config.json", num_experts=2), r"unknown transformer config field 'num_experts'"),
    (lambda r: _set_json(r / "text_encoder" / "config.json", d_model=32), r"/text_encoder/config.json: d_model 32"),
    (lambda r: (r / "text_encoder" / "model.safetensors").unlink(), r"/text_encoder: expected model.safetensors"),
    (lambda r: _set_json(r / "model_index.json", _class_name="WanImageToVideoPipeline"), r"expected 'LingBotWorldCausalDMDPipeline'"),
])
def test_a_missing_or_mismatched_component_fails_at_start_naming_it(checkpoint, tmp_path, edit, match):
    root = _broken(checkpoint, tmp_path, edit)
    with pytest.raises(CheckpointError, match=match):
        validate_checkpoint(root)


def test_dmd_sigmas_follow_flow_shift_5():
    assert [round(shifted_sigma(t, 5.0), 4) for t in (1000, 750, 500, 250)] == [1.0, 0.9375, 0.8333, 0.625]


def _image(seed):
    return np.random.default_rng(seed).integers(0, 256, (H, W, 3), dtype=np.uint8)


def test_blocks_decode_to_uint8_frames_and_the_prompt_is_encoded_only_when_it_changes(components):
    pipe = _pipeline(components)
    encoded = []
    real = pipe.encode_prompt
    pipe.encode_prompt = lambda p: encoded.append(p) or real(p)
    pipe.open("a", "a red house", image=_image(0), seed=1)
    assert encoded == ["a red house"]
    cross = lambda: [t[pipe.cache.session("a").cross_slots["main"]].clone()  # noqa: E731
                     for t in pipe.cache.storage.cross_k]
    c0 = cross()
    f0 = pipe.generate([BlockRequest("a", keys=[{"w"}] * 3)])[0]
    assert f0.shape == (9, H, W, 3) and f0.dtype == np.uint8
    assert encoded == ["a red house"] and all(torch.equal(a, b) for a, b in zip(c0, cross()))
    f1 = pipe.generate([BlockRequest("a", prompt="snow", keys=[{"l"}] * 3)])[0]
    assert f1.shape == (12, H, W, 3)
    assert encoded == ["a red house", "snow"] and pipe.sessions["a"].text_builds == 2
    c1 = cross()
    assert not all(torch.equal(a, b) for a, b in zip(c0, c1))
    pipe.generate([BlockRequest("a", prompt="snow")])      # the same prompt again: kept
    assert encoded == ["a red house", "snow"] and all(torch.equal(a, b) for a, b in zip(c1, cross()))
    assert pipe.cache.committed_frames("a") == 9 and pipe.sessions["a"].blocks == 3


def test_seeded_sessions_replay_and_the_image_conditions_the_frames(components):
    pipe = _pipeline(components, sessions=4)
    pipe.open("a", "x", image=_image(0), seed=5)
    pipe.open("b", "x", image=_image(0), seed=5)
    pipe.open("c", "x", image=_image(1), seed=5)
    pipe.open("d", "x", image=_image(0), seed=5)
    out = pipe.generate([BlockRequest(s, keys=[{"d"}] * 3) for s in ("a", "b", "c")]
                        + [BlockRequest("d", keys=[{"l"}] * 3)])
    assert not np.array_equal(out[0], out[3])              # the camera reaches the frames
    # Batched rows are independent (up to one level of rounding between batch positions).
    np.testing.assert_allclose(out[0], out[1], atol=1)
    assert not np.array_equal(out[0], out[2])              # the image reaches the frames
    ca, cc = pipe.sessions["a"].condition, pipe.sessions["c"].condition
    assert torch.equal(ca[:4, 0], torch.ones_like(ca[:4, 0])) and not ca[:4, 1:].any()   # mask
    assert not torch.equal(ca[4:, 0], cc[4:, 0])
    pipe.reset("a")
    again = pipe.generate([BlockRequest("a", keys=[{"d"}] * 3)])[0]
    np.testing.assert_allclose(again, out[0], atol=1)


def test_a_failed_block_changes_nothing(components):
    pipe = _pipeline(components)
    pipe.open("a", "x", seed=2)
    assert not pipe.sessions["a"].condition[:4].any()     # no image: the mask is empty
    pipe.generate([BlockRequest("a", keys=[{"w"}] * 3)])
    before = pipe.sessions["a"]
    free = pipe.cache.num_free_blocks
    with pytest.raises(ValueError, match="2 key sets for a block of 3"):
        pipe.generate([BlockRequest("a", keys=[{"w"}] * 2)])
    assert pipe.sessions["a"] is before and pipe.cache.num_free_blocks == free
    assert not pipe.cache.in_flight("a") and pipe.cache.committed_frames("a") == 3


def test_streaming_decode_state_is_counted_swapped_with_the_session_and_freed(components):
    from models.world.lingbot.vae_io import latent_stats

    # One resident session: a second one swaps the first (KV and decode state) to host.
    pipe = _pipeline(components, sessions=1)
    ref = _pipeline(components, sessions=1)
    declared = pipe.geometry.model_state_bytes
    assert declared == pipe.decoder.state_bytes(1, H // 8, W // 8) > 0
    for p in (pipe, ref):
        p.open("a", "x", seed=4)
    a0 = pipe.generate([BlockRequest("a", keys=[{"w"}] * 3)])[0]
    state = pipe.residency.state("a")
    assert state.nbytes == declared and state.latent_frames == 3
    pipe.open("b", "y", seed=6)
    assert pipe.residency.is_swapped("a") and pipe.residency.host_bytes >= declared
    pipe.generate([BlockRequest("b", keys=[{"d"}] * 3)])
    a1 = pipe.generate([BlockRequest("a", keys=[{"w"}] * 3)])[0]   # swapped back in, b out
    assert pipe.residency.is_swapped("b") and not pipe.residency.is_swapped("a")
    assert pipe.residency.metrics()["swap_ins"] == 1 and state.latent_frames == 6
    # Bit-equal to the same session that never left the device.
    r0 = ref.generate([BlockRequest("a", keys=[{"w"}] * 3)])[0]
    r1 = ref.generate([BlockRequest("a", keys=[{"w"}] * 3)])[0]
    np.testing.assert_array_equal(a0, r0)
    np.testing.assert_array_equal(a1, r1)
    # Block by block equals diffusers' one-shot decode of the same latents.
    lat = []
    real = pipe.decoder.frames   # the pipeline decodes frame by frame (each frame sent as it exists)
    pipe.decoder.frames = lambda st, z: lat.append(z) or real(st, z)
    pipe.reset("a")
    assert state.latent_frames == 0
    blocks = [pipe.generate([BlockRequest("a", keys=[{"w"}] * 3)])[0] for _ in range(2)]
    pipe.decoder.frames = real
    video = components.vae.decode(torch.cat(lat, 2)).sample[0].clamp(-1, 1)
    oneshot = ((video + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 3, 0).numpy()
    np.testing.assert_array_equal(np.concatenate(blocks), oneshot)
    pipe.close("a")
    assert state.freed and pipe.residency.state("a") is None
    assert latent_stats(components.vae, torch.zeros(1))[0].shape == (1, 16, 1, 1, 1)
