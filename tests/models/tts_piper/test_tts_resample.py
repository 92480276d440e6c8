"""Streaming polyphase resampling: push boundaries are invisible."""

import math

import torch

from models.tts.piper.resample import PolyphaseResampler

import piper_reference as plain


def _stream(r, x, sizes):
    state, out, i = r.start(), [], 0
    for n in sizes:
        y, state = r.push(state, x[i : i + n])
        out.append(y)
        i += n
    y, state = r.push(state, x[i:])
    out.append(y)
    y, state = r.finish(state)
    out.append(y)
    return torch.cat(out), state


def test_ratio_and_lengths():
    r = PolyphaseResampler(22050, 24000)
    assert (r.up, r.down, r.half) == (160, 147, 16)
    assert tuple(r.bank.shape) == (160, 32)
    assert [r.output_length(n) for n in (0, 1, 147, 148, 3072)] == [0, 2, 160, 162, 3344]


def test_streamed_pieces_equal_the_whole_signal_resampled():
    r = PolyphaseResampler(22050, 24000)
    x = torch.randn(10000, generator=torch.Generator().manual_seed(0))
    whole = plain.resample(r, x)
    assert whole.numel() == 10885
    for sizes in ([1, 5, 3072, 17, 100, 4000], [3072, 6144], [9999], [0, 0, 15, 16, 17]):
        streamed, state = _stream(r, x, sizes)
        assert torch.equal(streamed, whole), sizes
        assert (state.received, state.produced) == (10000, 10885)


def test_outputs_wait_only_for_the_look_ahead():
    r = PolyphaseResampler(22050, 24000)
    y, state = r.push(r.start(), torch.ones(16))
    assert y.numel() == 0  # output 0 needs x[16]
    y, state = r.push(state, torch.ones(1))
    assert y.numel() == 2  # outputs 0 and 1 both sit before x[1]
    y, state = r.push(state, torch.ones(147))
    assert state.produced == 162 and y.numel() == 160


def test_dc_passes_with_unit_gain_and_a_tone_keeps_its_shape():
    r = PolyphaseResampler(22050, 24000)
    y = plain.resample(r, torch.ones(2000))
    assert torch.allclose(y[40:-40], torch.ones_like(y[40:-40]), atol=1e-6)
    t = torch.arange(22050) / 22050
    y = plain.resample(r, torch.sin(2 * math.pi * 440 * t))
    ref = torch.sin(2 * math.pi * 440 * torch.arange(y.numel()) / 24000)
    assert float((y - ref)[100:-100].abs().max()) < 1e-3


def test_downsampling_works_too():
    r = PolyphaseResampler(24000, 16000)
    assert (r.up, r.down, r.half) == (2, 3, 24)
    x = torch.randn(5000, generator=torch.Generator().manual_seed(1))
    streamed, _ = _stream(r, x, [7, 1000, 33])
    assert torch.equal(streamed, plain.resample(r, x))
    assert streamed.numel() == 3334
