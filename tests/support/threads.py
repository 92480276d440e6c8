"""Torch's intra-op thread count for a block of a test, put back after it: a test that needs one
thread (results compared with processes that run with one, or sums in a fixed order) must not
leave the rest of the suite at one (float32 convolutions round differently at other counts)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
