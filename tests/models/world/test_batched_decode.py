"""Batched streaming decode: the rows of several sessions decoded in one call, each row after
its own session's state, against each session decoded alone, for the Wan VAE and TAEHV.

Three sessions at different block counts share every batch: one at its first block (3 latent
frames make 9 frames) beside two at later blocks (12 frames each)."""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKLWan

from models.world.taehv import taehv_from_state_dict, random_state_dict
from models.world.wan_vae import StreamingWanDecoder

LH, LW = 2, 3          # latent height, width -> 16 x 24 pixels
BLOCK = 3              # latent frames per block
BLOCKS_BEFORE = (0, 2, 1)   # blocks each session decoded before the batched one


def _wan(batch_invariant: bool | None = None) -> StreamingWanDecoder:
    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                           latents_mean=[0.0] * 4, latents_std=[1.0] * 4).eval()
    return StreamingWanDecoder(vae, batch_invariant=batch_invariant)


def _taehv(batch_invariant: bool | None = None):
    dec = taehv_from_state_dict(random_state_dict(seed=0))
    dec.batch_invariant = batch_invariant
    return dec


DECODERS = {"wan": (_wan, 4), "taehv": (_taehv, 16)}


def _latents(channels: int) -> list[torch.Tensor]:
    """Each session's latent video: its earlier blocks, then the block decoded in the batch."""
    g = torch.Generator().manual_seed(1)
    return [torch.randn(1, channels, BLOCK * (n + 1), LH, LW, generator=g) for n in BLOCKS_BEFORE]


def _sessions(dec, videos: list[torch.Tensor]):
    """Fresh states advanced through each session's earlier blocks; the batch's latents [3, z, 3, h, w]."""
    states = []
    for v in videos:
        s = dec.new_state(1, LH, LW)
        for b in range(v.shape[2] // BLOCK - 1):
            dec.decode(s, v[:, :, b * BLOCK:(b + 1) * BLOCK])
        states.append(s)
    return states, torch.cat([v[:, :, -BLOCK:] for v in videos])


def _alone(dec, videos, streamed: bool) -> tuple[list[torch.Tensor], list]:
    states, z = _sessions(dec, videos)
    out = []
    for s, row in zip(states, z):
        if streamed:
            out.append(torch.stack(list(dec.frames(s, row[None])), 2)[0])
        else:
            out.append(dec.decode(s, row[None])[0])
    return out, states


def _batched_frames(dec, states, z) -> list[torch.Tensor]:
    per: list[list[torch.Tensor]] = [[] for _ in states]
    for rows, video in dec.frames_batch(states, z):
        for k, r in enumerate(rows):
            per[r].append(video[k])
    return [torch.cat(p, 1) for p in per]


@pytest.mark.parametrize("streamed", [True, False], ids=["frames", "decode"])
@pytest.mark.parametrize("name", DECODERS)
def test_three_sessions_in_one_call_equal_each_alone_bit_for_bit(name, streamed):
    make, channels = DECODERS[name]
    dec = make()
    videos = _latents(channels)
    want, want_states = _alone(dec, videos, streamed)
    states, z = _sessions(dec, videos)
    ptrs = [[c.data_ptr() for c in s.caches] for s in states]
    got = _batched_frames(dec, states, z) if streamed else dec.decode_batch(states, z)
    assert [tuple(g.shape) for g in got] == [(3, 9, 16, 24), (3, 12, 16, 24), (3, 12, 16, 24)]
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert len({float(g[:, -1].std()) for g in got}) == 3          # three different sessions
    # Each session's own state moved on, in place (no stacked copy), to where it moves alone.
    assert [s.latent_frames for s in states] == [BLOCK * (n + 1) for n in BLOCKS_BEFORE]
    assert [[c.data_ptr() for c in s.caches] for s in states] == ptrs
    for s, w in zip(states, want_states):
        assert all(torch.equal(a, b) for a, b in zip(s.caches, w.caches))


@pytest.mark.parametrize("name", DECODERS)
def test_rows_in_one_kernel_call_equal_each_alone_to_float_rounding(name):
    """``batch_invariant=False``: every convolution and attention takes all rows at once, as on
    CUDA; a row then differs from the row alone by float32 rounding only (measured: < 2e-6)."""
    make, channels = DECODERS[name]
    alone_dec, dec = make(), make(batch_invariant=False)
    videos = _latents(channels)
    want, _ = _alone(alone_dec, videos, streamed=True)
    states, z = _sessions(dec, videos)
    got = _batched_frames(dec, states, z)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert (g - w).abs().max().item() < 1e-5
    assert [s.latent_frames for s in states] == [BLOCK * (n + 1) for n in BLOCKS_BEFORE]


@pytest.mark.parametrize("name, progress", [
    # The Wan VAE's first latent frame of a session skips the upsamplers' time convs (1 frame,
    # not 4), so on that latent frame the first rows run apart from the others, first.
    ("wan", [[1, 0, 0], [1, 1, 1], [2, 2, 2], [3, 3, 3]]),
    # TAEHV does the same work for both (then drops 3 frames): one pass, two groups.
    ("taehv", [[1, 1, 1], [1, 1, 1], [2, 2, 2], [3, 3, 3]]),
])
def test_frames_come_out_as_each_latent_frame_is_decoded_first_rows_first(name, progress):
    make, channels = DECODERS[name]
    dec = make()
    states, z = _sessions(dec, _latents(channels))
    start = [s.latent_frames for s in states]
    seen, moved = [], []
    for rows, video in dec.frames_batch(states, z):
        seen.append((rows, video.shape[2]))
        moved.append([s.latent_frames - a for s, a in zip(states, start)])
    assert seen == [([0], 1), ([1, 2], 4), ([0, 1, 2], 4), ([0, 1, 2], 4)]
    assert moved == progress


@pytest.mark.parametrize("name", DECODERS)
def test_one_row_is_the_one_session_path(name):
    make, channels = DECODERS[name]
    dec = make()
    videos = _latents(channels)[1:2]
    want, _ = _alone(dec, videos, streamed=True)
    states, z = _sessions(dec, videos)
    got = list(dec.frames_batch(states, z))
    assert [(rows, v.shape[2]) for rows, v in got] == [([0], 1)] * 12     # one frame per yield
    assert torch.equal(torch.cat([v for _, v in got], 2)[0], want[0])
    states, z = _sessions(dec, videos)
    assert torch.equal(dec.decode_batch(states, z)[0], dec.decode(_sessions(dec, videos)[0][0], z)[0])


@pytest.mark.parametrize("name", DECODERS)
def test_bad_batches_are_refused_before_any_state_moves(name):
    make, channels = DECODERS[name]
    dec = make()
    states, z = _sessions(dec, _latents(channels))
    before = [[c.clone() for c in s.caches] for s in states]
    two = dec.new_state(2, LH, LW)
    bad = [
        ([states[0], states[0], states[1]], z, "appears twice"),
        (states[:2], z, "do not match"),
        (states, z[:, :, :0], "do not match"),
        (states, z[:, :1], "do not match"),
        ([states[0], states[1], two], z, "one-row states"),
        ([states[0], states[1], dec.new_state(1, LH, LW + 1)], z, "do not match"),
        ([], z[:0], "no rows"),
    ]
    for rows, lat, match in bad:
        with pytest.raises(ValueError, match=match):
            dec.frames_batch(rows, lat)
        with pytest.raises(ValueError, match=match):
            dec.decode_batch(rows, lat)
    freed = dec.new_state(1, LH, LW)
    freed.free()
    with pytest.raises(RuntimeError, match="freed"):
        dec.decode_batch([states[0], freed, states[1]], z)
    assert [s.latent_frames for s in states] == [BLOCK * n for n in BLOCKS_BEFORE]
    for s, b in zip(states, before):
        assert all(torch.equal(x, y) for x, y in zip(s.caches, b))
