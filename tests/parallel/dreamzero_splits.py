"""What the DreamZero rank scripts (``tests.parallel.dreamzero_ranks``,
``tests.models.policy_dreamzero.split_ranks``) share: the tiny policy loaded from its folders, and
one policy per split (``heads``: Ulysses, ``cfg``: the CFG split) driven on both ranks of a gloo
group the way the server drives them: rank 0 through ``Mirrored``, rank 1 ``follow``s."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from models.policy.dreamzero.adapter import DreamZeroPolicy
from models.policy.dreamzero.checkpoint import load_checkpoint

SPLITS = ("heads", "cfg")


def load_policy(checkpoint: str, tokenizer: str, sessions: int, split: Any = None,
                name: str = "dreamzero") -> DreamZeroPolicy:
    """The tiny checkpoint's policy with ``sessions`` resident sessions, on ``split`` (None: one process)."""
    from transformers import T5TokenizerFast

    tok = T5TokenizerFast.from_pretrained(tokenizer, local_files_only=True)
    return DreamZeroPolicy(load_checkpoint(checkpoint), tok, sessions=sessions, split=split, name=name)


def on_ranks(build: Callable[[Any, str], DreamZeroPolicy], lead: Callable[[Any, Any], dict[str, Any]],
             out: str, after_follow: Callable[[dict[str, DreamZeroPolicy]], dict[str, Any]] | None = None) -> int:
    """Run as the rank the environment names (as torchrun sets it) on a CPU gloo group.

    Both ranks build one policy per split first (``build(split, name)``: a build meets the other
    rank's in a collective). Rank 0 returns ``lead(policy, drive)`` for each split, ``drive``
    wrapping the policy in ``Mirrored`` (every state-changing call sent to rank 1 first, over the
    rendezvous's store), then stops the group; rank 1 ``follow``s until then, and returns
    ``after_follow(policies)``. Each rank saves what it returned, split by split, to
    ``OUT/rank<R>.pt`` (rank 1 nothing without ``after_follow``)."""
    import torch.distributed as dist

    from models.world.parallel.cfg import CfgSplit
    from models.world.parallel.ulysses import Ulysses
    from realtime.engine import Mirrored, follow, init_group

    torch.set_num_threads(1)
    group = init_group("cpu")
    try:
        policies = {"heads": build(Ulysses.from_default_group(), "heads"),
                    "cfg": build(CfgSplit.from_default_group(), "cfg")}
        if group.rank == 0:
            result: dict[str, Any] | None = {
                how: lead(policies[how], lambda policy: Mirrored(policy, group)) for how in SPLITS}
            group.stop()
        else:
            follow(group, policies)
            result = after_follow(policies) if after_follow is not None else None
        if result is not None:
            torch.save(result, Path(out) / f"rank{group.rank}.pt")
    finally:
        dist.destroy_process_group()
    return 0
