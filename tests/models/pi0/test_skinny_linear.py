"""models.policy.pi0.skinny_linear: where the weight stream applies, the torch path it falls back
to, and the Triton kernel (plain and gelu-gated) under the Triton interpreter in fp32 (a subprocess:
TRITON_INTERPRET must be set before triton is imported). bf16 at pi0's sizes is in test_pi0_cuda.py."""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from models.policy.pi0.skinny_linear import MAX_ROWS, applies, geglu, linear, reference
from pi0_support import run_interpreted



def test_cpu_takes_the_torch_path_exactly():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 5, 32, generator=g), torch.randn(48, 32, generator=g)
    assert not applies(x, w)  # CPU tensors
    torch.testing.assert_close(linear(x, w), F.linear(x, w), atol=0, rtol=0)
    gate, up = F.linear(x, w).chunk(2, dim=-1)
    torch.testing.assert_close(geglu(x, w), F.gelu(gate, approximate="tanh") * up, atol=0, rtol=0)
    assert geglu(x, w).shape == (1, 5, 24)


def test_only_a_few_rows_are_a_weight_stream():
    if not torch.cuda.is_available():
        pytest.skip("applies() is about CUDA tensors")
    w = torch.zeros(64, 32, device="cuda")
    assert applies(torch.zeros(1, MAX_ROWS, 32, device="cuda"), w)
    assert not applies(torch.zeros(2, MAX_ROWS, 32, device="cuda"), w)  # the prefix, larger batches
    assert not applies(torch.zeros(1, 4, 32, device="cuda", dtype=torch.bfloat16), w)  # mixed dtypes


INTERPRETED = """
import json, torch
from models.policy.pi0.skinny_linear import reference, skinny_triton
g = torch.Generator().manual_seed(0)
out = {}
for name, (rows, k, n, geglu, bn, bk) in {
        "plain_51_rows": (51, 128, 64, False, 32, 64), "plain_one_row": (1, 64, 32, False, 16, 64),
        "geglu_51_rows": (51, 128, 128, True, 32, 64), "geglu_ragged": (7, 192, 64, True, 16, 64)}.items():
    x = torch.randn(1, rows, k, generator=g)
    w = torch.randn(n, k, generator=g) / k ** 0.5
    got = skinny_triton(x, w, geglu=geglu, block_n=bn, block_k=bk, num_stages=1)
    want = reference(x.double(), w.double(), geglu)
    assert got.shape == want.shape, (got.shape, want.shape)
    out[name] = (got.double() - want).abs().max().item()
print(json.dumps(out))
"""


def test_triton_kernel_under_the_interpreter():
    errors = run_interpreted(INTERPRETED)
    assert set(errors) == {"plain_51_rows", "plain_one_row", "geglu_51_rows", "geglu_ragged"}
    assert all(e < 1e-4 for e in errors.values()), errors
