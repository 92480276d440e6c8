"""FP8 (e4m3, per-row scales): the round trip, scale handling, the emulated matmul against the
reference maths, and which of the model's layers a group covers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models.world.lingbot.fp8 import (E4M3, E4M3_MAX, FLOAT32_TINY, FP8Linear, dequantize_rows,
                                      group_layer_names, quantize_linears, quantize_rows,
                                      restore_linears, row_scales, scaled_mm_supported)
from models.world.lingbot.transformer import CausalLingBotWorldTransformer3DModel


def _bound(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3 keeps 3 mantissa bits: half an ulp is 2^-4 of a normal value; below e4m3's smallest
    normal (2^-6) the spacing is 2^-9, so the error is at most scale * 2^-10 there (with a
    hair for float32's own rounding of x / scale and q * scale)."""
    return torch.maximum(x.abs() * 2.0 ** -4, scale * 2.0 ** -10) * (1 + 2.0 ** -16)


def test_round_trip_error_is_within_e4m3_rounding_and_the_row_max_is_exact():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 96, generator=g) * torch.logspace(-3, 3, 64)[:, None]
    q, s = quantize_rows(x)
    assert q.dtype == E4M3 and s.dtype == torch.float32 and s.shape == (64, 1)
    back = dequantize_rows(q, s, torch.float32)
    assert ((back - x).abs() <= _bound(x, s)).all()
    # Each row's largest magnitude maps to +-448, so it comes back (to float32 rounding).
    i = x.abs().argmax(1)
    torch.testing.assert_close(back.gather(1, i[:, None]), x.gather(1, i[:, None]), rtol=1e-6, atol=0)
    assert q.float().abs().amax(1).eq(E4M3_MAX).all()


def test_zero_rows_tiny_rows_and_extreme_rows():
    x = torch.zeros(5, 32)
    x[1] = 1e30 * torch.linspace(-1, 1, 32)                  # huge: the scale is 1e30 / 448
    x[2, 3] = 1e-42                                          # float32 subnormal: below any scale
    x[3] = torch.tensor([1e-30] * 16 + [1.0] * 16)           # values 1e30 below the row max
    x[4, 0], x[4, 1] = 448.0 * 2 ** 20, -1.0                 # a row max far above e4m3's range
    q, s = quantize_rows(x)
    assert s[0].item() == FLOAT32_TINY and not q[0].float().any()       # zero row: zeros back
    back = dequantize_rows(q, s, torch.float32)
    assert torch.equal(back[0], x[0]) and torch.isfinite(back).all()
    assert ((back - x).abs() <= _bound(x, s)).all()
    assert s[1].item() == pytest.approx(1e30 / E4M3_MAX, rel=1e-6)
    assert not back[2].any()                                  # flushed to zero, not inf or nan
    assert not back[3, :16].any()                             # below 2^-9 of the row max: zero
    torch.testing.assert_close(back[3, 16:], x[3, 16:], rtol=1e-6, atol=0)
    assert back[4, 0].item() == x[4, 0].item()
    assert row_scales(torch.zeros(2, 3, 4)).shape == (2, 3, 1)


def test_emulated_matmul_is_the_reference_maths():
    """y[m, n] = sum_k (qx[m, k] * sx[m]) * (qw[n, k] * sw[n]) + b[n], in float64."""
    g = torch.Generator().manual_seed(1)
    lin = nn.Linear(48, 40)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(40, 48, generator=g) * 0.2)
        lin.weight[7] = 0.0                                   # a zero weight row
        lin.bias.copy_(torch.randn(40, generator=g))
    layer = FP8Linear.from_linear(lin, "emulated")
    assert layer.kernel == "emulated" and layer.weight_q.dtype == E4M3 and layer.weight_scale.shape == (40, 1)
    x = torch.randn(2, 5, 48, generator=g) * 3.0
    x[1, 2] = 0.0                                             # a zero activation row
    y = layer(x)
    assert y.shape == (2, 5, 40) and y.dtype == torch.float32
    qx, sx = quantize_rows(x.reshape(-1, 48))
    ref = ((qx.double() * sx.double()) @ (layer.weight_q.double() * layer.weight_scale.double()).T
           + lin.bias.double()).reshape(2, 5, 40)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(y[:, :, 7], lin.bias[7].expand(2, 5))     # zero row: the bias only
    assert torch.equal(y[1, 2], lin.bias)                        # zero token: the bias only
    # And near the full-precision layer: relative error of a few e4m3 roundings.
    exact = lin(x)
    assert ((y - exact).norm() / exact.norm()).item() < 0.08


def test_emulated_matmul_in_bf16_matches_the_float32_emulation():
    g = torch.Generator().manual_seed(2)
    lin = nn.Linear(64, 32).to(torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(32, 64, generator=g).to(torch.bfloat16))
    x = torch.randn(8, 64, generator=g).to(torch.bfloat16)
    y = FP8Linear.from_linear(lin, "emulated")(x)
    assert y.dtype == torch.bfloat16
    y32 = FP8Linear.from_linear(lin.float(), "emulated")(x.float())
    torch.testing.assert_close(y.float(), y32, rtol=2e-2, atol=5e-2)    # bf16 rounding of inputs and output


def test_the_kernel_is_scaled_mm_only_on_hopper_cuda_with_aligned_widths():
    assert not scaled_mm_supported(torch.device("cpu"), 5120, 13824)
    assert FP8Linear.from_linear(nn.Linear(32, 16)).kernel == "emulated"    # on this CPU
    with pytest.raises(ValueError, match="kernel must be scaled_mm or emulated"):
        FP8Linear.from_linear(nn.Linear(32, 16), "triton")
    bad = nn.Linear(4, 4)
    with torch.no_grad():
        bad.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="blocks.3.ffn.0: weight has non-finite values"):
        FP8Linear.from_linear(bad, name="blocks.3.ffn.0")


def test_groups_cover_the_block_linears_and_leave_norms_embeddings_camera_and_head(tiny_config):
    model = CausalLingBotWorldTransformer3DModel(tiny_config)
    assert group_layer_names(model, ("ffn",)) == ["blocks.0.ffn.0", "blocks.0.ffn.2", "blocks.1.ffn.0",
                                                  "blocks.1.ffn.2"]
    before = {n: type(m) for n, m in model.named_modules()}
    replaced = quantize_linears(model, ("ffn", "attn", "cross"))
    fp8 = sorted(n for n, m in model.named_modules() if isinstance(m, FP8Linear))
    assert fp8 == sorted(replaced) and len(fp8) == 2 * 8
    assert {n.split(".", 2)[2] for n in fp8} == {"ffn.0", "ffn.2", "self_attn.qkv", "self_attn.o",
                                                  "cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o"}
    still = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert all(any(k in n for k in ("cam_", "embedding", "c2ws", "time_", "head")) for n in still), still
    with pytest.raises(ValueError, match="not a linear layer"):
        quantize_linears(model, ("ffn",))
    with pytest.raises(ValueError, match="unknown fp8 group"):
        group_layer_names(model, ("mlp",))
    restore_linears(model, replaced)
    assert {n: type(m) for n, m in model.named_modules()} == before


def test_parked_layers_wait_elsewhere_and_come_back_whole(tiny_config):
    model = CausalLingBotWorldTransformer3DModel(tiny_config)
    weights = {n: p.clone() for n, p in model.named_parameters()}
    replaced = quantize_linears(model, ("ffn",), park="meta")     # the bench parks them on the host
    assert {p.device.type for layer in replaced.values() for p in layer.parameters()} == {"meta"}
    assert all(m.weight_q.device.type == "cpu" for m in model.modules() if isinstance(m, FP8Linear))
    for name, layer in replaced.items():                             # meta holds no data: put it back
        layer.to_empty(device="cpu")
        layer.weight.data.copy_(weights[f"{name}.weight"])
        layer.bias.data.copy_(weights[f"{name}.bias"])
    restore_linears(model, replaced, "cpu")
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())
