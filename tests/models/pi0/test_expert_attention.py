"""models.policy.pi0.expert_attention: the math path against a float64 softmax in process, and the
Triton split-KV kernel under the Triton interpreter (fp32, a subprocess: TRITON_INTERPRET must be
set before triton is imported). The bf16 kernel on CUDA is in test_pi0_cuda.py."""

from __future__ import annotations

import math

import pytest
import torch

from models.policy.pi0.expert_attention import expert_attention, expert_attention_math
from pi0_support import run_interpreted



def case(b: int, t: int, h: int, d: int, keys: int, seed: int = 0):
    """Inputs laid out as the expert's: q a strided view of q|k|v, robot 0's later keys all hidden."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, h + 2, d, generator=g)[:, :, :h]
    k, v = torch.randn(b, keys, d, generator=g), torch.randn(b, keys, d, generator=g)
    mask = torch.rand(b, t, keys, generator=g) > 0.4
    mask[..., 0] = True
    mask[0, :, keys // 2:] = False
    bias = torch.zeros(b, 1, t * h, keys).masked_fill_(~mask.repeat_interleave(h, dim=1)[:, None], float("-inf"))
    return q, k, v, bias, mask


def per_key_case(b: int, t: int, h: int, d: int, keys: int, seed: int = 0):
    """The prefix's layout: a bias per key only ([B, 1, 1, L], padding hidden), robot 0 with fewer keys."""
    q, k, v, _, _ = case(b, t, h, d, keys, seed)
    pad = torch.ones(b, keys, dtype=torch.bool)
    pad[0, keys - keys // 3:] = False
    bias = torch.zeros(b, 1, 1, keys).masked_fill_(~pad[:, None, None, :], float("-inf"))
    return q, k, v, bias, pad[:, None, :].expand(b, t, keys)


def reference(q, k, v, mask):
    b, t, h, d = q.shape
    scores = torch.einsum("bthd,bkd->bthk", q.double(), k.double()) / math.sqrt(d)
    scores = scores.masked_fill(~mask[:, :, None, :], float("-inf"))
    return torch.einsum("bthk,bkd->bthd", scores.softmax(-1), v.double()).reshape(b, t, h * d)


def test_math_path_equals_a_float64_softmax():
    q, k, v, bias, mask = case(2, 5, 4, 16, 70)
    got = expert_attention(q, k, v, bias)  # CPU tensors: the custom op takes the math path
    assert got.shape == (2, 5, 64) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference(q, k, v, mask), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(expert_attention_math(q, k, v, bias), got, atol=0, rtol=0)


def test_a_bias_per_key_broadcasts_over_the_rows():
    q, k, v, bias, mask = per_key_case(2, 5, 4, 16, 30)
    got = expert_attention(q, k, v, bias)
    torch.testing.assert_close(got.double(), reference(q, k, v, mask), atol=1e-5, rtol=1e-5)
    full = bias.expand(2, 1, 20, 30).contiguous()
    torch.testing.assert_close(expert_attention(q, k, v, full), got, atol=0, rtol=0)


def test_the_op_traces_whole_under_torch_compile():
    q, k, v, bias, _ = case(1, 3, 2, 16, 20)
    fn = torch.compile(lambda *a: expert_attention(*a) * 2, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(fn(q, k, v, bias), expert_attention(q, k, v, bias) * 2)


INTERPRETED = """
import json, sys
sys.path.insert(0, "tests/models/pi0")
from test_expert_attention import case, per_key_case, reference
from models.policy.pi0.expert_attention import expert_attention_triton
out = {}
for name, (b, t, h, d, keys, splits) in {
        "one_split": (1, 5, 4, 16, 70, 1), "three_splits": (2, 5, 4, 16, 70, 3),
        "empty_splits": (2, 5, 4, 16, 70, 8), "head_dim_32_ragged": (3, 3, 2, 32, 33, None)}.items():
    q, k, v, bias, mask = case(b, t, h, d, keys)
    got = expert_attention_triton(q, k, v, bias, num_splits=splits, block_m=16, block_n=16)
    out[name] = (got.double() - reference(q, k, v, mask)).abs().max().item()
q, k, v, bias, mask = per_key_case(2, 9, 4, 16, 40)
got = expert_attention_triton(q, k, v, bias, num_splits=2, block_m=32, block_n=16)
out["bias_per_key"] = (got.double() - reference(q, k, v, mask)).abs().max().item()
print(json.dumps(out))
"""


def test_triton_kernel_under_the_interpreter():
    errors = run_interpreted(INTERPRETED)
    assert set(errors) == {"one_split", "three_splits", "empty_splits", "head_dim_32_ragged", "bias_per_key"}
    assert all(e < 1e-5 for e in errors.values()), errors
