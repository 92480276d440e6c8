"""A user's own policy, given as ``module:factory`` on the command line.

The factory (any callable, a class included) returns an object shaped like
openpi's ``BasePolicy``:

* ``metadata``: a dict (or ``PolicyMetadata``) with at least ``action_horizon``,
  ``action_dim``, ``image_keys``, ``image_resolution`` and ``state_dim``;
* ``infer(obs: dict) -> dict`` with ``"actions"`` ``[action_horizon, action_dim]``;
* optionally ``infer_batch(list[dict]) -> list[dict]``: one forward for many robots;
* optionally ``reset()`` or ``reset(session_id)``.

``obs`` is the dict the robot sent, validated: its arrays are read-only (copy
before mutating) and the state is float32. Extra keys a policy returns besides
``actions`` are sent to the robot with the reply.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Any, Mapping, Sequence

from models.policy.base import PolicyAdapter, PolicyWork
from protocols.openpi import PolicyMetadata

log = logging.getLogger(__name__)

# Robots per forward when the user policy has ``infer_batch``.
DEFAULT_USER_MAX_BATCH = 32


class UserPolicyAdapter(PolicyAdapter):
    """Drives an openpi-style policy object from the engine thread."""

    def __init__(self, policy: Any, *, name: str = "user", max_batch: int | None = None) -> None:
        meta = policy.metadata
        if callable(meta) and not isinstance(meta, Mapping):
            meta = meta()
        self.metadata = meta if isinstance(meta, PolicyMetadata) else PolicyMetadata.from_mapping(meta)
        if not callable(getattr(policy, "infer", None)) and not callable(getattr(policy, "infer_batch", None)):
            raise TypeError(f"user policy {name} has neither infer(obs) nor infer_batch(list_of_obs)")
        self.policy = policy
        self.name = name
        self._batched = callable(getattr(policy, "infer_batch", None))
        # Without infer_batch a "batch" would only be a loop that makes each robot wait
        # for the others: take one robot at a time whatever the configured cap.
        self.max_batch = (max_batch or DEFAULT_USER_MAX_BATCH) if self._batched else 1
        reset = getattr(policy, "reset", None)
        self._reset = reset if callable(reset) else None
        self._reset_takes_session = self._reset is not None and _takes_an_argument(self._reset)

    def infer_batch(self, works: Sequence[PolicyWork]) -> list[Mapping[str, Any]]:
        obs = [w.observation.as_dict(self.metadata) for w in works]
        if self._batched:
            return list(self.policy.infer_batch(obs))
        return [self.policy.infer(o) for o in obs]

    def reset(self, session_id: str) -> None:
        if self._reset is None:
            return
        # openpi's BasePolicy.reset() takes no argument and resets the whole policy.
        if self._reset_takes_session:
            self._reset(session_id)
        else:
            self._reset()


def load_user_policy(spec: str, *, max_batch: int | None = None, **kwargs: Any) -> UserPolicyAdapter:
    """Import ``module:factory``, call ``factory(**kwargs)`` and wrap what it returns."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"a user policy is 'module:factory', got {spec!r}")
    module = importlib.import_module(module_name)
    factory: Any = module
    for part in attr.split("."):
        try:
            factory = getattr(factory, part)
        except AttributeError:
            raise ValueError(f"{module_name} has no attribute {attr!r}") from None
    if not callable(factory):
        raise ValueError(f"{spec} is not callable")
    policy = factory(**kwargs)
    adapter = UserPolicyAdapter(policy, name=spec, max_batch=max_batch)
    log.info("loaded user policy %s (max_batch %d, metadata %s)", spec, adapter.max_batch, adapter.metadata.to_wire())
    return adapter


def _takes_an_argument(fn: Any) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)
