"""Robots at different window positions sharing each denoising forward, split over 2 gloo ranks
(Ulysses and the CFG split, ``split_ranks``), make the actions one process makes: the batch's
rows keep their own RoPE offsets, pages and condition on every rank. Tolerance as in
tests/parallel/test_dreamzero_equal.py (1e-4: the ranks' layers see other row and token counts)."""

from __future__ import annotations

import pytest
import torch

from models.policy.dreamzero.config import TINY_DROID
from models.policy.dreamzero.tiny_checkpoint import write_tiny_checkpoint, write_tiny_tokenizer
from tests.models.policy_dreamzero.split_ranks import policy_of, scenario
from tests.parallel.dreamzero_splits import SPLITS
from tests.parallel.ranks import run_ranks
from tests.support.threads import torch_threads

ATOL = 1e-4


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("dreamzero_split")
    return str(write_tiny_checkpoint(root / "ckpt", cfg=TINY_DROID)), str(write_tiny_tokenizer(root / "tok"))


@pytest.fixture(scope="module")
def single(folders):
    with torch_threads(1):   # as the ranks run (the sums in the same order)
        return scenario(policy_of(*folders))


@pytest.fixture(scope="module")
def ranks(folders, tmp_path_factory):
    out = tmp_path_factory.mktemp("dreamzero_split_out")
    done = run_ranks(2, "tests.models.policy_dreamzero.split_ranks", *folders, str(out), timeout=120)
    assert [p.returncode for p in done] == [0, 0], "\n".join(p.stdout[-3000:] for p in done)
    return torch.load(out / "rank0.pt", weights_only=False)


@pytest.mark.parametrize("how", SPLITS)
def test_mixed_position_batches_split_over_ranks_equal_one_process(how, single, ranks):
    got = ranks[how]
    assert {sid: len(a) for sid, a in single.items()} == {"x": 4, "y": 3, "z": 2}
    for sid, want in single.items():
        assert len(got[sid]) == len(want)
        for a, b in zip(got[sid], want):
            torch.testing.assert_close(a, b, rtol=0, atol=ATOL)
