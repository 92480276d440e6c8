"""``python -m tests.parallel.ulysses_ranks OUT``: every rank exchanges a known tensor with
``Ulysses`` and saves what it got to ``OUT/rank<R>.pt`` (test_ulysses.py checks it)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from models.world.parallel.ulysses import Ulysses

ROWS, TOKENS, HEADS, DIM = 2, 11, 4, 3   # 11 tokens: uneven shares at 2 and 4 ranks


def block() -> torch.Tensor:
    """The whole block's q (= k = v here) ``[R, L, H, D]``, the same on every rank."""
    return torch.arange(ROWS * TOKENS * HEADS * DIM, dtype=torch.float32).view(ROWS, TOKENS, HEADS, DIM) / 100


def main(out: str) -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        sp = Ulysses.from_default_group()
        x = sp.shard(block())
        heads = sp.to_heads(x, TOKENS)
        o = F.scaled_dot_product_attention(*(heads.transpose(1, 2),) * 3).transpose(1, 2)
        torch.save({"shard": x, "heads": heads, "back": sp.to_tokens(heads), "attended": sp.to_tokens(o),
                    "gathered": sp.gather(x.flatten(2), TOKENS)}, Path(out) / f"rank{sp.rank}.pt")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
