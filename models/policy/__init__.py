"""Robot policies behind one small interface (see ``models/policy/base.py``).

``models.factory.build_policy(spec, options)`` turns a ``--policy`` spec into an
adapter (``docs/policies.md``).
"""

from __future__ import annotations

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
    "load_user_policy",
]

