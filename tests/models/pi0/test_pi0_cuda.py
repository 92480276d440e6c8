"""On CUDA only: the graphed call (prefix + Euler loop, or the loop alone), with compiled or
eager layers, equals the eager one within bf16 tolerance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.policy.pi0 import load_policy
from test_pi0_model import obs, work
from pi0_support import write_tiny

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_graphs_match_eager(tmp_path):
    write_tiny(str(tmp_path))
    fast = load_policy(str(tmp_path), device="cuda", max_batch=4)  # the default: graphs + compiled layers
    whole = load_policy(str(tmp_path), device="cuda", max_batch=4, compile=False)
    loop_only = load_policy(str(tmp_path), device="cuda", max_batch=4, compile=False)
    loop_only.runner.graph_prefix = False
    eager = load_policy(str(tmp_path), device="cuda", max_batch=4, use_graphs=False)
    assert fast.runner.graph_count > 0 and fast.runner.graph_prefix and fast.runner.fns.compiled
    assert whole.runner.graph_count > 0 and whole.runner.graph_prefix and not whole.runner.fns.compiled
    assert not eager.runner.fns.compiled
    for n in (1, 3):
        works = [work(f"r{i}", obs(i), seed=i) for i in range(n)]
        ref = np.stack([r["actions"] for r in eager.infer_batch(works)])
        for p in (fast, whole, loop_only):
            for _ in range(2):  # replays reuse the static buffers: the second must not see the first
                got = np.stack([r["actions"] for r in p.infer_batch(works)])
                np.testing.assert_allclose(got, ref, atol=5e-2, rtol=5e-2)
    # Different inputs through the same graph give different answers.
    for p in (fast, whole):
        a = p.infer_batch([work("a", obs(1), seed=1)])[0]["actions"]
        b = p.infer_batch([work("a", obs(2), seed=1)])[0]["actions"]
        assert np.abs(a - b).max() > 1e-3
    # Mixed step counts in one batch run eagerly over the compiled layers.
    mixed = [work("m0", obs(0), seed=0, steps=2), work("m1", obs(1), seed=1, steps=3)]
    np.testing.assert_allclose(np.stack([r["actions"] for r in fast.infer_batch(mixed)]),
                               np.stack([r["actions"] for r in eager.infer_batch(mixed)]), atol=5e-2, rtol=5e-2)


def test_graphs_without_the_weight_stream_match_eager(tmp_path):
    """The benchmarks' cuBLAS row: graphs over compiled layers whose matmuls are all ``F.linear``."""
    write_tiny(str(tmp_path))
    off = load_policy(str(tmp_path), device="cuda", max_batch=4, weight_stream=False)
    eager = load_policy(str(tmp_path), device="cuda", max_batch=4, use_graphs=False)
    assert off.runner.graph_count > 0 and off.runner.fns.compiled and not off.runner.fns.weight_stream
    for n in (1, 3):
        works = [work(f"r{i}", obs(i), seed=i) for i in range(n)]
        ref = np.stack([r["actions"] for r in eager.infer_batch(works)])
        np.testing.assert_allclose(np.stack([r["actions"] for r in off.infer_batch(works)]), ref,
                                   atol=5e-2, rtol=5e-2)


def test_expert_attention_kernel_matches_the_math_path_at_full_size_and_in_a_graph():
    """pi0's own geometry: 51 tokens x 8 heads over 880 keys of head_dim 256, bf16, batch 1 and 8."""
    from models.policy.pi0.expert_attention import expert_attention_math, expert_attention_triton

    g = torch.Generator(device="cuda").manual_seed(0)
    for b in (1, 8):
        q = torch.randn(b, 51, 10, 256, device="cuda", generator=g).to(torch.bfloat16)[:, :, :8]
        k, v = (torch.randn(b, 880, 256, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
        mask = torch.rand(b, 51, 880, device="cuda", generator=g) > 0.2
        mask[..., 0] = True
        bias = torch.zeros(b, 1, 408, 880, dtype=torch.bfloat16, device="cuda").masked_fill_(
            ~mask.repeat_interleave(8, dim=1)[:, None], float("-inf"))
        want = expert_attention_math(q, k, v, bias).float()
        torch.testing.assert_close(expert_attention_triton(q, k, v, bias).float(), want, atol=2e-2, rtol=2e-2)
        graph = torch.cuda.CUDAGraph()
        expert_attention_triton(q, k, v, bias)  # compile outside the capture
        with torch.cuda.graph(graph):
            out = expert_attention_triton(q, k, v, bias)
        q.copy_(torch.randn(q.shape, device="cuda", generator=g).to(torch.bfloat16))
        graph.replay()
        torch.testing.assert_close(out.float(), expert_attention_math(q, k, v, bias).float(), atol=2e-2, rtol=2e-2)


def test_expert_attention_kernel_at_the_prefix_geometry_with_a_bias_per_key():
    """Gemma-2B's prefix: 816 tokens x 8 heads (6,528 rows) over 816 keys, a 12-token prompt's
    padding hidden by a [B, 1, 1, L] bias; bf16, every candidate tile and the tuned choice."""
    from models.policy.pi0.expert_attention import (CANDIDATES, expert_attention, expert_attention_math,
                                                    expert_attention_triton)

    g = torch.Generator(device="cuda").manual_seed(1)
    for b in (1, 2):
        q = torch.randn(b, 816, 10, 256, device="cuda", generator=g).to(torch.bfloat16)[:, :, :8]
        k, v = (torch.randn(b, 816, 256, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
        pad = torch.ones(b, 816, dtype=torch.bool, device="cuda")
        pad[:, 780:] = False
        bias = torch.zeros(b, 1, 1, 816, dtype=torch.bfloat16, device="cuda").masked_fill_(~pad[:, None, None], float("-inf"))
        want = expert_attention_math(q, k, v, bias).float()
        for block_m, block_n, splits, warps in CANDIDATES:
            got = expert_attention_triton(q, k, v, bias, block_m=block_m, block_n=block_n, num_splits=splits,
                                          num_warps=warps)
            torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(expert_attention(q, k, v, bias).float(), want, atol=2e-2, rtol=2e-2)


def test_skinny_linear_matches_cublas_at_the_expert_sizes():
    """The expert's four matmuls at one robot (51 rows, bf16), every candidate tile and the tuned op."""
    from models.policy.pi0.skinny_linear import CANDIDATES, geglu, linear, reference, skinny_triton

    g = torch.Generator(device="cuda").manual_seed(0)
    for k, n, gated in ((1024, 2560, False), (2048, 1024, False), (1024, 8192, True), (4096, 1024, False)):
        x = torch.randn(1, 51, k, device="cuda", generator=g).to(torch.bfloat16)
        w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).to(torch.bfloat16)
        want = reference(x, w, gated).float()
        for bn, bk, warps, stages in CANDIDATES:
            if k % bk or (n // (2 if gated else 1)) % bn:
                continue
            got = skinny_triton(x, w, geglu=gated, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages)
            torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)
        op = geglu if gated else linear
        torch.testing.assert_close(op(x, w).float(), want, atol=3e-2, rtol=3e-2)
        # Without the stream (the benchmarks' cuBLAS row) it is the torch path itself.
        torch.testing.assert_close(op(x, w, stream=False), reference(x, w, gated), atol=0, rtol=0)
