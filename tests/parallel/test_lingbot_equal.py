"""A LingBot session split over 2 gloo ranks makes the blocks one process makes (4 heads, so
the checkpoint also splits over 4; four processes on the 2-core CI machine cost 35 s, so the
exchange alone is tested at 4 ranks, test_ulysses.py).

Tolerance: the clean latents agree to 1e-5 (float32; a rank's linear layers run on its share
of the tokens, whose row count may pick another CPU kernel than the whole block's and round
differently) and the frames to 1 in 255; each rank's K/V pages and text K/V are the
single-process ones' heads of that rank, to the same 1e-5. Swaps, reset and close leave the
same counters, blocks and sessions as on one process.
"""

from __future__ import annotations

import pytest
import torch

from tests.parallel.lingbot_ranks import scenario
from tests.parallel.ranks import run_ranks

ATOL = 1e-5


@pytest.fixture(scope="module")
def single(four_head_checkpoint):
    torch.manual_seed(0)
    return scenario(four_head_checkpoint)


@pytest.mark.parametrize("size", [2])
def test_sequence_parallel_blocks_equal_one_process(size, single, four_head_checkpoint, tmp_path):
    done = run_ranks(size, "tests.parallel.lingbot_ranks", str(four_head_checkpoint), str(tmp_path))
    assert [p.returncode for p in done] == [0] * size, "\n".join(p.stdout[-2000:] for p in done)
    heads = 4 // size
    for rank in range(size):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert len(got["latents"]) == len(single["latents"]) == 5
        for a, b in zip(got["latents"], single["latents"]):
            torch.testing.assert_close(a, b, rtol=0, atol=ATOL)
        for a, b in zip(got["frames"], single["frames"]):
            assert a.shape == b.shape and (a.int() - b.int()).abs().max() <= 1
        # The rank's pool holds its heads of every page and of the text K/V, nothing more.
        own = slice(rank * heads, (rank + 1) * heads)
        for key in ("pages_k", "pages_v", "text_k"):
            assert got[key].shape[-2] == heads
            torch.testing.assert_close(got[key], single[key][..., own, :], rtol=0, atol=ATOL)
        for key in ("swaps", "free_blocks", "total_blocks", "sessions"):
            assert got[key] == single[key], key
    # The reset replays the session's first block.
    torch.testing.assert_close(single["latents"][4], single["latents"][0], rtol=0, atol=0)
    assert single["swaps"] == (2, 1)
