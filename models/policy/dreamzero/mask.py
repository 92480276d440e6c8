"""The block-causal attention mask of DreamZero's training sequence, as a pure function.

A training sequence of ``n`` chunks is laid out by modality (upstream
``CausalWanModel``, ``_blockwise_causal_flash_attn``)::

    [ first frame | video block 1 .. n | action block 1 .. n | state block 1 .. n ]

and a query may see (``+``: every key of that span; ``.``: none)::

    query \\ key       first   video j<=i   video j>i   action i   action j!=i   state i   state j!=i
    first frame        +        .            .           .          .             .         .
    video block i      +        +            .           +          .             +         .
    action block i     +        +            .           +          .             +         .
    state block i      .        .            .           .          .             +         .

Serving walks the same mask a chunk at a time: the K/V of the first frame and of earlier
chunks' (real) frames are cached, and a chunk's video and action queries attend to the
cache plus the chunk's own ``[video | actions | state]`` tokens, which is exactly the
``video j<=i``, ``action i`` and ``state i`` columns above. One difference is upstream's
and kept: at inference the state token attends to the whole chunk (the cache, the video
and the actions), where in training it sees only itself (``model.py`` says where).

The window (``local_attn_size`` latent frames) never binds in DROID's training sequences
(33 video frames = 1 + 4 blocks of 2 latent frames, 9 in all), so it is not drawn here.
"""

from __future__ import annotations

import torch


def block_causal_mask(num_blocks: int, tokens_per_frame: int, frames_per_block: int,
                      actions_per_block: int, states_per_block: int) -> torch.Tensor:
    """``[L, L]`` bool (True: the query row may attend to the key column) for the layout above,
    ``L = tokens_per_frame * (1 + num_blocks * frames_per_block)
    + num_blocks * (actions_per_block + states_per_block)``."""
    for name, value in (("num_blocks", num_blocks), ("tokens_per_frame", tokens_per_frame),
                        ("frames_per_block", frames_per_block)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if actions_per_block < 0 or states_per_block < 0:
        raise ValueError("actions_per_block and states_per_block must be >= 0")
    first = tokens_per_frame
    block = frames_per_block * tokens_per_frame
    video_end = first + num_blocks * block
    action_end = video_end + num_blocks * actions_per_block
    total = action_end + num_blocks * states_per_block
    mask = torch.zeros(total, total, dtype=torch.bool)
    mask[:first, :first] = True
    for i in range(num_blocks):
        v0, v1 = first + i * block, first + (i + 1) * block
        a0, a1 = video_end + i * actions_per_block, video_end + (i + 1) * actions_per_block
        s0, s1 = action_end + i * states_per_block, action_end + (i + 1) * states_per_block
        for q0, q1 in ((v0, v1), (a0, a1)):
            mask[q0:q1, :v1] = True          # the first frame and video blocks 1..i
            mask[q0:q1, a0:a1] = True        # this block's actions
            mask[q0:q1, s0:s1] = True        # this block's state
        mask[s0:s1, s0:s1] = True
    return mask
