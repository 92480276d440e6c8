"""``durations.DurationPredictor`` against transformers' duration predictor, on the real voice."""

import pytest
import torch

from models.tts.piper.durations import DurationPredictor, spline_reverse

from tts_support import SENTENCE, SHORT, needs_tts


def test_spline_reverse_equals_transformers():
    from transformers.models.vits.modeling_vits import _unconstrained_rational_quadratic_spline

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 1, 300, generator=g) * 3  # some outside the tail bound of 5
    x[0, 0, :3] = torch.tensor([-5.0, 5.0, 7.5])
    w, h, d = (torch.randn(2, 1, 300, n, generator=g) for n in (10, 10, 9))
    want, _ = _unconstrained_rational_quadratic_spline(x, w, h, d, reverse=True, tail_bound=5.0)
    got = spline_reverse(x, w, h, d, tail_bound=5.0)
    assert torch.equal(got, want)
    assert float((got - x).abs().max()) > 0.1 and got[0, 0, 2] == 7.5  # identity outside only


@pytest.fixture(scope="module")
def encoded(voice):
    from models.tts.piper.phonemes import Phonemizer

    ph = Phonemizer(voice.spec.espeak_voice, voice.spec.phoneme_id_map)
    ids = [ph.ids(t) for t in (SENTENCE, SHORT)]
    longest = max(map(len, ids))
    t, mask = torch.zeros(2, longest, dtype=torch.long), torch.zeros(2, longest, 1)
    for b, x in enumerate(ids):
        t[b, : len(x)], mask[b, : len(x)] = torch.tensor(x), 1
    with torch.inference_mode():
        out = voice.model.text_encoder(input_ids=t, padding_mask=mask, attention_mask=mask[..., 0].long())
    return out.last_hidden_state.transpose(1, 2), mask.transpose(1, 2)


@needs_tts
def test_equals_the_reference_duration_predictor_padded(voice, encoded):
    from models.tts.piper.voice import TorchVoice

    hidden, mask = encoded
    noise = torch.randn(2, 2, hidden.shape[-1], generator=torch.Generator().manual_seed(1)) * 0.8 * mask
    reference = TorchVoice(voice.model, voice.spec, voice.device, reference=True)
    with torch.inference_mode():
        want = reference._log_durations(hidden, mask, noise)
        got = DurationPredictor(voice.model.duration_predictor)(hidden, mask, noise)
    assert got.shape == want.shape == (2, 1, hidden.shape[-1])
    # The spline's inverse amplifies input rounding near its bin edges: the 1x1
    # convs and the depthwise taps sum in another order than transformers' convs,
    # and a few of ~400 values land 1-2.5e-5 apart (the channel-first forwards
    # before the time-major ones reached 2.3e-5 on the bench's sentences too; another
    # Xeon's kernels, 5.3e-5 here).
    assert float(((got - want) * mask).abs().max()) <= 1e-4
    # The durations the prior rounds up from them are the same.
    assert torch.equal(torch.ceil(torch.exp(got) * mask), torch.ceil(torch.exp(want) * mask))
