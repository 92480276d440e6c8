"""FP8 (e4m3) linear layers with per-row scales: the ``fp8=`` shortcut.

A weight ``[out, in]`` is stored as e4m3 with one float32 scale per output row; an
activation ``[tokens, in]`` is quantised the same way per token at every call (dynamic,
torchao's "PerRow" float8 recipe). Both scales are a row's absolute maximum over
e4m3's largest finite value (448), so each row uses the whole e4m3 range::

    scale[r] = max(amax(|x[r, :]|) / 448, FLOAT32_TINY)    # a zero row: scale tiny, q = 0
    q[r, :]  = e4m3(clamp(x[r, :] / scale[r], -448, 448))
    x[r, :] ~= float(q[r, :]) * scale[r]                     # within 2^-4 relative (3 mantissa
                                                             # bits), or scale * 2^-10 absolute
                                                             # below e4m3's normal range
    y = (q_x * s_x) @ (q_w * s_w).T + b = s_x * (q_x @ q_w.T) * s_w.T + b

Two ways to compute ``y``, the same maths:

* ``scaled_mm``: ``torch._scaled_mm`` on FP8 tensor cores (Hopper and later: rowwise
  scales need SM 9.0), bf16 out, the bias added after;
* ``emulated``: dequantise both to the compute dtype and ``F.linear`` (a CPU, an older
  GPU, a layer whose widths are not multiples of 16): what the tests check against
  the reference maths, and the bench against ``scaled_mm`` on the GPU.

Which layers (``quantize_linears``): the transformer blocks' ``ffn`` (both layers),
``attn`` (fused self-attention q/k/v and its output) and ``cross`` (cross-attention
q, k, v, output). Norms, the patch / text / time embeddings, the camera modules and the
head stay in the model's dtype: they are small, and the camera and time paths steer
every token (reported elsewhere: FP8 on Wan's attention and FFN together collapsed
long videos, FFN alone held; anchors/dreamzero_taehv_fp8.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)       # 448
FLOAT32_TINY = float(torch.finfo(torch.float32).tiny)
# torch._scaled_mm wants K and N multiples of 16, and M too in some versions (rows are padded).
MM_ALIGN = 16

# group -> the linear layers of one transformer block it covers (names inside the block).
GROUP_LAYERS: dict[str, tuple[str, ...]] = {
    "ffn": ("ffn.0", "ffn.2"),
    "attn": ("self_attn.qkv", "self_attn.o"),
    "cross": ("cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o"),
}


def row_scales(x: torch.Tensor) -> torch.Tensor:
    """Per-row float32 scales ``[..., 1]`` of ``x [..., n]`` (see the module docstring)."""
    amax = x.detach().abs().amax(-1, keepdim=True).float()
    return torch.clamp(amax / E4M3_MAX, min=FLOAT32_TINY)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., n]`` -> (e4m3 ``[..., n]``, float32 scales ``[..., 1]``)."""
    scale = row_scales(x)
    q = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale).to(dtype)


def scaled_mm_supported(device: torch.device, in_features: int, out_features: int,
                        dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether ``torch._scaled_mm`` with rowwise scales (bf16 out) runs this layer here."""
    if device.type != "cuda" or not hasattr(torch, "_scaled_mm") or dtype != torch.bfloat16:
        return False
    if in_features % MM_ALIGN or out_features % MM_ALIGN:
        return False
    return torch.cuda.get_device_capability(device) >= (9, 0)


class FP8Linear(nn.Module):
    """A linear layer with an e4m3 weight and per-row scales; activations quantised per token."""

    def __init__(self, weight_q: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                 dtype: torch.dtype, kernel: str) -> None:
        super().__init__()
        if kernel not in ("scaled_mm", "emulated"):
            raise ValueError(f"kernel must be scaled_mm or emulated, got {kernel!r}")
        self.out_features, self.in_features = weight_q.shape
        self.dtype = dtype
        self.kernel = kernel
        self.register_buffer("weight_q", weight_q)
        self.register_buffer("weight_scale", weight_scale)     # [out, 1] float32
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, kernel: str | None = None, name: str = "linear") -> "FP8Linear":
        w = linear.weight.detach()
        if not torch.isfinite(w).all():
            raise ValueError(f"{name}: weight has non-finite values; not quantised")
        if kernel is None:
            kernel = ("scaled_mm" if scaled_mm_supported(w.device, w.shape[1], w.shape[0], w.dtype)
                      else "emulated")
        q, s = quantize_rows(w)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(q, s, bias, w.dtype, kernel)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self.kernel == "scaled_mm":
            y = self._scaled_mm(x2)
        else:
            xq, xs = quantize_rows(x2)
            w = dequantize_rows(self.weight_q, self.weight_scale, self.dtype)
            y = F.linear(dequantize_rows(xq, xs, self.dtype), w)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def _scaled_mm(self, x: torch.Tensor) -> torch.Tensor:
        m = x.shape[0]
        pad = -m % MM_ALIGN
        if pad:   # zero rows quantise to zeros (scale tiny) and are dropped below
            x = F.pad(x, (0, 0, 0, pad))
        xq, xs = quantize_rows(x)
        # weight_q [out, in] row-major: its .t() is the column-major [in, out] _scaled_mm wants;
        # the scales are [M, 1] and [1, out], float32 (rowwise scaling, bf16 out).
        y = torch._scaled_mm(xq, self.weight_q.t(), scale_a=xs, scale_b=self.weight_scale.reshape(1, -1),
                             out_dtype=self.dtype)
        return y[:m] if pad else y


def group_layer_names(model: nn.Module, groups: tuple[str, ...]) -> list[str]:
    """Module names of the linear layers ``groups`` cover, block by block."""
    unknown = [g for g in groups if g not in GROUP_LAYERS]
    if unknown:
        raise ValueError(f"unknown fp8 group(s) {unknown}; known: {', '.join(GROUP_LAYERS)}")
    names = []
    for i in range(len(model.blocks)):
        for g in groups:
            names.extend(f"blocks.{i}.{leaf}" for leaf in GROUP_LAYERS[g])
    return names


@torch.no_grad()
def quantize_linears(model: nn.Module, groups: tuple[str, ...], kernel: str | None = None,
                     park: torch.device | str | None = None) -> dict[str, nn.Linear]:
    """Replace the ``groups``' linear layers of ``model`` by ``FP8Linear`` in place.

    Returns the replaced layers by name: drop them to free their memory, or hand them to
    ``restore_linears`` to undo (the bench compares sets on one model; ``park="cpu"`` moves
    each replaced layer there as it goes, so bf16 and FP8 weights never share the card).
    Quantise last: a later ``model.to(dtype)`` would cast the e4m3 weights and float32
    scales too."""
    replaced: dict[str, nn.Linear] = {}
    for name in group_layer_names(model, groups):
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        layer = getattr(parent, leaf) if not leaf.isdigit() else parent[int(leaf)]
        if not isinstance(layer, nn.Linear):
            raise ValueError(f"{name} is a {type(layer).__name__}, not a linear layer (already FP8?)")
        fp8 = FP8Linear.from_linear(layer, kernel, name)
        if leaf.isdigit():
            parent[int(leaf)] = fp8
        else:
            setattr(parent, leaf, fp8)
        replaced[name] = layer if park is None else layer.to(park)
    return replaced


def restore_linears(model: nn.Module, replaced: dict[str, nn.Linear], device: torch.device | str | None = None
                    ) -> None:
    """Put back the layers ``quantize_linears`` returned (moved to ``device`` if given)."""
    for name, layer in replaced.items():
        if device is not None:
            layer.to(device)
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        if leaf.isdigit():
            parent[int(leaf)] = layer
        else:
            setattr(parent, leaf, layer)


def fp8_summary(model: nn.Module) -> dict[str, object]:
    """Which layers are FP8 and with which kernel, and the bytes of their weights and scales."""
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, FP8Linear)]
    return {"layers": len(layers), "kernels": sorted({m.kernel for _, m in layers}),
            "weight_bytes": sum(m.weight_q.numel() + 4 * m.weight_scale.numel() for _, m in layers)}
