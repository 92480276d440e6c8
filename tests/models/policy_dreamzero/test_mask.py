"""The block-causal mask, written out by hand for two blocks."""

from __future__ import annotations

import pytest
import torch

from models.policy.dreamzero.mask import block_causal_mask


def test_two_blocks_by_hand():
    # 1 token a frame, 1 frame a block, 2 actions and 1 state a block:
    # tokens  0: first frame | 1: video b1 | 2: video b2 | 3 4: actions b1 | 5 6: actions b2 | 7: state b1 | 8: state b2
    rows = [
        "1........",   # first frame: itself
        "11.11..1.",   # video b1: first, b1, actions b1, state b1
        "111..11.1",   # video b2: first, b1, b2, actions b2, state b2
        "11.11..1.",   # action b1 (token 3)
        "11.11..1.",   # action b1 (token 4)
        "111..11.1",   # action b2 (token 5)
        "111..11.1",   # action b2 (token 6)
        ".......1.",   # state b1: itself
        "........1",   # state b2: itself
    ]
    want = torch.tensor([[c == "1" for c in r] for r in rows])
    assert torch.equal(block_causal_mask(2, tokens_per_frame=1, frames_per_block=1, actions_per_block=2,
                                         states_per_block=1), want)


def test_frames_expand_to_their_tokens():
    # 2 tokens a frame, 2 frames a block, no register: first frame (2) | block 1 (4).
    m = block_causal_mask(1, tokens_per_frame=2, frames_per_block=2, actions_per_block=0, states_per_block=0)
    want = torch.zeros(6, 6, dtype=torch.bool)
    want[:2, :2] = True
    want[2:, :] = True
    assert torch.equal(m, want)


def test_refuses_empty_geometry():
    with pytest.raises(ValueError, match="num_blocks"):
        block_causal_mask(0, 1, 1, 0, 0)
