"""The one-shot paths the streamed voice is checked against.

The server never runs these: it takes a sentence's prior in two steps, runs the flow over
the frames each window reads and decodes a window at a time (``models/tts/piper/adapter.py``).
Each function here does the same work in one go, through the voice's own stages, so a test
compares the stream with the whole.
"""

from __future__ import annotations

from typing import Sequence

import torch

from models.tts.piper.resample import PolyphaseResampler
from models.tts.piper.voice import LatentRequest, TorchVoice
from models.tts.piper.windows import Window, WindowPlan, window_at


def prior(voice: TorchVoice, requests: Sequence[LatentRequest]) -> list[torch.Tensor]:
    """The sampled prior z_p [C, T_i] of each whole sentence: the text encoder and the
    durations over all its ids at once, batched with padding."""
    return [p.z_p for p in voice.prior_prefix(requests, prefix=None)]


def latents(voice: TorchVoice, requests: Sequence[LatentRequest]) -> list[torch.Tensor]:
    """Decoder input [C, T_i] of each whole sentence: ``prior``, then the whole flow."""
    return voice.flow(prior(voice, requests))


@torch.inference_mode()
def decode_whole(voice: TorchVoice, z: torch.Tensor) -> torch.Tensor:
    """transformers' own decoder forward over a whole sentence's latents [C, T]."""
    return voice.model.decoder(z[None])[0, 0]


def synthesize(voice: TorchVoice, request: LatentRequest) -> torch.Tensor:
    """Whole-sentence audio [T * hop] in [-1, 1]: latents, then one decode."""
    return decode_whole(voice, latents(voice, [request])[0])


def plan_windows(plan: WindowPlan, total: int) -> list[Window]:
    """Every window of a ``total``-frame sentence, in order (what a stream walks one by one)."""
    out: list[Window] = []
    start = 0
    while start < total:
        w = window_at(plan, len(out), start, total)
        out.append(w)
        start = w.end
    return out


def resample(resampler: PolyphaseResampler, x: torch.Tensor) -> torch.Tensor:
    """The whole signal at once: one push, then the finish."""
    head, state = resampler.push(resampler.start(), x)
    tail, _ = resampler.finish(state)
    return torch.cat([head, tail])
