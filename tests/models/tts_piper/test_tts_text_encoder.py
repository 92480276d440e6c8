"""``text_encoder.TextEncoder`` against transformers' ``VitsTextEncoder`` forward on the real voice."""

import pytest
import torch
from torch import nn

from models.tts.piper.conv_matmul import ConvAsMatmul
from models.tts.piper.text_encoder import TextEncoder

import piper_reference as plain
from tts_support import SENTENCE, SHORT, needs_tts


@pytest.mark.parametrize("kernel, dilation, pad", [(1, 1, (0, 0)), (3, 1, (1, 1)), (5, 3, (6, 6)), (4, 1, (1, 2))])
def test_conv_as_matmul_equals_the_conv(kernel, dilation, pad):
    torch.manual_seed(0)
    conv = nn.Conv1d(6, 5, kernel, dilation=dilation)
    x = torch.randn(2, 6, 17)
    want = conv(nn.functional.pad(x, pad))
    got = ConvAsMatmul(conv, *pad)(x.transpose(1, 2).contiguous()).transpose(1, 2)
    assert got.shape == want.shape
    assert float((got - want).detach().abs().max()) <= 1e-5


def test_conv_as_matmul_refuses_grouped_or_strided_convs():
    with pytest.raises(ValueError):
        ConvAsMatmul(nn.Conv1d(4, 4, 3, groups=4), 1, 1)
    with pytest.raises(ValueError):
        ConvAsMatmul(nn.Conv1d(4, 4, 3, stride=2), 1, 1)


@pytest.fixture(scope="module")
def ids(voice):
    from models.tts.piper.phonemes import Phonemizer

    ph = Phonemizer(voice.spec.espeak_voice, voice.spec.phoneme_id_map)
    hi = ph.ids("Hi.")
    # The last: 5 ids, fewer than the attention band's 9 diagonals.
    return [ph.ids(SENTENCE), ph.ids(SHORT), hi[:4] + hi[-1:]]


@needs_tts
def test_equals_transformers_alone_and_padded(voice, ids):
    module = voice.model.text_encoder
    ours = TextEncoder(module)
    assert len(ids[2]) <= 2 * module.config.window_size + 1  # shorter than the band
    with torch.inference_mode():
        for x in ids:
            t, mask = torch.tensor([x]), torch.ones(1, len(x), 1)
            want, got = module(input_ids=t, padding_mask=mask), ours(t, mask)
            # Means reach ~13: float32 steps there are ~1e-6.
            assert float((got.means - want.prior_means).abs().max()) <= 5e-5
            assert float((got.log_variances - want.prior_log_variances).abs().max()) <= 5e-5
            assert float((got.hidden - want.last_hidden_state).abs().max()) <= 5e-5
        longest = max(map(len, ids))
        t, mask = torch.zeros(len(ids), longest, dtype=torch.long), torch.zeros(len(ids), longest, 1)
        for b, x in enumerate(ids):
            t[b, : len(x)], mask[b, : len(x)] = torch.tensor(x), 1
        want = module(input_ids=t, padding_mask=mask, attention_mask=mask[..., 0].long())
        got = ours(t, mask)
        assert float(((got.means - want.prior_means) * mask).abs().max()) <= 5e-5
        # Padding stays zero, and a padded item equals itself encoded alone.
        assert float(got.means[2, len(ids[2]) :].abs().max()) == 0.0
        alone = ours(torch.tensor([ids[1]]), torch.ones(1, len(ids[1]), 1))
        assert float((got.means[1, : len(ids[1])] - alone.means[0]).abs().max()) <= 5e-5


@needs_tts
def test_the_voice_uses_it_and_keeps_the_reference_path(voice, ids):
    from models.tts.piper.voice import LatentRequest, TorchVoice

    reference = TorchVoice(voice.model, voice.spec, voice.device, reference=True)
    request = LatentRequest(tuple(ids[0]), 1.0, 0.667, 0.8, seed=3)
    (want,), (got,) = plain.prior(reference, [request]), plain.prior(voice, [request])
    assert got.shape == want.shape  # the same durations
    assert float((got - want).abs().max()) <= 1e-4


@needs_tts
def test_first_rows_then_the_rest_equal_the_whole_encoder_alone_and_padded(voice, ids):
    from models.tts.piper.text_encoder import TextEncoder

    ours = TextEncoder(voice.model.text_encoder)
    assert ours.ffn_reach == 2
    n = len(ids[0])
    x = torch.tensor([ids[0]])
    whole = ours(x, torch.ones(1, n, 1))
    # Rows at the start, in the middle, and two short of the end (the last that splits).
    for rows in (1, 2, 40, n - 3):
        first = ours(x, torch.ones(1, n, 1), rows)
        assert first.hidden.shape == (1, rows, 192) and first.last_input.shape == (1, n, 192)
        rest = ours.rest(first.last_input, rows)
        for name in ("hidden", "means", "log_variances"):
            joined = torch.cat([getattr(first, name), getattr(rest, name)], dim=1)
            assert float((joined - getattr(whole, name)).abs().max()) <= 5e-6, (rows, name)
    # Too few rows left to split: the whole layer, nothing pending.
    assert ours(x, torch.ones(1, n, 1), n - 2).last_input is None
    # In a padded batch: each item's rest from its own unpadded last input.
    longest = max(map(len, ids))
    t, mask = torch.zeros(len(ids), longest, dtype=torch.long), torch.zeros(len(ids), longest, 1)
    for b, i in enumerate(ids):
        t[b, : len(i)], mask[b, : len(i)] = torch.tensor(i), 1
    first = ours(t, mask, 30)
    for b, i in enumerate(ids):
        alone = ours(torch.tensor([i]), torch.ones(1, len(i), 1))
        if len(i) > 30:
            rest = ours.rest(first.last_input[b : b + 1, : len(i)], 30)
            joined = torch.cat([first.means[b : b + 1], rest.means], dim=1)
        else:  # a short item is whole in the first rows
            joined = first.means[b : b + 1, : len(i)]
        assert float((joined - alone.means).abs().max()) <= 5e-5
    with pytest.raises(ValueError, match="rest from position"):
        ours.rest(first.last_input[2:3, :5], 30)
