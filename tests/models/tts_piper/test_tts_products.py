"""The voice's products in bfloat16 (``products=``) and the load-time pick (``models.cpu_format``)."""

import numpy as np
import pytest
import torch

from tts_support import SENTENCE, needs_tts


def test_a_product_rounds_only_its_inputs():
    from models.tts.piper.conv_matmul import product

    x, w = torch.randn(3, 5, 16), torch.randn(16, 8)
    got = product(x, w.to(torch.bfloat16))
    assert got.dtype == torch.float32
    assert torch.equal(got, torch.matmul(x.to(torch.bfloat16), w.to(torch.bfloat16)).float())
    assert torch.equal(product(x, w), torch.matmul(x, w))


@needs_tts
def test_bfloat16_moves_the_prior_means_far_less_than_the_noise_they_are_drawn_with(voice):
    from models.tts.piper.adapter import PiperTTS
    from models.tts.piper.voice import TorchVoice

    bf16 = TorchVoice(voice.model, voice.spec, products=torch.bfloat16)
    assert bf16.products == torch.bfloat16 and bf16.products_pick is None
    assert bf16._encoder.layers[0].qkv_weight.dtype == torch.bfloat16
    ids = torch.tensor([PiperTTS(voice).phonemize(SENTENCE)])
    mask = torch.ones(1, ids.shape[1], 1)
    a, b = voice._encoder(ids, mask), bf16._encoder(ids, mask)
    assert b.means.dtype == torch.float32
    shift = (a.means - b.means).abs() / (torch.exp(a.log_variances) * 0.667)
    # bench/results/tts_products_quality_cpu.json: mean ~0.001, max <= 0.07 over 9 sentences.
    assert 0 < float(shift.mean()) < 0.01 and float(shift.max()) < 0.2


@needs_tts
def test_a_bfloat16_voice_streams_the_sentence(voice):
    from models.tts.base import DecodeWindow, SynthesizeSentence
    from models.tts.piper.adapter import PiperTTS
    from models.tts.piper.voice import TorchVoice

    def speak(v):
        tts = PiperTTS(v)
        answers = tts.run_batch([SynthesizeSentence("s", 0, 0, SENTENCE, 1.0, 22050, 5)])
        while not answers[-1].done:
            answers += tts.run_batch([DecodeWindow("s", 0, 0)])
        return np.frombuffer(b"".join(c.pcm for c in answers), "<i2")

    f32, bf16 = speak(voice), speak(TorchVoice(voice.model, voice.spec, products=torch.bfloat16))
    assert abs(bf16.size - f32.size) <= 0.02 * f32.size  # durations may move by a frame here and there
    assert np.abs(bf16).max() > 10000  # speech, not silence


@needs_tts
@pytest.mark.parametrize("native", [False, True])
def test_the_format_is_timed_only_where_bf16_is_native(voice, monkeypatch, native):
    import models.tts.piper.voice as voice_module

    monkeypatch.setattr(voice_module, "native_bf16", lambda: native)
    v = voice_module.TorchVoice(voice.model, voice.spec)
    if not native:
        assert (v.products, v.products_pick) == (torch.float32, None)
        return
    pick = v.products_pick
    assert set(pick["pass_ms"]) == {"float32", "bfloat16"}
    assert pick["picked"] == min(pick["pass_ms"], key=pick["pass_ms"].get)
    assert v.products == getattr(torch, pick["picked"])
    assert v._encoder.layers[0].conv_1.weight.dtype == v.products
    # The reference path and a chosen format are never timed.
    assert voice_module.TorchVoice(voice.model, voice.spec, reference=True).products_pick is None
    assert voice_module.TorchVoice(voice.model, voice.spec, products=torch.float32).products_pick is None


@needs_tts
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
def test_the_factory_takes_the_format_by_name(tts_cache, voice, name):
    from models.factory import BuildOptions
    from models.tts.piper import build

    tts = build(str(tts_cache), BuildOptions(cpu_format=name, max_batch=1))
    assert tts.describe()["products"] == name and tts.describe()["products_pick"] is None
