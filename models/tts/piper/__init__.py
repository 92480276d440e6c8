"""Piper's joe voice (``en_US-joe-medium``, VITS + HiFi-GAN) in torch, streamed a decoder
window at a time.

    adapter.py         PiperTTS: the voice behind the TTS seam, one batched step per engine call
    stream.py          SentenceStream: one sentence's latents, its next window, the PCM sent
    windows.py         which latent frames each decoder window and each flow span covers
    voice.py           TorchVoice: the converted voice as prior, flow and decoder stages
    text_encoder.py    the VITS text encoder, rewritten for speed on the model's weights
    durations.py       the stochastic duration predictor's inference pass
    prior.py           a sentence's sampled prior, for a prefix of its phonemes first
    flow.py            the prior flow in reverse, cropped to the frames kept
    hifigan.py         the HiFi-GAN decoder: padded batches, cropped windows, receptive field
    hifigan_matmul.py  the same decode time-major, its convs as matrix products
    conv_matmul.py     a stride-1 conv as one matrix product (float32 or bfloat16)
    resample.py        streaming polyphase resampling (22,050 -> 24,000 Hz)
    phonemes.py        text -> phoneme ids the way Piper does it (espeak-ng)
    espeak_process.py  espeak-ng in a child process, so a crash fails one sentence
    convert.py         the ONNX voice -> transformers VitsModel weights, cached
    availability.py    whether the ``tts`` extra is installed, without importing it
    MODEL_CARD.md      what the voice is, deviations, measurements, licences
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from models.factory import BuildOptions, ModelUnavailable


def build(path: str | None, options: BuildOptions) -> "PiperTTS":  # noqa: F821 - imported below
    """Factory-table entry ``piper-joe-medium``; ``path``: the converted-voice cache
    folder (default: the user cache). Without the ``tts`` extra: ``ModelUnavailable``."""
    from models.cpu_format import chosen_format
    from models.tts.piper.adapter import PiperTTS
    from models.tts.piper.availability import TTSUnavailable

    kwargs: dict[str, Any] = {"products": chosen_format(options)}
    if options.max_batch is not None:
        kwargs["max_batch"] = options.max_batch
    try:
        return PiperTTS.load(device=options.device, cache_root=Path(path) if path else None, **kwargs)
    except TTSUnavailable as exc:
        raise ModelUnavailable(f"TTS unavailable: {exc}") from exc
