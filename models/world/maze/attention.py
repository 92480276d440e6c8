"""The one function through which the maze DiT attends.

Training calls it over whole clips with a block-causal mask (a FlexAttention
``BlockMask`` on CUDA, a boolean mask elsewhere); inference calls it with the
current frame's 256 queries over a context of cached frames plus the frame
itself, and a key-validity mask for empty cache slots. Serving through kv/'s
paged attention replaces the inference call only (``KVContext.attend``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

try:  # FlexAttention exists from torch 2.5; the CPU tests never need it.
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except Exception:  # pragma: no cover - old torch
    create_block_mask = None
    flex_attention = None


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any = None) -> torch.Tensor:
    """Softmax attention, q [B, H, Nq, D], k/v [B, H, Nk, D] -> [B, H, Nq, D].

    ``mask``: None (all keys), a boolean tensor broadcastable to [B, H, Nq, Nk]
    (True = may attend), or a FlexAttention ``BlockMask``.
    """
    if mask is not None and not isinstance(mask, torch.Tensor):
        return flex_attention(q, k, v, block_mask=mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def frame_causal_mask(frames: int, tokens: int, device: torch.device, flex: bool, window: int | None = None) -> Any:
    """Block-causal mask over ``frames`` frames of ``tokens`` tokens: frame i sees frames <= i.

    With ``window`` w, frame i sees the sink (frame 0) and frames i-w..i only,
    which is what serving with a cache of w recent frames shows the model
    (here w = 2)::

        key frame ->  0 1 2 3 4
        query 0       x . . . .
        query 1       x x . . .
        query 2       x x x . .
        query 3       x x x x .
        query 4       x . x x x     (every x is a full tokens x tokens block)
    """
    w = frames if window is None else window
    if flex:
        def causal(b, h, qi, ki):
            fq, fk = qi // tokens, ki // tokens
            return (fq >= fk) & ((fk == 0) | (fq - fk <= w))

        n = frames * tokens
        return create_block_mask(causal, None, None, n, n, device=device)
    fi = torch.arange(frames * tokens, device=device) // tokens
    fq, fk = fi[:, None], fi[None, :]
    return (fq >= fk) & ((fk == 0) | (fq - fk <= w))
