"""The stochastic duration predictor's inference pass (VITS), without its Python overhead.

``TorchVoice.prior_prefix`` and ``prior_rest`` run the duration predictor backwards
from noise, a sentence's first ids before its first audio. Its math is transformers'
(``VitsStochasticDurationPredictor`` with ``reverse=True``; VITS skips one flow
at inference); two things cost time there for no arithmetic:

- the rational-quadratic spline of each flow checks its discriminant with
  ``torch_compilable_check(cond, f"... {discriminant}")``, and the f-string
  formats the whole tensor on every call: about 430 ``.item()`` calls per flow
  for a 215-id sentence, three flows per sentence. ``spline_reverse`` is the
  same arithmetic, in the same order, with no message built;
- the twenty 1x1 convs (192 channels, a few hundred ids) take torch's slow conv
  path on CPU; here each is one matrix product.

The depthwise dilated convs and layer norms are the model's own modules. The
result equals transformers' up to float rounding (tests assert <= 1e-5).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


class _Pointwise:
    """A 1x1 ``nn.Conv1d`` applied to time-major [B, T, C_in]: ``x @ W^T + b``."""

    def __init__(self, conv: nn.Conv1d) -> None:
        if conv.kernel_size[0] != 1 or conv.groups != 1:
            raise ValueError("not a 1x1 conv: %r" % conv)
        self.weight = conv.weight.detach()[:, :, 0]
        self.bias = None if conv.bias is None else conv.bias.detach()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)


class _Depthwise:
    """A depthwise dilated ``nn.Conv1d`` ("same" padding) on time-major [B, T, C]
    as k shifted multiply-adds: oneDNN's grouped conv took ~0.5 ms for a few
    hundred frames of 192 channels, the taps take a few microseconds each."""

    def __init__(self, conv: nn.Conv1d) -> None:
        channels, per_group, k = conv.weight.shape
        if conv.groups != channels or per_group != 1 or conv.stride[0] != 1:
            raise ValueError("not a depthwise stride-1 conv: %r" % conv)
        self.taps = [conv.weight.detach()[:, 0, j] for j in range(k)]  # each [C]
        self.bias = conv.bias.detach() if conv.bias is not None else None
        self.dilation, self.pad = conv.dilation[0], conv.padding[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        padded = nn.functional.pad(x, (0, 0, self.pad, self.pad))
        d = self.dilation
        # Tap j reads x[t + j * d - pad]; summed in tap order, as the conv's kernel runs.
        out = padded[:, :length] * self.taps[0]
        for j in range(1, len(self.taps)):
            out.addcmul_(padded[:, j * d : j * d + length], self.taps[j])
        return out if self.bias is None else out + self.bias


class _DDS:
    """``VitsDilatedDepthSeparableConv`` time-major: [B, T, C], mask [B, T, 1]."""

    def __init__(self, dds: nn.Module) -> None:
        self.num_layers = dds.num_layers
        self.dilated = [_Depthwise(c) for c in dds.convs_dilated]
        self.pointwise = [_Pointwise(c) for c in dds.convs_pointwise]
        self.norms_1, self.norms_2 = list(dds.norms_1), list(dds.norms_2)

    def __call__(self, x: torch.Tensor, mask: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        if cond is not None:
            x = x + cond
        for i in range(self.num_layers):
            h = self.dilated[i](x * mask)
            h = nn.functional.gelu(self.norms_1[i](h))
            h = nn.functional.gelu(self.norms_2[i](self.pointwise[i](h)))
            x = x + h
        return x * mask


class _ConvFlow:
    def __init__(self, flow: nn.Module) -> None:
        self.half = flow.half_channels
        self.bins = flow.num_bins
        self.tail_bound = flow.tail_bound
        self.scale = math.sqrt(flow.filter_channels)
        self.conv_pre = _Pointwise(flow.conv_pre)
        self.conv_dds = _DDS(flow.conv_dds)
        self.conv_proj = _Pointwise(flow.conv_proj)

    def reverse(self, x: torch.Tensor, mask: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """[B, T, 2 * half] time-major; the spline runs on [B, half, T, bins] as transformers'."""
        first, second = x[..., : self.half], x[..., self.half :]
        h = self.conv_pre(first)
        h = self.conv_dds(h, mask, cond)
        h = self.conv_proj(h) * mask  # [B, T, half * (3 * bins - 1)], channel c * (3 bins - 1) + j
        batch, length, _ = first.shape
        h = h.reshape(batch, length, self.half, -1).transpose(1, 2)  # [B, half, T, 3 bins - 1]
        widths = h[..., : self.bins] / self.scale
        heights = h[..., self.bins : 2 * self.bins] / self.scale
        derivatives = h[..., 2 * self.bins :]
        second = spline_reverse(second.transpose(1, 2), widths, heights, derivatives, tail_bound=self.tail_bound)
        return torch.cat([first, second.transpose(1, 2)], dim=-1) * mask


class _Affine:
    """``VitsElementwiseAffine`` in reverse, time-major."""

    def __init__(self, flow: nn.Module) -> None:
        self.translate = flow.translate.detach()[:, 0]
        self.inv_scale = torch.exp(-flow.log_scale.detach()[:, 0])

    def reverse(self, x: torch.Tensor, mask: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return (x - self.translate) * self.inv_scale * mask


class DurationPredictor:
    """log durations [B, 1, T] from the text encoder's hidden states [B, H, T],
    the input mask [B, 1, T] and the duration noise [B, 2, T] (channel-first, as
    transformers'); computed time-major inside (no transposes around the layer
    norms)."""

    def __init__(self, dp: nn.Module) -> None:
        self.conv_pre = _Pointwise(dp.conv_pre)
        self.conv_dds = _DDS(dp.conv_dds)
        self.conv_proj = _Pointwise(dp.conv_proj)
        flows = list(reversed(dp.flows))
        flows = flows[:-2] + [flows[-1]]  # VITS skips one flow at inference
        self.flows = [_ConvFlow(f) if hasattr(f, "conv_dds") else _Affine(f) for f in flows]

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor, mask: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        mask = mask.transpose(1, 2)  # [B, T, 1]
        x = self.conv_pre(hidden.transpose(1, 2))
        x = self.conv_dds(x, mask)
        x = self.conv_proj(x) * mask
        latents = noise.transpose(1, 2)
        for flow in self.flows:
            latents = flow.reverse(torch.flip(latents, [-1]), mask, x)
        return latents[..., :1].transpose(1, 2)


def spline_reverse(
    inputs: torch.Tensor,
    unnormalized_widths: torch.Tensor,
    unnormalized_heights: torch.Tensor,
    unnormalized_derivatives: torch.Tensor,
    tail_bound: float = 5.0,
    min_bin_width: float = 1e-3,
    min_bin_height: float = 1e-3,
    min_derivative: float = 1e-3,
) -> torch.Tensor:
    """The inverse of VITS's unconstrained rational-quadratic spline (identity
    outside [-tail_bound, tail_bound]); transformers'
    ``_unconstrained_rational_quadratic_spline(reverse=True)`` without the
    log-determinant, which inference does not use."""
    inside = (inputs >= -tail_bound) & (inputs <= tail_bound)
    outputs = torch.zeros_like(inputs)
    outside = ~inside
    outputs[outside] = inputs[outside]
    constant = float(np.log(np.exp(1 - min_derivative) - 1))
    unnormalized_derivatives = nn.functional.pad(unnormalized_derivatives, pad=(1, 1))
    unnormalized_derivatives[..., 0] = constant
    unnormalized_derivatives[..., -1] = constant
    outputs[inside] = _rq_reverse(
        inputs[inside],
        unnormalized_widths[inside, :],
        unnormalized_heights[inside, :],
        unnormalized_derivatives[inside, :],
        tail_bound,
        min_bin_width,
        min_bin_height,
        min_derivative,
    )
    return outputs


def _cumulative(
    unnormalized: torch.Tensor, minimum: float, lower: float, upper: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bin edges [..., n + 1] and sizes [..., n] from unnormalized bin sizes."""
    bins = unnormalized.shape[-1]
    sizes = nn.functional.softmax(unnormalized, dim=-1)
    sizes = minimum + (1 - minimum * bins) * sizes
    cum = torch.cumsum(sizes, dim=-1)
    cum = nn.functional.pad(cum, pad=(1, 0), mode="constant", value=0.0)
    cum = (upper - lower) * cum + lower
    cum[..., 0] = lower
    cum[..., -1] = upper
    return cum, cum[..., 1:] - cum[..., :-1]


def _rq_reverse(
    inputs: torch.Tensor,
    unnormalized_widths: torch.Tensor,
    unnormalized_heights: torch.Tensor,
    unnormalized_derivatives: torch.Tensor,
    tail_bound: float,
    min_bin_width: float,
    min_bin_height: float,
    min_derivative: float,
) -> torch.Tensor:
    lower, upper = -tail_bound, tail_bound
    cumwidths, widths = _cumulative(unnormalized_widths, min_bin_width, lower, upper)
    derivatives = min_derivative + nn.functional.softplus(unnormalized_derivatives)
    cumheights, heights = _cumulative(unnormalized_heights, min_bin_height, lower, upper)

    cumheights[..., -1] += 1e-6  # the bin search's upper edge, as transformers has it
    bin_idx = (torch.sum(inputs[..., None] >= cumheights, dim=-1) - 1)[..., None]
    input_cumwidths = cumwidths.gather(-1, bin_idx)[..., 0]
    input_bin_widths = widths.gather(-1, bin_idx)[..., 0]
    input_cumheights = cumheights.gather(-1, bin_idx)[..., 0]
    delta = heights / widths
    input_delta = delta.gather(-1, bin_idx)[..., 0]
    input_derivatives = derivatives.gather(-1, bin_idx)[..., 0]
    input_derivatives_plus_one = derivatives[..., 1:].gather(-1, bin_idx)[..., 0]
    input_heights = heights.gather(-1, bin_idx)[..., 0]

    intermediate1 = input_derivatives + input_derivatives_plus_one - 2 * input_delta
    intermediate2 = inputs - input_cumheights
    intermediate3 = intermediate2 * intermediate1
    a = input_heights * (input_delta - input_derivatives) + intermediate3
    b = input_heights * input_derivatives - intermediate3
    c = -input_delta * intermediate2
    discriminant = b.pow(2) - 4 * a * c
    root = (2 * c) / (-b - torch.sqrt(discriminant))
    return root * input_bin_widths + input_cumwidths
