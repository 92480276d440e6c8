"""``flow.ReverseFlow`` (time-major, cropped between couplings) against transformers' reverse flow."""

import pytest
import torch

from models.tts.piper.flow import ReverseFlow
from models.tts.piper.windows import flow_span

import piper_reference as plain
from tts_support import SENTENCE, SHORT, needs_tts

pytestmark = needs_tts


@pytest.fixture(scope="module")
def priors(voice):
    from models.tts.piper.phonemes import Phonemizer
    from models.tts.piper.voice import LatentRequest

    ph = Phonemizer(voice.spec.espeak_voice, voice.spec.phoneme_id_map)
    return [plain.prior(voice, [LatentRequest(tuple(ph.ids(t)), 1.0, 0.667, 0.8, seed=5)])[0] for t in (SENTENCE, SHORT)]


def _reference(voice, z_p):
    with torch.inference_mode():
        return voice.model.flow(z_p[None], torch.ones(1, 1, z_p.shape[-1]), None, reverse=True)[0]


def test_whole_segments_equal_the_reference_alone_and_padded(voice, priors):
    flow = ReverseFlow(voice.model.flow)
    assert flow.per_coupling * len(flow.couplings) == voice.flow_context == 32
    want = [_reference(voice, p) for p in priors]
    # Latents reach |z| ~ 40, where float32 steps are ~4e-6: rounding only.
    for got, ref in zip(flow(priors), want):
        assert got.shape == ref.shape
        assert float((got - ref).abs().max()) <= 1e-4
    for p, ref in zip(priors, want):
        (alone,) = flow([p])
        assert float((alone - ref).abs().max()) <= 1e-4


def test_cropped_spans_equal_the_whole_flow(voice, priors):
    flow = ReverseFlow(voice.model.flow)
    prior = priors[0]
    total = prior.shape[-1]
    want = _reference(voice, prior)
    first = flow_span(0, 23, total, voice.flow_context)
    middle = flow_span(23, 60, total, voice.flow_context)  # later spans run to the end
    spans = (first, middle)
    # Both in one padded batch, as run_batch does for two sessions.
    outs = flow([prior[:, c.lo : c.hi] for c in spans], keep=[(c.start - c.lo, c.end - c.lo) for c in spans])
    for c, z in zip(spans, outs):
        assert z.shape == (prior.shape[0], c.end - c.start)
        assert float((z - want[:, c.start : c.end]).abs().max()) <= 1e-4
    # A span in the middle of the sentence, context on both sides, cropped to its core.
    (mid,) = flow([prior[:, 100:200]], keep=[(32, 68)])
    assert float((mid - want[:, 132:168]).abs().max()) <= 1e-4
    # With a quarter of the context on the right the last kept frames are wrong
    # (the farthest frames' pull is weak: 8 missing gave only 4e-5 with one draw
    # of the noise, 16 missing 7e-3 with another, 24 missing 0.3).
    (short,) = flow([prior[:, 100:176]], keep=[(32, 68)])
    assert float((short[:, -1] - want[:, 167]).abs().max()) > 1e-2


def test_keep_outside_the_segment_is_refused(voice, priors):
    flow = ReverseFlow(voice.model.flow)
    with pytest.raises(ValueError, match="outside"):
        flow([priors[1][:, :40]], keep=[(10, 41)])
    with pytest.raises(ValueError, match="outside"):
        flow([priors[1][:, :40]], keep=[(10, 10)])


def test_the_voice_keeps_the_reference_path(voice, priors):
    from models.tts.piper.voice import TorchVoice

    reference = TorchVoice(voice.model, voice.spec, voice.device, reference=True)
    (a,), (b,) = reference.flow([priors[1]], keep=[(3, 50)]), voice.flow([priors[1]], keep=[(3, 50)])
    assert a.shape == b.shape == (priors[1].shape[0], 47)
    assert float((a - b).abs().max()) <= 1e-4
