"""TAEHV's decoder: the taew2_1 layout loaded exactly from a random file written in it (real
widths: the public architecture has no width option), and streaming decode against a one-shot
decode written here from the reference's algorithm."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kv import ModelState
from models.world.taehv import (TAEHVDecoder, check_layout, load_taehv, random_state_dict,
                                taew2_1_shapes)

LH, LW = 2, 3   # latent height, width -> 16 x 24 pixels


@pytest.fixture(scope="module")
def sd() -> dict[str, torch.Tensor]:
    return random_state_dict(seed=0)   # fp16, as the public file


@pytest.fixture(scope="module")
def path(sd, tmp_path_factory):
    p = tmp_path_factory.mktemp("taehv") / "taew2_1.pth"
    torch.save(sd, p)                  # the public file is a torch.save'd state dict
    return p


@pytest.fixture(scope="module")
def dec(path) -> TAEHVDecoder:
    return load_taehv(path)


@pytest.fixture(scope="module")
def latents() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(2, 16, 5, LH, LW)


def _reference_decode(sd: dict[str, torch.Tensor], z: torch.Tensor) -> torch.Tensor:
    """The reference's one-shot (``parallel``) decode, from the raw tensors: NCTHW latents
    in, NCTHW frames in [0, 1] out, the first 3 frames trimmed."""
    w = {k: v.float() for k, v in sd.items()}
    b, _, t = z.shape[:3]
    x = torch.tanh(z.transpose(1, 2).flatten(0, 1) / 3) * 3
    x = F.relu(F.conv2d(x, w["decoder.1.weight"], w["decoder.1.bias"], padding=1))
    stages = [((3, 4, 5), 7, 8, 1), ((9, 10, 11), 13, 14, 2), ((15, 16, 17), 19, 20, 2)]
    for mems, grow, conv, stride in stages:
        for i in mems:
            seq = x.unflatten(0, (b, t))
            past = F.pad(seq, (0, 0, 0, 0, 0, 0, 1, 0))[:, :t].flatten(0, 1)   # zeros, then x_{t-1}
            y = torch.cat([x, past], 1)
            for j in (0, 2, 4):
                y = F.conv2d(y, w[f"decoder.{i}.conv.{j}.weight"], w[f"decoder.{i}.conv.{j}.bias"], padding=1)
                y = F.relu(y) if j < 4 else y
            x = F.relu(y + x)
        x = F.interpolate(x, scale_factor=2, mode="nearest")
        c = x.shape[1]
        x = F.conv2d(x, w[f"decoder.{grow}.conv.weight"]).reshape(-1, c, *x.shape[2:])
        t *= stride
        x = F.conv2d(x, w[f"decoder.{conv}.weight"], padding=1)
    x = F.conv2d(F.relu(x), w["decoder.22.weight"], w["decoder.22.bias"], padding=1)
    return x.unflatten(0, (b, t))[:, 3:].clamp(0, 1).transpose(1, 2)


# -- layout and loader -------------------------------------------------------------------------


def test_the_layout_is_the_public_files():
    shapes = taew2_1_shapes()
    assert len(shapes) == 128
    assert sum(k.startswith("encoder.") for k in shapes) == 64 == sum(k.startswith("decoder.") for k in shapes)
    values = sum(torch.Size(s).numel() for s in shapes.values())
    # 11.3 M parameters. The public taew2_1.safetensors (fp16) is 22,642,902 bytes: this data
    # and a JSON header of under 120 bytes per tensor (a larger first TGrow would not fit).
    assert values == 11_315_539 and 0 < 22_642_902 - 2 * values < 128 * 120
    assert sum(torch.Size(s).numel() for k, s in shapes.items() if k.startswith("decoder.")) == 9_844_611
    assert shapes["decoder.7.conv.weight"] == (256, 256, 1, 1)     # TGrow, stride 1
    assert shapes["decoder.13.conv.weight"] == (256, 128, 1, 1)    # TGrow, stride 2
    assert shapes["decoder.19.conv.weight"] == (128, 64, 1, 1)
    assert shapes["decoder.3.conv.0.weight"] == (256, 512, 3, 3)   # MemBlock: [x, past] in
    assert shapes["decoder.22.weight"] == (3, 64, 3, 3) and "decoder.8.bias" not in shapes
    assert shapes["encoder.2.conv.weight"] == (64, 128, 1, 1)      # TPool, stride 2
    assert shapes["encoder.12.conv.weight"] == (64, 64, 1, 1)      # TPool, stride 1
    assert shapes["encoder.17.weight"] == (16, 64, 3, 3)
    with torch.device("meta"):
        model = TAEHVDecoder()
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == {
        k: s for k, s in shapes.items() if k.startswith("decoder.")}


def test_the_loader_takes_every_decoder_tensor_as_written(sd, path, dec):
    got = dec.state_dict()
    assert set(got) == {k for k in sd if k.startswith("decoder.")}
    assert all(torch.equal(got[k], sd[k].float()) for k in got)   # fp16 -> fp32 is exact
    assert dec.dtype == torch.float32 and not any(p.requires_grad for p in dec.parameters())
    half = load_taehv(path, dtype=torch.float16).state_dict()
    assert all(torch.equal(half[k], sd[k]) for k in got)           # the file's own dtype: bit for bit


def _fails(sd, tmp_path, match: str, **changes) -> None:
    bad = dict(sd)
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            del bad[key]
        else:
            bad[key] = value
    p = tmp_path / "bad.pth"
    torch.save(bad, p)
    with pytest.raises(ValueError, match=match) as e:
        load_taehv(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_an_unknown_tensor_fails_naming_it(sd, tmp_path):
    _fails(sd, tmp_path, r"unknown tensor 'decoder.23.weight'", decoder__23__weight=torch.zeros(3))
    check_layout(sd)   # the file as written passes


def test_a_missing_tensor_fails_naming_it(sd, tmp_path):
    _fails(sd, tmp_path, r"missing tensor 'decoder.22.bias'", decoder__22__bias=None)
    _fails(sd, tmp_path, r"missing tensor 'encoder.0.weight'", encoder__0__weight=None)


def test_a_wrong_shape_fails_naming_it(sd, tmp_path):
    # taew2_2 (Wan 2.2 5B, 48 latent channels) is the likeliest wrong file.
    _fails(sd, tmp_path, r"'decoder.1.weight' has shape \(256, 48, 3, 3\), the taew2_1 layout has \(256, 16, 3, 3\)",
           decoder__1__weight=torch.zeros(256, 48, 3, 3, dtype=torch.float16))
    _fails(sd, tmp_path, r"'encoder.12.conv.weight' has shape \(64, 128, 1, 1\)",
           encoder__12__conv__weight=torch.zeros(64, 128, 1, 1, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"'decoder.3.conv.0.bias' is torch.int64"):
        check_layout({**sd, "decoder.3.conv.0.bias": torch.zeros(256, dtype=torch.int64)})
    with pytest.raises(ValueError, match=r"'decoder.9.conv.2.weight' has non-finite values"):
        check_layout({**sd, "decoder.9.conv.2.weight": torch.full((128, 128, 3, 3), float("nan"), dtype=torch.float16)})


def test_files_that_are_not_state_dicts_fail_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_taehv(tmp_path / "absent.pth")
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a zip or a pickle")
    with pytest.raises(ValueError, match=r"junk.pth: not a readable state dict \(") as e:
        load_taehv(junk)
    assert "\n" not in str(e.value)
    listed = tmp_path / "list.pth"
    torch.save([torch.zeros(1)], listed)
    with pytest.raises(ValueError, match=r"list.pth: not a state dict \(a list\)"):
        load_taehv(listed)


def test_the_safetensors_file_loads_the_same(sd, dec, tmp_path):
    from safetensors.torch import save_file

    p = tmp_path / "taew2_1.safetensors"
    save_file(sd, str(p))
    again = load_taehv(p)
    assert all(torch.equal(a, b) for a, b in zip(dec.state_dict().values(), again.state_dict().values()))


# -- decode ------------------------------------------------------------------------------------


def test_one_pass_equals_the_reference_decode(sd, dec, latents):
    ref = _reference_decode(sd, latents)
    out = dec.decode(dec.new_state(2, LH, LW), latents)
    assert out.shape == ref.shape == (2, 3, 17, 16, 24) and out.dtype == torch.float32
    assert (out - (2 * ref - 1)).abs().max().item() < 1e-5
    assert out.min().item() >= -1 and out.max().item() <= 1
    assert out.std().item() > 0.05 and (out == -1).any() and (out > -1).any()   # not all clamped


@pytest.mark.parametrize("cuts", [(0, 1, 4, 5), (0, 2, 5), (0, 1, 2, 3, 4, 5)])
def test_blocks_equal_one_shot(dec, latents, cuts):
    one_shot = dec.decode(dec.new_state(2, LH, LW), latents)
    state = dec.new_state(2, LH, LW)
    blocks = [dec.decode(state, latents[:, :, a:b]) for a, b in zip(cuts, cuts[1:])]
    assert [x.shape[2] for x in blocks] == [dec.output_frames(a, b - a) for a, b in zip(cuts, cuts[1:])]
    assert (torch.cat(blocks, 2) - one_shot).abs().max().item() < 1e-5
    assert state.latent_frames == 5

    state.reset()
    streamed = torch.stack([f for a, b in zip(cuts, cuts[1:]) for f in dec.frames(state, latents[:, :, a:b])], 2)
    assert (streamed - one_shot).abs().max().item() < 1e-5


def test_frames_yield_after_their_own_latent_frame(dec, latents):
    state = dec.new_state(2, LH, LW)
    first = dec.decode(state, latents[:, :, :1])
    assert first.shape == (2, 3, 1, 16, 24)
    gen = dec.frames(state, latents[:, :, 1:4])
    frame = next(gen)
    assert state.latent_frames == 2 and frame.shape == (2, 3, 16, 24)
    assert len(list(gen)) == 11 and state.latent_frames == 4


def test_output_frame_counts(dec):
    assert (dec.temporal_upsample, dec.spatial_upsample) == (4, 8)
    assert [dec.output_frames(0, 1), dec.output_frames(0, 3), dec.output_frames(3, 3), dec.output_frames(5, 0)] == [
        1, 9, 12, 0]
    assert dec.output_frames(0, 21) == 81


def test_fp16_within_tolerance_of_fp32(path, dec, latents):
    half = load_taehv(path, dtype=torch.float16)
    out = half.decode(half.new_state(2, LH, LW), latents)   # latents are cast to the decoder's dtype
    assert out.dtype == torch.float16
    assert (out.float() - dec.decode(dec.new_state(2, LH, LW), latents)).abs().max().item() < 2e-2


def test_state_bytes_exact():
    # fp16/bf16 at 480 x 832 (latent 60 x 104): the 9 MemBlocks' last inputs.
    values = 3 * 256 * 60 * 104 + 3 * 128 * 120 * 208 + 3 * 64 * 240 * 416
    assert values == 33_546_240
    with torch.device("meta"):
        model = TAEHVDecoder().to(torch.float16)
    assert model.state_bytes(1, 60, 104) == 2 * values == 67_092_480
    assert TAEHVDecoder.state_shapes(2, LH, LW) == [(2, 256, 2, 3)] * 3 + [(2, 128, 4, 6)] * 3 + [(2, 64, 8, 12)] * 3


def test_state_is_model_state_reset_swapped_and_freed(dec, latents):
    state = dec.new_state(2, LH, LW)
    assert isinstance(state, ModelState) and state.nbytes == dec.state_bytes(2, LH, LW) == 4 * 2 * (
        3 * 256 * 6 + 3 * 128 * 24 + 3 * 64 * 96)
    one_shot = dec.decode(dec.new_state(2, LH, LW), latents)
    dec.decode(state, latents[:, :, 3:5])
    state.reset()                       # the past is forgotten: the session starts again
    a = dec.decode(state, latents[:, :, :2])
    before = [c.clone() for c in state.caches]
    state.to_host()
    state.to_device("cpu")
    assert all(torch.equal(c, b) for c, b in zip(state.caches, before))
    b = dec.decode(state, latents[:, :, 2:])
    assert (torch.cat([a, b], 2) - one_shot).abs().max().item() < 1e-5
    state.free()
    assert state.freed and state.nbytes == 0
    with pytest.raises(RuntimeError, match="freed"):
        dec.decode(state, latents[:, :, :1])


def test_bad_latents_change_nothing(dec, latents):
    state = dec.new_state(2, LH, LW)
    dec.decode(state, latents[:, :, :1])
    before = [c.clone() for c in state.caches]
    for bad in (latents[:1, :, :1], latents[:, :, :1, :1], latents[:, :, 0], latents[:, :8, :1]):
        with pytest.raises(ValueError, match="do not match"):
            dec.decode(state, bad)
        with pytest.raises(ValueError, match="do not match"):
            next(dec.frames(state, bad))
    assert state.latent_frames == 1
    assert all(torch.equal(c, b) for c, b in zip(state.caches, before))
