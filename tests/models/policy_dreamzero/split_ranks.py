"""Robots at different window positions in one batch, on one process or on both ranks of a gloo group.

``python -m tests.models.policy_dreamzero.split_ranks CHECKPOINT TOKENIZER OUT`` runs ``scenario`` as
the rank the environment names (as torchrun sets it) on two policies, one per split (``heads``:
Ulysses, ``cfg``: the CFG split; ``tests.parallel.dreamzero_splits``), driven the way the server drives them: rank 0 through
``Mirrored``, rank 1 ``follow``s. Rank 0 saves each split's actions to ``OUT/rank0.pt``.

The scenario: three robots started one call apart, every engine call one batch; at TINY's
2-call window, x and z restart while y goes on, then the other way round, so each batch
mixes restarting and continuing robots at different window positions::

    engine call   0      1       2          3
    x             0 r    1       2 r        3
    y                    0 r     1          2 r
    z                            0 r        1
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from models.policy.base import PolicyWork
from models.policy.dreamzero.adapter import DreamZeroPolicy
from tests.models.policy_dreamzero.test_adapter import observation
from tests.parallel.dreamzero_splits import load_policy, on_ranks

SEEDS = {"x": 7, "y": 8, "z": 9}
CALLS = 4


def policy_of(checkpoint: str, tokenizer: str, split: Any = None, name: str = "dreamzero") -> DreamZeroPolicy:
    return load_policy(checkpoint, tokenizer, len(SEEDS), split, name)


def scenario(adapter: Any) -> dict[str, list[torch.Tensor]]:
    """Each robot's actions, call by call."""
    out: dict[str, list[torch.Tensor]] = {sid: [] for sid in SEEDS}
    for i in range(CALLS):
        works = [PolicyWork(sid, f"{sid}:{i - k}", observation(seed, i - k))
                 for k, (sid, seed) in enumerate(SEEDS.items()) if i - k >= 0]
        for w, r in zip(works, adapter.run_batch(works)):
            adapter.end_tick(w.session_id, True)
            out[w.session_id].append(torch.from_numpy(r.actions.copy()))
    return out


def main(checkpoint: str, tokenizer: str, out: str) -> int:
    return on_ranks(lambda split, name: policy_of(checkpoint, tokenizer, split, name),
                    lambda policy, drive: scenario(drive(policy)), out)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
