"""One LingBot scenario run on one process or on every rank of a gloo group, for the equality tests.

``python -m tests.parallel.lingbot_ranks CHECKPOINT OUT`` runs it as the rank the environment
names (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, as torchrun sets them) and
saves what it recorded to ``OUT/rank<R>.pt``; ``scenario`` runs it in the calling process.

The scenario, on a pool of one resident session (so sessions swap to host and back)::

    a: open, block 0, block 1        b: open (a swapped out), block 0
    a: block 2 (swapped in, b out)   a: reset, block 0 again        b: close, a: close
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from models.world.lingbot.checkpoint import load_components
from models.world.lingbot.pipeline import BlockRequest, LingBotPipeline
from models.world.parallel.ulysses import Ulysses

# 4 x 6 latents: 6 tokens a frame, 18 a block (over 4 ranks 5, 5, 4, 4: uneven shares).
HEIGHT, WIDTH = 32, 48


def scenario(checkpoint: str | Path, sp: Ulysses | None = None) -> dict[str, Any]:
    """Blocks of two sessions with a swap, a reset and closes; the clean latents and frames of
    each block, this rank's K/V pages and text K/V after the first block, the residency counters."""
    p = LingBotPipeline(load_components(checkpoint), height=HEIGHT, width=WIDTH, max_sessions=1, text_tokens=8,
                        condition_latents=2, steps=2, sequence_parallel=sp)
    latents: list[torch.Tensor] = []
    denoise = p._denoise

    def recorded(*args, **kwargs):
        x0 = denoise(*args, **kwargs)
        latents.append(x0.clone())
        return x0

    p._denoise = recorded
    frames = []

    def block(sid: str, keys=("w",)) -> None:
        frames.append(torch.from_numpy(p.generate([BlockRequest(sid, keys=[frozenset(keys)] * 3)])[0]))

    out: dict[str, Any] = {}
    p.open("a", "a red door", seed=7)
    block("a")
    out["pages_k"] = p.cache.storage.k[1].clone()
    out["pages_v"] = p.cache.storage.v[0].clone()
    out["text_k"] = p.cache.storage.cross_k[0].clone()
    block("a", ("d", "j"))
    p.open("b", "grass", seed=3)
    block("b")
    block("a")
    p.reset("a")
    block("a")
    p.close("b")
    p.close("a")
    m = p.residency.metrics()
    out.update(latents=latents, frames=frames, swaps=(m["swap_outs"], m["swap_ins"]),
               free_blocks=m["free_blocks"], total_blocks=m["total_blocks"], sessions=sorted(p.sessions))
    return out


def main(checkpoint: str, out: str) -> int:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        result = scenario(checkpoint, Ulysses.from_default_group())
        torch.save(result, Path(out) / f"rank{dist.get_rank()}.pt")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
