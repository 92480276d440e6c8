"""The VITS prior flow in reverse (z_p -> z), time-major, cropped to what is kept.

``transformers.VitsResidualCouplingBlock`` in reverse: for each of its couplings
(last first), flip the channels, then ``second -= WaveNet(first)`` (joe's
couplings are mean-only: ``log_stddev`` is zero). Each WaveNet is 4 "same"
convs of kernel 5, so a coupling's output frame reads its input 8 frames to each
side (``per_coupling``), 32 through all four (``voice.flow_receptive_field``).

A streamed sentence runs the flow over a segment of the prior that carries that
context around the frames it keeps (``windows.flow_span``). After each
coupling, fewer frames are still needed: the kept ones plus the reach of the
couplings left. So the segment is cropped between couplings::

    segment       [lo ............................................ hi)
    coupling 1    [=============================================]   reads all
    coupling 2        [=====================================]       -8 each side
    coupling 3            [=============================]           -16
    coupling 4                [=====================]               -24
    kept                          [=============]                   -32

A crop never reaches a sentence edge that the segment has (the zero padding
there is the sentence's own), and every kept frame still sees all of its inputs,
so the kept frames equal the uncropped flow's up to float rounding. The convs
are ``conv_matmul.ConvAsMatmul`` products over [B, T, C].
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from models.tts.piper.conv_matmul import ConvAsMatmul


class _Coupling:
    def __init__(self, layer: nn.Module, products: torch.dtype) -> None:
        self.half = layer.half_channels
        self.conv_pre = ConvAsMatmul.same(layer.conv_pre, products)
        self.conv_post = ConvAsMatmul.same(layer.conv_post, products)
        net = layer.wavenet
        if getattr(net, "cond_layer", None) is not None:
            raise ValueError("speaker-conditioned flows are not supported")
        self.hidden = net.hidden_size
        self.in_layers = [ConvAsMatmul.same(c, products) for c in net.in_layers]
        self.res_skip = [ConvAsMatmul.same(c, products) for c in net.res_skip_layers]
        self.reach = sum((c.kernel - 1) * c.dilation // 2 for c in self.in_layers)

    def reverse(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One coupling backwards on [B, T, C] (channels already flipped)."""
        first, second = x[..., : self.half], x[..., self.half :]
        h = self.conv_pre(first) * mask
        out = torch.zeros_like(h)
        last = len(self.in_layers) - 1
        for i, (conv, res_skip) in enumerate(zip(self.in_layers, self.res_skip)):
            a = conv(h)
            acts = torch.tanh(a[..., : self.hidden]) * torch.sigmoid(a[..., self.hidden :])
            rs = res_skip(acts)
            if i < last:
                h = (h + rs[..., : self.hidden]) * mask
                out = out + rs[..., self.hidden :]
            else:
                out = out + rs
        mean = self.conv_post(out * mask) * mask
        return torch.cat([first, (second - mean) * mask], dim=-1)


class ReverseFlow:
    """The reverse prior flow over segments of any lengths in one padded batch."""

    def __init__(self, block: nn.Module, products: torch.dtype = torch.float32) -> None:
        """``products``: the couplings' number format (``conv_matmul``)."""
        self.couplings = [_Coupling(layer, products) for layer in reversed(block.flows)]
        self.per_coupling = max(c.reach for c in self.couplings)

    @torch.inference_mode()
    def __call__(
        self, items: Sequence[torch.Tensor], keep: Sequence[tuple[int, int]] | None = None
    ) -> list[torch.Tensor]:
        """z [C, b - a] for each segment [C, L_i]: its frames ``keep[i] = (a, b)``
        (all of them when None). A segment's ends are taken as the sentence's:
        frames within the flow's reach of a segment end that is not the
        sentence's are wrong, so keep only frames that have that context."""
        lengths = [x.shape[-1] for x in items]
        keep = [(0, n) for n in lengths] if keep is None else list(keep)
        for (a, b), n in zip(keep, lengths):
            if not 0 <= a < b <= n:
                raise ValueError("keep (%d, %d) outside a %d-frame segment" % (a, b, n))
        longest, dev = max(lengths), items[0].device
        x = torch.zeros(len(items), longest, items[0].shape[0], device=dev)
        for i, item in enumerate(items):
            x[i, : lengths[i]] = item.T
        mask = (torch.arange(longest, device=dev)[None, :] < torch.tensor(lengths, device=dev)[:, None])
        mask = mask[..., None].to(x.dtype)
        offset = 0  # frame of the segments that row 0 of x is now
        for j, coupling in enumerate(self.couplings):
            x = coupling.reverse(torch.flip(x, [-1]), mask)
            # Still needed: the kept frames plus the reach of the couplings left.
            reach = self.per_coupling * (len(self.couplings) - 1 - j)
            lo = max(offset, min(a for a, _ in keep) - reach)
            hi = min(offset + x.shape[1], max(b for _, b in keep) + reach)
            x, mask = x[:, lo - offset : hi - offset], mask[:, lo - offset : hi - offset]
            offset = lo
        return [x[i, a - offset : b - offset].T for i, (a, b) in enumerate(keep)]
