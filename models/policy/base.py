"""The policy seam: what the engine hands a robot policy and what it gets back.

A policy adapter is a ``ModelAdapter`` of kind "policy" with three things to say:

* ``metadata``: the ``PolicyMetadata`` sent to every robot as the first frame and
  used to validate its observations;
* ``infer_batch(works)``: one forward for observations of distinct robots, one
  output map (at least ``"actions"``) each, in order;
* ``reset(session_id)`` (optional): forget one robot's state.

``run_batch`` (called by the engine thread) wraps ``infer_batch``: it times the
forward, checks every ``actions`` against the advertised shape and for finite
values, and echoes the identities, so a broken policy fails its batch with a
``ModelError`` instead of sending a robot garbage.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from models.base import ModelAdapter, ModelError
from protocols.openpi import Observation, PolicyMetadata, SamplingParams


@dataclass(frozen=True)
class PolicyWork:
    """One robot's request as the policy sees it."""

    session_id: str
    request_id: str
    observation: Observation
    sampling: SamplingParams = SamplingParams()


@dataclass(frozen=True)
class PolicyResult:
    """One robot's answer: the action chunk plus any extra reply keys."""

    session_id: str
    request_id: str
    actions: np.ndarray = field(repr=False)  # float32 [action_horizon, action_dim], read-only
    outputs: Mapping[str, Any] = field(default_factory=dict, repr=False)
    # Wall time of the forward that produced this result (shared by its whole batch).
    policy_ms: float = 0.0


class PolicyAdapter(ModelAdapter[PolicyWork, PolicyResult]):
    """Base of every robot policy the engine runs."""

    kind = "policy"
    metadata: PolicyMetadata
    # A policy that answers in well under a millisecond (a scripted or cached policy, a
    # small MLP on the CPU) is cheaper to run where the request was decoded than to hand
    # to the engine thread: the hand-off and back costs ~0.1 ms of CPU and two thread
    # wake-ups per call (bench/results/openpi_fleet.json). 0.5 ms is about what decoding
    # one observation costs the event loop anyway. GPU policies (tens of ms) never qualify.
    inline_forward_s = 0.0005

    @abc.abstractmethod
    def infer_batch(self, works: Sequence[PolicyWork]) -> list[Mapping[str, Any]]:
        """One forward for ``works`` (distinct sessions): one map with ``"actions"`` each."""

    def reset(self, session_id: str) -> None:
        """Forget what the policy keeps for ``session_id`` (default: same as ``drop_session``)."""
        self.drop_session(session_id)

    def detach(self, session_id: str) -> None:
        """No connection holds ``session_id`` any more (a stateful policy's explicit id, whose
        state outlives its connection): the policy keeps its state, and may reclaim it, least
        recently used first, when a new session needs the room. Its next call attaches it
        again. Default: nothing (a policy that keeps no room-bound state)."""

    def describe(self) -> Mapping[str, Any]:
        return {"kind": self.kind, "name": self.name, "max_batch": self.max_batch, "metadata": self.metadata.to_wire()}

    def run_batch(self, works: Sequence[PolicyWork]) -> list[PolicyResult]:
        started = time.perf_counter()
        outputs = self.infer_batch(works)
        policy_ms = (time.perf_counter() - started) * 1000.0
        if len(outputs) != len(works):
            raise ModelError(f"policy {self.name} returned {len(outputs)} outputs for {len(works)} observations")
        return [self._result(w, out, policy_ms) for w, out in zip(works, outputs)]

    def _result(self, work: PolicyWork, out: Mapping[str, Any], policy_ms: float) -> PolicyResult:
        # A dict needs no ABC check (isinstance against Mapping costs ~0.5 us a call).
        if (type(out) is not dict and not isinstance(out, Mapping)) or "actions" not in out:
            raise ModelError(f"policy {self.name} returned no 'actions' for session {work.session_id}")
        actions = check_actions(out["actions"], self.metadata, self.name)
        extra = {k: v for k, v in out.items() if k != "actions"} if len(out) > 1 else {}
        return PolicyResult(work.session_id, work.request_id, actions, extra, policy_ms)


_FLOAT32 = np.dtype(np.float32)


def check_actions(value: Any, metadata: PolicyMetadata, name: str) -> np.ndarray:
    """``value`` as a read-only float32 [horizon, dim] array, or a ``ModelError``."""
    if type(value) is np.ndarray and value.dtype is _FLOAT32:
        actions = value  # what np.asarray would return
    else:
        try:
            actions = np.asarray(value, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ModelError(f"policy {name} returned actions that are not numeric: {exc}") from None
    if actions.shape != metadata.action_shape:
        raise ModelError(f"policy {name} returned actions {list(actions.shape)}, advertised "
                         f"{list(metadata.action_shape)}")
    if not np.isfinite(actions).all():
        raise ModelError(f"policy {name} returned non-finite actions")
    if actions.flags.writeable:
        actions = actions.copy() if actions is value else actions
        actions.flags.writeable = False
    return actions
