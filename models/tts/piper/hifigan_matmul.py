"""``hifigan._forward`` time-major, with the decoder's convs as matrix products.

The same masked, cropped decode as ``hifigan.decode_cores`` (see there for the
masking and cropping rules), over [B, T, C] activations: conv_pre, every
resblock conv and conv_post are ``conv_matmul.ConvAsMatmul`` products, and the
three transposed convs (upsampling) are ``UpsampleAsMatmul`` products (torch
took its slow im2col/col2im path, ``slow_conv_transpose2d``, for them: ~3 ms of a
first window on one thread). The products are the same; only the order of the sums differs (float
rounding; tests assert <= 1e-5 against the module path). Resblock type 2 only
(Piper's medium and low voices); ``DecoderMatmul.supports`` says whether a
decoder qualifies.

Only for short windows (``MAX_FRAMES``): the matrix form copies each conv's
input k times (im2col), which fits the caches for a first window but not for a
long one. Measured on 2 shared CPU cores, one thread, joe-medium: a 12-frame
window (23 decoded frames) took 72 ms against 85 ms for the module decode, but
24 frames 143 against 132, 48 frames 285 against 232 and 96 frames 495 against
342 (the last level, 32 channels at the audio rate, spills).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from models.tts.piper.conv_matmul import ConvAsMatmul, product
from models.tts.piper.hifigan import LEAKY_SLOPE, DecoderGeometry, ResBlock2, level_spans


# Longest window (decoded frames, context included) decoded this way; longer
# windows take the module decode (see above).
MAX_FRAMES = 32


class DecoderMatmul:
    """A VITS HiFi-GAN decoder with ``ResBlock2`` blocks, prepared for time-major decodes."""

    def __init__(self, decoder: nn.Module, geometry: DecoderGeometry, products: torch.dtype = torch.float32) -> None:
        """``products``: the number format of every conv's product (``conv_matmul``)."""
        if not self.supports(decoder):
            raise ValueError("DecoderMatmul needs resblock type 2 and no speaker conditioning")
        self.decoder, self.geometry = decoder, geometry
        self.num_kernels = decoder.num_kernels
        self.slope = decoder.config.leaky_relu_slope
        self.conv_pre = ConvAsMatmul.same(decoder.conv_pre, products)
        self.blocks = [[ConvAsMatmul.same(c, products) for c in block.convs] for block in decoder.resblocks]
        self.conv_post = ConvAsMatmul.same(decoder.conv_post, products)
        self.upsamplers = [UpsampleAsMatmul(up, products) for up in decoder.upsampler]

    @staticmethod
    def supports(decoder: nn.Module) -> bool:
        return (
            all(isinstance(b, ResBlock2) for b in decoder.resblocks)
            and getattr(decoder, "cond", None) is None
            and all(UpsampleAsMatmul.supports(up) for up in decoder.upsampler)
        )

    def decode_cores(
        self, latents: torch.Tensor, lengths: Sequence[int], cores: Sequence[tuple[int, int]]
    ) -> list[torch.Tensor]:
        """``hifigan.decode_cores(decoder, geometry, latents, lengths, cores)``."""
        crops = [level_spans(self.geometry, a, b - 1)[0] for a, b in cores]
        batch, _, frames = latents.shape
        lengths = list(lengths)
        offsets = [0] * batch
        x = latents.transpose(1, 2)  # [B, T, C]
        mask = _mask(lengths, frames, x)
        if mask is not None:
            x = x * mask
        x = self.conv_pre(x)
        if mask is not None:
            x = x * mask
        for level, up in enumerate(self.upsamplers):
            x = up(nn.functional.leaky_relu(x, self.slope))
            stride = up.stride
            offsets = [o * stride for o in offsets]
            lengths = [n * stride for n in lengths]
            x, offsets, lengths = _crop(x, offsets, lengths, [c[level] for c in crops])
            mask = _mask(lengths, x.shape[1], x)
            if mask is not None:
                x = x * mask
            acc = None
            for convs in self.blocks[level * self.num_kernels : (level + 1) * self.num_kernels]:
                y = x
                for conv in convs:  # ResBlock2: y = conv(lrelu(y)) (masked) + y
                    h = conv(nn.functional.leaky_relu(y, LEAKY_SLOPE))
                    y = (h if mask is None else h * mask) + y
                acc = y if acc is None else acc + y
            x = acc / self.num_kernels
        # VITS uses torch's default slope (0.01) before conv_post, not LEAKY_SLOPE.
        x = torch.tanh(self.conv_post(nn.functional.leaky_relu(x)))[:, :, 0]
        return [x[i, a - offsets[i] : b - offsets[i]] for i, (a, b) in enumerate(cores)]


class UpsampleAsMatmul:
    """A ``nn.ConvTranspose1d`` whose kernel is a whole number m of strides, on
    time-major [B, T, C_in] -> [B, T_out, C_out], as one product and m shifted adds.

    Input frame t adds ``x[t] @ W[:, :, j]`` to output sample ``t * s + j - padding``
    for each tap j < k = m * s. One product gives every frame's k * C_out
    contributions at once; tap block q (taps q*s .. q*s + s - 1) of frame t lands
    on stride block t + q of the unpadded output::

        stride blocks   0      1      2      3    ...   T + m - 2
        frame 0       [q=0]  [q=1]
        frame 1              [q=0]  [q=1]
        frame 2                     [q=0]  [q=1]

    then ``padding`` samples are cut from each end, as the module does.
    """

    def __init__(self, up: nn.ConvTranspose1d, products: torch.dtype = torch.float32) -> None:
        if not self.supports(up):
            raise ValueError("UpsampleAsMatmul needs kernel = m * stride, no groups/dilation/output padding: %r" % up)
        cin, cout, k = up.weight.shape
        self.stride, self.padding, self.blocks, self.channels = up.stride[0], up.padding[0], k // up.stride[0], cout
        # weight[i, o, j] -> column j * C_out + o.
        self.weight = up.weight.detach().permute(0, 2, 1).reshape(cin, k * cout).contiguous().to(products)
        self.bias = None if up.bias is None else up.bias.detach()

    @staticmethod
    def supports(up: nn.Module) -> bool:
        return (
            isinstance(up, nn.ConvTranspose1d)
            and up.groups == 1
            and up.dilation[0] == 1
            and up.output_padding[0] == 0
            and up.kernel_size[0] % up.stride[0] == 0
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        s, m, cout = self.stride, self.blocks, self.channels
        taps = product(x, self.weight).view(batch, length, m, s * cout)
        full = taps.new_zeros(batch, length + m - 1, s * cout)
        for q in range(m):
            full[:, q : q + length] += taps[:, :, q]
        out_len = (length - 1) * s - 2 * self.padding + m * s
        out = full.view(batch, (length + m - 1) * s, cout)[:, self.padding : self.padding + out_len]
        return out if self.bias is None else out + self.bias


def _mask(lengths: Sequence[int], size: int, like: torch.Tensor) -> torch.Tensor | None:
    """[B, size, 1] ones over each item's valid prefix; None when all are full."""
    if all(n == size for n in lengths):
        return None
    positions = torch.arange(size, device=like.device)
    return (positions[None, :] < torch.as_tensor(list(lengths), device=like.device)[:, None])[..., None].to(like.dtype)


def _crop(
    x: torch.Tensor, offsets: list[int], lengths: list[int], keep: Sequence[tuple[int, int]]
) -> tuple[torch.Tensor, list[int], list[int]]:
    """``hifigan._crop`` on the time axis of [B, T, C]."""
    starts, stops = [], []
    for b, (lo, hi) in enumerate(keep):
        starts.append(max(lo, offsets[b]) - offsets[b])
        stops.append(min(hi + 1, offsets[b] + lengths[b]) - offsets[b])
    if x.shape[0] == 1:
        out = x[:, starts[0] : stops[0]]
    else:
        out = x.new_zeros(x.shape[0], max(e - s for s, e in zip(starts, stops)), x.shape[2])
        for b, (s, e) in enumerate(zip(starts, stops)):
            out[b, : e - s] = x[b, s:e]
    return out, [o + s for o, s in zip(offsets, starts)], [e - s for s, e in zip(starts, stops)]
