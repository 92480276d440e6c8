"""conditioning.py: the frames a call uses, the frame size, the first-frame condition and the
latents of a continuing call, against the VAE and the image encoder run by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.policy.dreamzero.conditioning import (first_frame_condition, frame_size, frames_for_call, latent_grid,
                                                  observed_latents, to_video)
from models.policy.dreamzero.config import DROID, TINY
from models.policy.dreamzero.vae import encode_latents


def test_frames_for_call_pads_with_the_first_frame():
    f = [np.full((2, 2, 3), i, np.uint8) for i in range(8)]
    ids = lambda frames: [int(x[0, 0, 0]) for x in frames]  # noqa: E731
    assert ids(frames_for_call(f[:1], first_call=True)) == [0]
    assert ids(frames_for_call(f[:4], first_call=True)) == [3]
    assert ids(frames_for_call(f[:2], first_call=False)) == [0, 0, 0, 1]
    assert ids(frames_for_call(f[4:8], first_call=False)) == [4, 5, 6, 7]
    with pytest.raises(ValueError):
        frames_for_call([], first_call=True)


def test_frame_size_is_droids_and_the_tiny_models():
    assert latent_grid(DROID) == (22, 40) and frame_size(DROID) == (352, 640)
    assert latent_grid(TINY) == (1, 4) and frame_size(TINY) == (16, 64)


def test_pixels_are_normalised_to_minus_one_one():
    v = to_video([np.array([[[0, 255, 51]]], np.uint8)], "cpu")
    assert v.shape == (1, 3, 1, 1, 1)
    assert torch.allclose(v.flatten(), torch.tensor([-1.0, 1.0, 51 / 255 * 2 - 1]))


def test_latents_are_normalised_with_wan21s_mean_and_std(tiny):
    video = torch.rand(1, 3, 5, 16, 64) * 2 - 1
    mu = tiny.vae.encode(video).latent_dist.mean
    mean = torch.tensor(tiny.vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(tiny.vae.config.latents_std).view(1, -1, 1, 1, 1)
    assert tiny.vae.config.latents_mean[:2] == [-0.7571, -0.7089]
    assert tiny.vae.config.latents_std[:2] == [2.8184, 1.4541]
    torch.testing.assert_close(encode_latents(tiny.vae, video), (mu - mean) / std)


def test_the_first_frame_condition(tiny):
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (16, 64, 3), dtype=np.uint8)
    ff = first_frame_condition(tiny.image_encoder, tiny.vae, frame, TINY, "cpu")
    video = to_video([frame], "cpu")
    assert torch.equal(ff.clip, tiny.image_encoder.encode(video[:, :, 0]))
    black = torch.zeros(1, 3, TINY.num_frames - 1, 16, 64)
    latents = encode_latents(tiny.vae, torch.cat([video, black], 2))
    assert ff.y.shape == (1, 4 + 16, TINY.condition_latents, 2, 8)
    assert torch.equal(ff.y[:, 4:], latents) and torch.equal(ff.latent, latents[:, :, :1])
    assert (ff.y[:, :4, 0] == 1).all() and (ff.y[:, :4, 1:] == 0).all()


def test_a_continuing_call_encodes_four_frames_repeated_after_the_first(tiny):
    rng = np.random.default_rng(1)
    frames = [rng.integers(0, 256, (16, 64, 3), dtype=np.uint8) for _ in range(4)]
    got = observed_latents(tiny.vae, frames, TINY, "cpu")
    # upstream: each frame twice (num_frame_per_block 2), the first in front: 9 frames -> 3 latents.
    order = [0, 0, 0, 1, 1, 2, 2, 3, 3]
    want = encode_latents(tiny.vae, to_video([frames[i] for i in order], "cpu"))[:, :, -2:]
    assert got.shape == (1, 16, 2, 2, 8) and torch.equal(got, want)
    with pytest.raises(ValueError, match="encodes 4 frames"):
        observed_latents(tiny.vae, frames[:3], TINY, "cpu")


def test_the_wires_read_only_frames_are_stitched_without_a_warning():
    import warnings

    from models.policy.dreamzero.observation import CAMERA_KEYS, stitch_cameras

    images = {}
    for i, key in enumerate(CAMERA_KEYS):
        img = np.full((4, 180, 320, 3), 40 * i, np.uint8)
        img.flags.writeable = False
        images[key] = img
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = stitch_cameras(images, 16, 64)
    writable = stitch_cameras({k: v.copy() for k, v in images.items()}, 16, 64)
    assert out.shape == (4, 16, 64, 3) and np.array_equal(out, writable)
