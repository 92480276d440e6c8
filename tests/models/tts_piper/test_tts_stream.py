"""Windowed HiFi-GAN decode against the whole-sentence decode, on the real voice."""

import pytest
import torch

from models.tts.piper.hifigan import decode_padded
from models.tts.piper.windows import WindowPlan

import piper_reference as plain
from tts_support import SENTENCE, SHORT, needs_tts

pytestmark = needs_tts


@pytest.fixture(scope="module")
def latents(voice):
    from models.tts.piper.phonemes import Phonemizer
    from models.tts.piper.voice import LatentRequest

    ph = Phonemizer(voice.spec.espeak_voice, voice.spec.phoneme_id_map)
    reqs = [LatentRequest(tuple(ph.ids(t)), 1.0, 0.0, 0.0) for t in (SENTENCE, SHORT)]
    return [plain.latents(voice, [r])[0] for r in reqs], reqs


def _windowed(voice, z, plan):
    windows = plain.plan_windows(plan, z.shape[-1])
    audio = voice.decode([z[:, w.lo : w.hi] for w in windows])
    return torch.cat([a[slice(*w.core_offset(voice.hop))] for a, w in zip(audio, windows)])


def test_receptive_field_read_off_the_model(voice):
    assert (voice.context_left, voice.context_right, voice.hop) == (11, 11, 256)
    assert voice.flow_context == 32


def test_flow_in_two_spans_equals_the_whole_flow(voice, latents):
    from models.tts.piper.windows import flow_span

    (z, _), (req, _) = latents
    (prior,) = plain.prior(voice, [req])
    first = flow_span(0, 23, prior.shape[-1], voice.flow_context)
    rest = flow_span(23, 47, prior.shape[-1], voice.flow_context)
    # Both spans in one padded batch, as run_batch does for two sessions.
    a, b = voice.flow([prior[:, first.lo : first.hi], prior[:, rest.lo : rest.hi]])
    spliced = torch.cat([a[:, : first.end], b[:, rest.start - rest.lo :]], dim=1)
    assert spliced.shape == z.shape
    # Latents reach |z| ~ 40, where float32 steps are ~4e-6: rounding only.
    assert float(z.abs().max()) > 30
    assert float((spliced - z).abs().max()) <= 1e-4
    # The audio decoded in windows from spliced latents matches the whole decode.
    assert float((_windowed(voice, spliced, WindowPlan(12, 48, 11)) - plain.decode_whole(voice, z)).abs().max()) <= 1e-5
    # With too little context the prefix's last frames are simply wrong.
    (short_ctx,) = voice.flow([prior[:, :27]])
    assert float((short_ctx[:, :23] - z[:, :23]).abs().max()) > 1.0


def test_windows_concatenate_to_the_whole_decode(voice, latents):
    (z, short), _ = latents
    assert (z.shape[-1], short.shape[-1]) == (418, 173)
    whole = plain.decode_whole(voice, z)
    for plan in (WindowPlan(12, 48, 11), WindowPlan(5, 20, 11), WindowPlan(12, 96, 11)):
        streamed = _windowed(voice, z, plan)
        assert streamed.shape == whole.shape == (107008,)
        assert float((streamed - whole).abs().max()) <= 1e-5, plan


def test_cropped_windows_equal_the_whole_decode_alone_and_batched(voice, latents):
    (z, short), _ = latents
    whole = plain.decode_whole(voice, z)
    windows = plain.plan_windows(WindowPlan(12, 96, 11), z.shape[-1])
    cores = [w.core_offset(voice.hop) for w in windows]
    alone = [voice.decode([z[:, w.lo : w.hi]], cores=[c])[0] for w, c in zip(windows, cores)]
    assert float((torch.cat(alone) - whole).abs().max()) <= 1e-5
    # All windows of the sentence in one padded, cropped forward, plus a window
    # of another sentence that ends it.
    short_whole = plain.decode_whole(voice, short)
    batched = voice.decode(
        [z[:, w.lo : w.hi] for w in windows] + [short[:, 150:173]],
        cores=cores + [(12 * 256, 23 * 256)],
    )
    assert float((torch.cat(batched[:-1]) - whole).abs().max()) <= 1e-5
    assert float((batched[-1] - short_whole[162 * 256 :]).abs().max()) <= 1e-5


def test_too_little_context_is_visible(voice, latents):
    (z, _), _ = latents
    whole = plain.decode_whole(voice, z)
    assert float((_windowed(voice, z, WindowPlan(12, 48, 4)) - whole).abs().max()) > 1e-4


def test_frames_outside_the_context_do_not_reach_the_core(voice, latents):
    (z, _), _ = latents
    core = slice(40 * 256, 52 * 256)  # frames [40, 52) read frames [29, 63)
    base = plain.decode_whole(voice, z)[core]
    for frame, reaches in ((27, False), (28, False), (29, True), (62, True), (63, False), (64, False)):
        poked = z.clone()
        poked[:, frame] += 1.0
        diff = float((plain.decode_whole(voice, poked)[core] - base).abs().max())
        # The edges of the field reach the core only faintly (~1e-9), but they do.
        assert (diff > 0.0) == reaches, (frame, diff)


def test_padded_batch_equals_each_window_alone(voice, latents):
    (z, short), _ = latents
    # A mid-sentence window with context, one decoded as if it ended its
    # sentence (no right context: padding would leak into it without masking),
    # a sentence-final one and a first one.
    items = [z[:, 25:95], z[:, 100:123], short[:, 150:173], z[:, 0:23]]
    batched = voice.decode(items)
    for item, got in zip(items, batched):
        alone = voice.decode([item])[0]
        assert got.shape == alone.shape
        assert float((got - alone).abs().max()) <= 1e-5
    # The same batch without masks really would differ at the padded item's end.
    padded = torch.zeros(len(items), z.shape[0], 70)
    for b, item in enumerate(items):
        padded[b, :, : item.shape[-1]] = item
    with torch.inference_mode():
        naive = decode_padded(voice.model.decoder, padded, None)[1, : 23 * 256]
    assert float((naive - batched[1]).abs().max()) > 1e-3


def test_batched_latents_keep_durations(voice, latents):
    (z, short), reqs = latents
    both = plain.latents(voice, reqs)
    assert [t.shape[-1] for t in both] == [418, 173]
    assert float((both[0] - z).abs().max()) <= 1e-3
    assert float((both[1] - short).abs().max()) <= 1e-3


def test_noise_is_seeded_per_sentence(voice, latents):
    from dataclasses import replace

    _, (req, _) = latents
    noisy = replace(req, noise_scale=0.667, noise_w=0.8, seed=7)
    a, b = plain.latents(voice, [noisy])[0], plain.latents(voice, [noisy])[0]
    assert torch.equal(a, b)
    c = plain.latents(voice, [replace(noisy, seed=8)])[0]
    assert a.shape != c.shape or not torch.equal(a, c)


def test_length_scale_stretches_the_sentence(voice, latents):
    from dataclasses import replace

    _, (req, _) = latents
    frames = [plain.latents(voice, [replace(req, length_scale=s)])[0].shape[-1] for s in (0.5, 1.0, 2.0)]
    assert frames == [268, 418, 736]
