"""A stride-1 ``nn.Conv1d`` as one matrix product over time-major input.

A k-tap conv over [T, C_in] is [T, k * C_in] (the k input rows each output row
reads, side by side) @ [k * C_in, C_out]. For the Piper voice's shapes (a few
hundred frames, 96-768 channels) that ran 1.2-1.8x faster than torch's oneDNN
conv on 2 CPU cores, and time-major activations need no transposes between the
convs and the layer norms or linears around them. The products are the same;
only the order of the sums differs (float rounding).

``products`` is the number format of the product itself (``models.cpu_format``):
with bfloat16 the weight is kept in bf16, the input is rounded to bf16 for the
product (accumulated in float32 by oneDNN) and the result comes back as float32,
so everything around the products (norms, activations, masks) stays float32.
"""

from __future__ import annotations

import torch
from torch import nn


class ConvAsMatmul:
    """``conv`` applied to [B, T, C_in] with ``pad_left``/``pad_right`` zero
    frames (the conv's own ``padding`` is ignored: pass it here)."""

    def __init__(self, conv: nn.Conv1d, pad_left: int, pad_right: int, products: torch.dtype = torch.float32) -> None:
        if conv.groups != 1 or conv.stride[0] != 1:
            raise ValueError("only plain stride-1 convs: %r" % conv)
        out, cin, k = conv.weight.shape
        self.kernel, self.dilation, self.channels = k, conv.dilation[0], cin
        self.pad = (pad_left, pad_right)
        # weight[o, i, j] multiplies x[t + j * d, i]: row j * C_in + i of the matrix.
        self.weight = conv.weight.detach().permute(2, 1, 0).reshape(k * cin, out).contiguous().to(products)
        self.bias = None if conv.bias is None else conv.bias.detach()

    @classmethod
    def same(cls, conv: nn.Conv1d, products: torch.dtype = torch.float32) -> "ConvAsMatmul":
        """With the conv's own symmetric padding."""
        return cls(conv, conv.padding[0], conv.padding[0], products)

    def __call__(self, x: torch.Tensor, pad: tuple[int, int] | None = None) -> torch.Tensor:
        """``pad``: zero frames (left, right) instead of the construction's, for a
        slice of a longer input that has real frames beyond one of its ends."""
        batch, length, cin = x.shape
        if self.kernel > 1:
            x = nn.functional.pad(x, (0, 0, *(self.pad if pad is None else pad))).contiguous()
            rows = x.shape[1]
            length = rows - (self.kernel - 1) * self.dilation
            # Overlapping rows: row t reads x[t], x[t + d], ... (a view; reshape copies).
            x = x.as_strided((batch, length, self.kernel, cin), (rows * cin, cin, self.dilation * cin, 1))
            x = x.reshape(batch, length, self.kernel * cin)
        out = product(x, self.weight)
        return out if self.bias is None else out + self.bias


def product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight`` in the weight's number format, the result in x's."""
    if weight.dtype == x.dtype:
        return torch.matmul(x, weight)
    return torch.matmul(x.to(weight.dtype), weight).to(x.dtype)
