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
