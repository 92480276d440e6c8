"""Robot policies behind one small interface (see ``models/policy/base.py``).

``build_policy(spec)`` turns a command-line spec into an adapter:

* ``"flow"`` (or ``"default"``): the built-in flow-matching action model;
* ``"maze"`` or ``"maze:WEIGHTS"``: the trained maze navigation policy (``models/policy/maze``);
* ``"dummy"`` or ``"dummy:50"``: zeros after 50 ms per forward (benchmarks);
* ``"package.module:factory"``: a user policy (``docs/policies.md``).
"""

from __future__ import annotations

from typing import Any

from models.policy.base import PolicyAdapter, PolicyResult, PolicyWork, check_actions
from models.policy.dummy import PROBE_METADATA, DummyPolicy
from models.policy.user import UserPolicyAdapter, load_user_policy

__all__ = [
    "PROBE_METADATA",
    "DummyPolicy",
    "PolicyAdapter",
    "PolicyResult",
    "PolicyWork",
    "UserPolicyAdapter",
    "check_actions",
    "build_policy",
    "load_user_policy",
]


def build_policy(spec: str = "default", *, device: str = "cpu", max_batch: int | None = None, **kwargs: Any) -> PolicyAdapter:
    """Build the policy named by ``spec`` (see the module docstring)."""
    if spec in ("flow", "default"):
        # torch is imported only when the flow model is asked for.
        from models.policy.flow import FlowMatchingPolicy, FlowPolicyConfig

        cfg = FlowPolicyConfig(**kwargs)
        if max_batch is not None:
            cfg = FlowPolicyConfig(**{**kwargs, "max_batch": max_batch})
        return FlowMatchingPolicy(cfg, device=device)
    if spec == "maze" or spec.startswith("maze:"):
        from models.policy.maze.adapter import MazePolicy

        return MazePolicy(spec.partition(":")[2] or None, device=device, max_batch=max_batch or 64, **kwargs)
    if spec == "dummy" or spec.startswith("dummy:"):
        infer_ms = float(spec.partition(":")[2] or 0.0)
        return DummyPolicy(infer_ms=infer_ms, max_batch=max_batch or 32, **kwargs)
    return load_user_policy(spec, max_batch=max_batch, **kwargs)
