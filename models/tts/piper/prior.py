"""A sentence's sampled prior z_p, for a prefix of its phonemes first, the rest later.

VITS samples the prior after the text encoder: the stochastic duration
predictor (SDP) turns noise into a duration per phoneme id, each id's mean and
log-variance is repeated for its frames, and noise is added. The first decoder
window reads only the first ~55 prior frames (``windows.flow_span``), i.e. the
first few dozen ids, so the SDP runs over a prefix of the ids before the first
audio and over the rest before the second window.

The SDP is local: its dilated convs (kernel 3, dilations 1, 3, 9: 13 ids each
side) run once for the conditioning and once in each of the three conv flows
used in reverse, so a duration reads ``reach`` = 4 * 13 = 52 ids each side
(``duration_reach``). A segment with that context, or the sentence edge, gives
the whole-sentence durations up to float rounding::

    ids        0                                                    L
               |====================================================|
    prefix     [0 ...... P) + reach        keeps durations [0, P)
    rest                [P - reach ........................... L)   keeps [P, L)

The text encoder's attention is global, so its first five layers run over the
whole sentence; its last layer runs its queries and feed-forward over the
prefix segment's ids only and over the others later (``TextEncoder.rest``).

Noise. Duration noise is [2, L], drawn first (L is known from the ids). The
prior noise is drawn time-major in blocks of ``NOISE_BLOCK`` frames from the
sentence's generator, so the noise of frame t does not depend on how many
frames the sentence has (a [C, T] draw would put frame t of channel c at
``c * T + t``): the prefix draws the first blocks, the rest continues from the
same generator, and the whole-sentence prior (``TorchVoice.prior_prefix`` with no
prefix) draws the same blocks in the same calls, so streamed and whole noise are identical.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

NOISE_BLOCK = 16  # frames of prior noise per generator call
PREFIX_IDS = 48  # ids whose durations the first audio waits for: ~96 frames at 2 a phoneme,
# enough for the first two windows (79 frames with the flow's context), so the rest waits for the third


def duration_reach(dp: nn.Module) -> int:
    """Ids of context, each side, that one duration of the SDP's reverse pass reads
    (transformers' ``VitsStochasticDurationPredictor``; VITS skips one flow)."""
    dds = dp.conv_dds
    per_dds = sum((c.kernel_size[0] - 1) * c.dilation[0] // 2 for c in dds.convs_dilated)
    conv_flows = sum(1 for f in dp.flows if hasattr(f, "conv_dds")) - 1
    return per_dds * (conv_flows + 1)


@dataclass(frozen=True)
class Segment:
    """SDP work: ids [lo, hi) of a sentence in, durations of [keep_lo, keep_hi) kept."""

    lo: int
    hi: int
    keep_lo: int
    keep_hi: int


def prefix_segment(length: int, prefix: int, reach: int) -> Segment:
    """The first SDP call: the whole sentence when the prefix and its context reach its end."""
    if prefix + reach >= length:
        return Segment(0, length, 0, length)
    return Segment(0, prefix + reach, 0, prefix)


def rest_segment(length: int, done: int, reach: int) -> Segment:
    """The second SDP call, for the durations [done, length)."""
    if not 0 < done < length:
        raise ValueError("rest of ids from %d in a %d-id sentence" % (done, length))
    return Segment(max(0, done - reach), length, done, length)


@dataclass
class SentencePrior:
    """The prior of one sentence as far as it is known.

    ``means`` / ``log_variances`` [L', C] and ``hidden`` [L', H] are the text
    encoder's for the first L' of the sentence's ``ids`` (all of them, or the
    prefix segment's while ``last_input`` [1, L, H], the encoder's last-layer
    input, waits for ``TextEncoder.rest``); ``durations`` covers ids [0, ids_done) and
    ``z_p`` [C, F] the frames those ids make. ``noise`` [F', C] holds the prior
    noise drawn so far (F' >= F, whole blocks), ``generator`` continues it.
    """

    ids: int
    length_scale: float
    noise_scale: float
    means: torch.Tensor
    log_variances: torch.Tensor
    hidden: torch.Tensor
    duration_noise: torch.Tensor  # [2, L], already scaled by noise_w
    generator: torch.Generator
    z_p: torch.Tensor
    ids_done: int = 0
    noise: torch.Tensor | None = None
    durations: list[torch.Tensor] = field(default_factory=list)
    last_input: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.ids

    @property
    def complete(self) -> bool:
        return self.ids_done >= self.length

    @property
    def frames(self) -> int:
        """Frames known so far (the sentence's total once ``complete``)."""
        return self.z_p.shape[-1]

    def extend(self, durations: torch.Tensor) -> None:
        """Append the frames of the next ids, whose durations (long, host) are given."""
        a, b = self.ids_done, self.ids_done + durations.numel()
        if b > self.length:
            raise ValueError("durations for ids to %d of a %d-id sentence" % (b, self.length))
        frames = int(durations.sum())
        dev = self.means.device
        rep = durations.to(dev)
        # output_size: the length is known on the host, so CUDA need not sync for it.
        new = torch.repeat_interleave(self.means[a:b], rep, dim=0, output_size=frames)  # [n, C]
        if self.noise_scale and frames:
            start = self.frames
            self._draw_noise(start + frames)
            log_var = torch.repeat_interleave(self.log_variances[a:b], rep, dim=0, output_size=frames)
            noise = self.noise[start : start + frames].to(dev)
            new = new + noise * torch.exp(log_var) * self.noise_scale
        self.z_p = torch.cat([self.z_p, new.T], dim=1) if self.frames else new.T
        self.durations.append(durations)
        self.ids_done = b

    def _draw_noise(self, frames: int) -> None:
        channels = self.means.shape[1]
        have = 0 if self.noise is None else self.noise.shape[0]
        blocks = [
            torch.randn(NOISE_BLOCK, channels, generator=self.generator) for _ in range(have, frames, NOISE_BLOCK)
        ]
        if blocks:
            self.noise = torch.cat(([self.noise] if self.noise is not None else []) + blocks)
