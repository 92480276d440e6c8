"""One DreamZero scenario run on one process or on both ranks of a gloo group, for the equality tests.

``python -m tests.parallel.dreamzero_ranks CHECKPOINT TOKENIZER OUT`` runs it as the rank the
environment names (as torchrun sets it) on two policies, one per split (``heads``: Ulysses,
``cfg``: the CFG split; ``dreamzero_splits``; one checkpoint load, one group, since a start
costs more than the calls on the 2-core CI machine; a second load of the tiny checkpoint is 0.1 s), the way the server does: rank 0 drives each policy through
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
from typing import Any

import torch

from kv import session_bytes
from models.base import ModelError
from models.policy.base import PolicyWork
from models.policy.dreamzero.adapter import DreamZeroPolicy
from tests.models.policy_dreamzero.test_adapter import observation
from tests.parallel.dreamzero_splits import load_policy, on_ranks


def policy_of(checkpoint: str, tokenizer: str, split: Any = None, name: str = "dreamzero") -> DreamZeroPolicy:
    """The scenario's policy: one resident session, room on the host for one more."""
    policy = load_policy(checkpoint, tokenizer, 1, split, name)
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


def follower(policies: dict[str, DreamZeroPolicy]) -> dict[str, Any]:
    """Rank 1's sessions, pool and swaps after following rank 0, split by split."""
    result = {}
    for how, policy in policies.items():
        m = policy.residency.metrics()
        result[how] = {"sessions": sorted(policy._sessions), "free_blocks": m["free_blocks"],
                       "total_blocks": m["total_blocks"], "swaps": (m["swap_outs"], m["swap_ins"])}
    return result


def main(checkpoint: str, tokenizer: str, out: str) -> int:
    return on_ranks(lambda split, name: policy_of(checkpoint, tokenizer, split, name),
                    lambda policy, drive: scenario(policy, drive), out, follower)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
