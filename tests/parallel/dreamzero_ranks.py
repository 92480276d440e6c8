"""One DreamZero scenario run on one process or on both ranks of a gloo group, for the equality tests.

``python -m tests.parallel.dreamzero_ranks CHECKPOINT TOKENIZER OUT`` runs it as the rank the
environment names (as torchrun sets it) on two policies, one per split (``heads``: Ulysses,
``cfg``: the CFG split; one checkpoint load, one group, since a start costs more than the
calls on the 2-core CI machine; a second load of the tiny checkpoint is 0.1 s), the way the server does: rank 0 drives each policy through
``Mirrored`` (every state-changing call sent to rank 1 first, over the rendezvous's store),
rank 1 ``follow``s. Each rank saves what it recorded to ``OUT/rank<R>.pt``, split by split;
``scenario`` runs it in the calling process.

The scenario, on a pool of one resident session and a host budget of one more (the tiny
window restarts every other call)::

    a: calls 0 1 2 (2 restarts the window)      b: call 0 (a swapped out)
    a: call 3 (swapped in, b out)               b: detached (its robot went away)
    c: call 0 (no room: b is reclaimed)         b: call 1 refused (reclaimed), then reset
    a: reset, call 0 again                      a, c: dropped
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from kv import session_bytes
from models.base import ModelError
from models.policy.base import PolicyWork
from models.policy.dreamzero.adapter import DreamZeroPolicy
from models.policy.dreamzero.checkpoint import load_checkpoint
from tests.models.policy_dreamzero.test_adapter import observation

SPLITS = ("heads", "cfg")


def policy_of(checkpoint: str, tokenizer: str, split: Any = None, name: str = "dreamzero") -> DreamZeroPolicy:
    """The scenario's policy: one resident session, room on the host for one more."""
    from transformers import T5TokenizerFast

    tok = T5TokenizerFast.from_pretrained(tokenizer, local_files_only=True)
    policy = DreamZeroPolicy(load_checkpoint(checkpoint), tok, sessions=1, split=split, name=name)
    policy.residency.host_budget_bytes = session_bytes(policy.geometry)
    return policy


def scenario(policy: DreamZeroPolicy, drive: Any = None) -> dict[str, Any]:
    """Run the scenario on ``policy`` (through ``drive(policy)``, the adapter the calls go to:
    rank 0's ``Mirrored``); the actions of each call, this rank's K/V pages after a's first call,
    errors and drops, the residency counters."""
    adapter = policy if drive is None else drive(policy)
    dropped: list[tuple[str, str]] = []
    policy.set_drop_listener(lambda sid, why: dropped.append((sid, why)))
    out: dict[str, Any] = {"actions": [], "errors": []}

    def call(sid: str, seed: int, i: int) -> None:
        work = PolicyWork(sid, f"{sid}:{i}", observation(seed, i))
        try:
            [result] = adapter.run_batch([work])
        except ModelError as exc:
            adapter.end_tick(sid, False)
            out["errors"].append((sid, str(exc).split(":")[0]))
            return
        adapter.end_tick(sid, True)
        out["actions"].append(torch.from_numpy(result.actions.copy()))

    for i in range(3):
        call("a", 1, i)
        if i == 0:
            storage = policy.cache.storage
            out["pages_k"], out["pages_v"] = storage.k[1].clone(), storage.v[0].clone()
    call("b", 2, 0)
    call("a", 1, 3)
    adapter.detach("b")
    call("c", 3, 0)
    call("b", 2, 1)
    adapter.reset("b")
    adapter.reset("a")
    call("a", 1, 0)
    m = policy.residency.metrics()
    out.update(swaps=(m["swap_outs"], m["swap_ins"]), resident=policy.resident, swapped=policy.swapped,
               dropped=[(sid, why.split(":")[0]) for sid, why in dropped])
    adapter.drop_session("a")
    adapter.drop_session("c")
    out.update(sessions=sorted(policy._sessions), free_blocks=policy.residency.metrics()["free_blocks"],
               total_blocks=m["total_blocks"], describe=dict(policy.describe()))
    return out


def main(checkpoint: str, tokenizer: str, out: str) -> int:
    import torch.distributed as dist

    from models.world.parallel.cfg import CfgSplit
    from models.world.parallel.ulysses import Ulysses
    from realtime.engine import Mirrored, follow, init_group

    torch.set_num_threads(1)
    group = init_group("cpu")
    try:
        # Both ranks build both policies first: a build meets the other rank's in a collective.
        policies = {"heads": policy_of(checkpoint, tokenizer, Ulysses.from_default_group(), "heads"),
                    "cfg": policy_of(checkpoint, tokenizer, CfgSplit.from_default_group(), "cfg")}
        if group.rank == 0:
            result = {how: scenario(policies[how], drive=lambda policy: Mirrored(policy, group)) for how in SPLITS}
            group.stop()
        else:
            follow(group, policies)
            result = {}
            for how, policy in policies.items():
                m = policy.residency.metrics()
                result[how] = {"sessions": sorted(policy._sessions), "free_blocks": m["free_blocks"],
                               "total_blocks": m["total_blocks"], "swaps": (m["swap_outs"], m["swap_ins"])}
        torch.save(result, Path(out) / f"rank{group.rank}.pt")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
