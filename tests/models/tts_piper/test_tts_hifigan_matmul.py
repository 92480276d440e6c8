"""``hifigan_matmul.DecoderMatmul`` against the module decode (``hifigan.decode_cores``) on the real voice."""

import pytest
import torch

from models.tts.piper.hifigan import decode_cores
from models.tts.piper.hifigan_matmul import DecoderMatmul, UpsampleAsMatmul
from models.tts.piper.windows import WindowPlan

import piper_reference as plain
from tts_support import SENTENCE, needs_tts


def test_resblock_1_decoders_are_refused():
    from transformers import VitsConfig
    from transformers.models.vits.modeling_vits import VitsHifiGan

    tiny = VitsHifiGan(VitsConfig(flow_size=8, upsample_initial_channel=8, upsample_rates=[2], upsample_kernel_sizes=[4]))
    assert not DecoderMatmul.supports(tiny)
    with pytest.raises(ValueError, match="resblock type 2"):
        DecoderMatmul(tiny, None)


@pytest.mark.parametrize("cin,cout,kernel,stride", [(256, 128, 16, 8), (64, 32, 8, 4), (6, 3, 9, 3), (4, 2, 5, 5)])
def test_upsample_as_matmul_equals_conv_transpose(cin, cout, kernel, stride):
    torch.manual_seed(0)
    up = torch.nn.ConvTranspose1d(cin, cout, kernel, stride, padding=(kernel - stride) // 2)
    x = torch.randn(2, cin, 23)
    with torch.inference_mode():
        want = up(x)
        got = UpsampleAsMatmul(up)(x.transpose(1, 2).contiguous()).transpose(1, 2)
    assert got.shape == want.shape == (2, cout, (23 - 1) * stride - 2 * up.padding[0] + kernel)
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())


def test_upsample_as_matmul_refuses_a_kernel_that_is_not_whole_strides():
    up = torch.nn.ConvTranspose1d(4, 2, 5, 2)
    assert not UpsampleAsMatmul.supports(up)
    with pytest.raises(ValueError, match="kernel = m \\* stride"):
        UpsampleAsMatmul(up)


@needs_tts
def test_windows_equal_the_module_decode_alone_and_padded(voice):
    from models.tts.piper.phonemes import Phonemizer
    from models.tts.piper.voice import LatentRequest

    ph = Phonemizer(voice.spec.espeak_voice, voice.spec.phoneme_id_map)
    (z,) = plain.latents(voice, [LatentRequest(tuple(ph.ids(SENTENCE)), 1.0, 0.667, 0.8, seed=2)])
    every = plain.plan_windows(WindowPlan(12, 96, 11), z.shape[-1])
    windows = every[:4] + every[-1:]  # the growing ones and the sentence's end
    latents = [z[:, w.lo : w.hi] for w in windows]
    cores = [w.core_offset(voice.hop) for w in windows]
    ours = DecoderMatmul(voice.model.decoder, voice.geometry)
    with torch.inference_mode():
        want = [
            decode_cores(voice.model.decoder, voice.geometry, x[None], [x.shape[-1]], [c])[0]
            for x, c in zip(latents, cores)
        ]
        alone = [ours.decode_cores(x[None], [x.shape[-1]], [c])[0] for x, c in zip(latents, cores)]
        longest = max(x.shape[-1] for x in latents)
        batch = torch.zeros(len(latents), z.shape[0], longest)
        for b, x in enumerate(latents):
            batch[b, :, : x.shape[-1]] = x
        padded = ours.decode_cores(batch, [x.shape[-1] for x in latents], cores)
    for w, a, p, ref in zip(windows, alone, padded, want):
        assert a.shape == p.shape == ref.shape == ((w.end - w.start) * voice.hop,)
        assert float((a - ref).abs().max()) <= 1e-5
        assert float((p - ref).abs().max()) <= 1e-5
