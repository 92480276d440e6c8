"""The Ulysses exchange: token shares, the all-to-alls on 4 gloo ranks, per-rank geometry."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kv import KVGeometry
from models.world.parallel.ulysses import check_heads, per_rank_geometry, token_shares
from tests.parallel import ulysses_ranks
from tests.parallel.ranks import run_ranks


def test_token_shares_are_as_even_as_possible_first_ranks_longer():
    assert token_shares(11, 4) == [3, 3, 3, 2]
    assert token_shares(4680, 8) == [585] * 8     # one 480x832 LingBot block over 8 GPUs
    assert token_shares(2, 4) == [1, 1, 0, 0]


def test_heads_must_divide_by_the_ranks():
    assert check_heads(40, 8) == 5
    with pytest.raises(ValueError, match="heads divisible by 3, the model has 40"):
        check_heads(40, 3)


def test_per_rank_geometry_stores_a_rank_share_of_the_heads():
    g = KVGeometry(num_layers=40, kv_heads=40, head_dim=128, tokens_per_frame=1560, block_size=1560,
                   sink_frames=9, window_frames=6, frames_per_tick=3, span_frames=3, cross_tokens=512)
    r = per_rank_geometry(g, 4)
    assert (r.kv_heads, r.page_bytes * 4, r.cross_bytes * 4) == (10, g.page_bytes, g.cross_bytes)
    with pytest.raises(ValueError, match="divisible by 3"):
        per_rank_geometry(g, 3)


def test_exchange_round_trips_and_attends_every_token_on_4_ranks(tmp_path):
    """4 ranks, 11 tokens (shares 3, 3, 3, 2); test_lingbot_equal.py runs the model on 2."""
    size = 4
    done = run_ranks(size, "tests.parallel.ulysses_ranks", str(tmp_path))
    assert [p.returncode for p in done] == [0] * size, "\n".join(p.stdout[-2000:] for p in done)
    whole = ulysses_ranks.block()
    h = ulysses_ranks.HEADS // size
    attended = F.scaled_dot_product_attention(*(whole.transpose(1, 2),) * 3).transpose(1, 2)
    start = 0
    for rank, n in enumerate(token_shares(ulysses_ranks.TOKENS, size)):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.equal(got["shard"], whole[:, start:start + n])
        assert torch.equal(got["heads"], whole[:, :, rank * h:(rank + 1) * h])   # every token, its heads
        assert torch.equal(got["back"], got["shard"])
        torch.testing.assert_close(got["attended"], attended[:, start:start + n], rtol=0, atol=1e-6)
        assert torch.equal(got["gathered"], whole.flatten(2))
        start += n
