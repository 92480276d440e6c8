"""Batch-invariant products of per-row vectors: a session's row must not depend on its batch.

A world batches the ticks of many sessions, so a per-frame vector (a noise level, the held
keys, a prompt embedding) is one row of a matrix with as many rows as the batch has
sessions. A BLAS kernel is chosen by the row count and rounds a row differently under
different kernels: MKL on CPU takes another kernel at 1-3 rows than at 4 or more, and with
two threads at every count below 12 that is not a multiple of 4 (torch 2.13, MKL 2024.2,
AVX-512; any count that is a multiple of 4 gave the same rows at 1-8 threads). A session's
frames would then change with the number of sessions that shared its batches. Rows padded
with zeros to a multiple of ``ROW_MULTIPLE`` take one kernel at any batch size. Products
over a frame's tokens have a multiple of the tokens per frame as rows and need no padding.

Attention has the same hazard in its key length: keys padded (and masked) up to the longest
row of a batch are summed in other groupings than the row's own keys, so rows attend
unpadded, in groups of equal length (``kv.paged_attention``'s gather; ``tiny.py``).
"""

from __future__ import annotations

import torch

ROW_MULTIPLE = 4


def padded(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[B, ...]`` with zero rows appended up to a multiple of ``ROW_MULTIPLE`` (``x`` itself
    when it is one). The caller keeps the result's first ``B`` rows."""
    pad = -x.shape[0] % ROW_MULTIPLE
    return x if not pad else torch.cat([x, x.new_zeros(pad, *x.shape[1:])])
