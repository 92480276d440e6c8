"""The HiFi-GAN decoder of a Piper voice: the module VitsModel lacks, a batched
decode that pads sessions' windows to one length, and its receptive field.

Piper's low and medium voices use VITS "resblock 2" (one dilated conv per
dilation, no second conv), which ``transformers.VitsHifiGan`` does not have;
``ResBlock2`` is that module with the state-dict names Piper's export uses
(``resblocks.{i}.convs.{j}``), so converted weights load by name.

``decode_padded`` runs windows of different lengths in one forward. Zero-padding
the *input* is not enough: every conv has a bias, so the padded tail turns
non-zero after the first layer and leaks back into the last real samples. The
decode therefore zeroes everything past each item's length after every conv.
Each conv then sees exactly the zeros its own padding would have supplied to an
unpadded input, and a padded item's output equals decoding it alone (up to the
float rounding of a different batch shape).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

LEAKY_SLOPE = 0.1  # VITS's LRELU_SLOPE inside the generator


class ResBlock2(nn.Module):
    """VITS resblock type 2: ``x = conv_d(lrelu(x)) + x`` for each dilation d."""

    def __init__(self, channels: int, kernel_size: int, dilations: Sequence[int]) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.dilations = tuple(dilations)
        self.convs = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, 1, dilation=d, padding=(kernel_size * d - d) // 2)
            for d in dilations
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for conv in self.convs:
            y = conv(nn.functional.leaky_relu(x, LEAKY_SLOPE))
            x = (y if mask is None else y * mask) + x
        return x


def _resblock1_forward(block: nn.Module, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """transformers' HifiGanResidualBlock (VITS resblock 1) with masking."""
    slope = block.leaky_relu_slope
    for conv1, conv2 in zip(block.convs1, block.convs2):
        y = conv1(nn.functional.leaky_relu(x, slope))
        if mask is not None:
            y = y * mask
        y = conv2(nn.functional.leaky_relu(y, slope))
        if mask is not None:
            y = y * mask
        x = y + x
    return x


def _resblock_forward(block: nn.Module, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if isinstance(block, ResBlock2):
        return block(x, mask)
    return _resblock1_forward(block, x, mask)


def decode_padded(decoder: nn.Module, latents: torch.Tensor, lengths: Sequence[int] | None = None) -> torch.Tensor:
    """HiFi-GAN forward of ``latents`` [B, C, T] whose item b is valid for its
    first ``lengths[b]`` frames (all T when None). Returns [B, T * hop] audio;
    item b's samples past ``lengths[b] * hop`` are meaningless."""
    x, _, _ = _forward(decoder, latents, lengths, None)
    return x


def decode_cores(
    decoder: nn.Module,
    geometry: "DecoderGeometry",
    latents: torch.Tensor,
    lengths: Sequence[int],
    cores: Sequence[tuple[int, int]],
) -> list[torch.Tensor]:
    """Like ``decode_padded``, but returns only each item's output samples
    ``cores[b] = (a, b)`` (relative to its first frame), and after every
    upsampling drops the activations those samples cannot read.

    A window carries 11 frames of context each side because conv_pre and the
    first level need them, but the last level (32 channels at the audio rate,
    the most expensive) reads only ~0.2 frames past the core: cropping there
    saves most of the context's cost. The crop bounds come from the same
    backward walk as ``receptive_field`` (``level_spans``), so the result
    equals the uncropped decode up to float rounding.
    """
    crops = [level_spans(geometry, a, b - 1)[0] for a, b in cores]
    x, offsets, _ = _forward(decoder, latents, lengths, crops)
    return [x[i, a - offsets[i] : b - offsets[i]] for i, (a, b) in enumerate(cores)]


def _forward(
    decoder: nn.Module,
    latents: torch.Tensor,
    lengths: Sequence[int] | None,
    crops: Sequence[Sequence[tuple[int, int]]] | None,
) -> tuple[torch.Tensor, list[int], list[int]]:
    """The masked (and optionally cropped) decoder forward.

    Returns the audio [B, S], each item's offset (the sample of its window that
    its row starts at) and its valid length. ``crops[b][level]`` is the
    inclusive sample range item b keeps after upsampling ``level``.
    """
    batch, _, frames = latents.shape
    lengths = [frames] * batch if lengths is None else list(lengths)
    offsets = [0] * batch
    mask = _mask(lengths, frames, latents)
    x = latents if mask is None else latents * mask
    x = decoder.conv_pre(x)
    if mask is not None:
        x = x * mask
    for level, up in enumerate(decoder.upsampler):
        x = up(nn.functional.leaky_relu(x, decoder.config.leaky_relu_slope))
        stride = up.stride[0]
        offsets = [o * stride for o in offsets]
        lengths = [n * stride for n in lengths]
        if crops is not None:
            x, offsets, lengths = _crop(x, offsets, lengths, [c[level] for c in crops])
        mask = _mask(lengths, x.shape[-1], x)
        if mask is not None:
            x = x * mask
        blocks = decoder.resblocks[level * decoder.num_kernels : (level + 1) * decoder.num_kernels]
        acc = _resblock_forward(blocks[0], x, mask)
        for block in blocks[1:]:
            acc = acc + _resblock_forward(block, x, mask)
        x = acc / decoder.num_kernels
    # VITS uses torch's default slope (0.01) before conv_post, not LEAKY_SLOPE.
    x = decoder.conv_post(nn.functional.leaky_relu(x))
    return torch.tanh(x)[:, 0], offsets, lengths


def _mask(lengths: Sequence[int], size: int, like: torch.Tensor) -> torch.Tensor | None:
    """[B, 1, size] ones over each item's valid prefix; None when all are full."""
    if all(n == size for n in lengths):
        return None
    length_t = torch.as_tensor(list(lengths), device=like.device)
    positions = torch.arange(size, device=like.device)
    return (positions[None, :] < length_t[:, None]).unsqueeze(1).to(like.dtype)


def _crop(
    x: torch.Tensor, offsets: list[int], lengths: list[int], keep: Sequence[tuple[int, int]]
) -> tuple[torch.Tensor, list[int], list[int]]:
    """Keep item b's samples keep[b] (inclusive, window coordinates), clipped to
    what it has; the window's own edges stay where they are, so a sentence edge
    keeps its zero-padding meaning."""
    starts, stops = [], []
    for b, (lo, hi) in enumerate(keep):
        starts.append(max(lo, offsets[b]) - offsets[b])
        stops.append(min(hi + 1, offsets[b] + lengths[b]) - offsets[b])
    if x.shape[0] == 1:
        out = x[:, :, starts[0] : stops[0]]
    else:
        out = x.new_zeros(x.shape[0], x.shape[1], max(e - s for s, e in zip(starts, stops)))
        for b, (s, e) in enumerate(zip(starts, stops)):
            out[b, :, : e - s] = x[b, :, s:e]
    return out, [o + s for o, s in zip(offsets, starts)], [e - s for s, e in zip(starts, stops)]


# --- receptive field -----------------------------------------------------------------


@dataclass(frozen=True)
class ConvSpec:
    """A stride-1 conv: output o reads inputs o - padding + j*dilation, j < kernel."""

    kernel: int
    dilation: int = 1
    padding: int | None = None  # None: "same" padding (kernel - 1) * dilation // 2

    def reads(self, lo: int, hi: int) -> tuple[int, int]:
        pad = (self.kernel - 1) * self.dilation // 2 if self.padding is None else self.padding
        return lo - pad, hi - pad + (self.kernel - 1) * self.dilation


@dataclass(frozen=True)
class UpsampleSpec:
    """A ConvTranspose1d: output o reads input i when 0 <= o + padding - i*stride < kernel."""

    stride: int
    kernel: int
    padding: int

    def reads(self, lo: int, hi: int) -> tuple[int, int]:
        return (lo + self.padding - self.kernel) // self.stride + 1, (hi + self.padding) // self.stride


@dataclass(frozen=True)
class DecoderGeometry:
    conv_pre: ConvSpec
    upsamples: tuple[UpsampleSpec, ...]
    # Per upsampling level: the parallel resblocks, each a chain of convs.
    resblocks: tuple[tuple[tuple[ConvSpec, ...], ...], ...]
    conv_post: ConvSpec

    @property
    def hop(self) -> int:
        out = 1
        for up in self.upsamples:
            out *= up.stride
        return out


def level_spans(geometry: DecoderGeometry, lo: int, hi: int) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """What the output samples [lo, hi] (inclusive) read, walking back through
    the decoder: per upsampling level, the samples (at that level's rate, after
    its upsampler) the rest of the network reads, and the latent frames.

    ::

        frames  ..... [f_lo ........................... f_hi] .....   conv_pre reads
        level 0   ....... [lo0 ..................... hi0] .......      ups.0 -> resblocks.0
        level 1         ........ [lo1 ............ hi1] ........       ups.1 -> resblocks.1
        level 2                ....... [lo2 .... hi2] .......          ups.2 -> resblocks.2
        output                          [lo ... hi]                    conv_post
    """
    spans = [(0, 0)] * len(geometry.upsamples)
    lo, hi = geometry.conv_post.reads(lo, hi)
    for level in reversed(range(len(geometry.upsamples))):
        widest_lo, widest_hi = lo, hi  # the residual path reads the same samples
        for chain in geometry.resblocks[level]:
            c_lo, c_hi = lo, hi
            for conv in reversed(chain):
                c_lo, c_hi = conv.reads(c_lo, c_hi)
            widest_lo, widest_hi = min(widest_lo, c_lo), max(widest_hi, c_hi)
        spans[level] = (widest_lo, widest_hi)
        lo, hi = geometry.upsamples[level].reads(widest_lo, widest_hi)
    return spans, geometry.conv_pre.reads(lo, hi)


def receptive_field(geometry: DecoderGeometry) -> tuple[int, int]:
    """Frames of latent context (left, right) that one output frame's samples read.

    The walk of ``level_spans`` from the samples of frame 0, [0, hop - 1], ends
    at latent frames [-left, right]. Windows decoded with at least this much
    context on each side (or the sentence edge, where the whole decode pads
    with zeros too) reproduce the whole-sentence decode except for float
    rounding. Strides are whole numbers of samples per frame, so the answer is
    the same for every frame.
    """
    _, (lo, hi) = level_spans(geometry, 0, geometry.hop - 1)
    return -lo, hi


def decoder_geometry(decoder: nn.Module) -> DecoderGeometry:
    """Read the geometry off a built decoder (VitsHifiGan with either resblock)."""

    def conv(c: nn.Conv1d) -> ConvSpec:
        return ConvSpec(c.kernel_size[0], c.dilation[0], c.padding[0])

    levels = []
    for i in range(len(decoder.upsampler)):
        chains = []
        for block in decoder.resblocks[i * decoder.num_kernels : (i + 1) * decoder.num_kernels]:
            if isinstance(block, ResBlock2):
                chains.append(tuple(conv(c) for c in block.convs))
            else:
                chains.append(tuple(conv(c) for pair in zip(block.convs1, block.convs2) for c in pair))
        levels.append(tuple(chains))
    ups = tuple(UpsampleSpec(u.stride[0], u.kernel_size[0], u.padding[0]) for u in decoder.upsampler)
    return DecoderGeometry(conv(decoder.conv_pre), ups, tuple(levels), conv(decoder.conv_post))
