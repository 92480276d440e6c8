"""A policy that answers zeros after a fixed delay: the benchmark baseline.

It mirrors the reference probe's ``DummyPolicy`` (``actions`` zeros 50x32 float32,
optionally sleeping ``infer_ms`` per call), except that one call serves a whole
batch: the sleep stands for a GPU forward whose time does not grow with the batch.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import numpy as np

from models.policy.base import PolicyAdapter, PolicyWork
from models.factory import BuildOptions, FactoryError
from protocols.openpi import PolicyMetadata

# The observation of the OpenPI benchmarks (DROID-style: three 224x224 cameras, a 32-float state).
PROBE_METADATA = PolicyMetadata(
    action_horizon=50,
    action_dim=32,
    image_keys=(
        "observation/exterior_image_1_left",
        "observation/exterior_image_2_left",
        "observation/wrist_image_left",
    ),
    image_resolution=(224, 224),
    state_dim=32,
    state_key="observation/state",
)


class DummyPolicy(PolicyAdapter):
    """Zeros ``[action_horizon, action_dim]`` after sleeping ``infer_ms`` once per batch."""

    def __init__(
        self,
        *,
        metadata: PolicyMetadata = PROBE_METADATA,
        infer_ms: float = 0.0,
        max_batch: int = 32,
        name: str = "dummy-policy",
    ) -> None:
        self.metadata = metadata
        self.name = name
        self.max_batch = max_batch
        self.infer_ms = float(infer_ms)
        self.calls = 0  # forwards run (engine thread only)
        self._actions = np.zeros(metadata.action_shape, np.float32)
        self._actions.flags.writeable = False

    def describe(self) -> Mapping[str, Any]:
        return {**super().describe(), "infer_ms": self.infer_ms}

    def infer_batch(self, works: Sequence[PolicyWork]) -> list[Mapping[str, Any]]:
        self.calls += 1
        if self.infer_ms > 0:
            time.sleep(self.infer_ms / 1000.0)
        return [{"actions": self._actions} for _ in works]


def build(path: str | None, options: BuildOptions) -> DummyPolicy:
    """Factory-table entry ``dummy``; ``path``: milliseconds per forward (``dummy=50``)."""
    try:
        infer_ms = float(path) if path else 0.0
    except ValueError:
        raise FactoryError(f"dummy takes milliseconds per forward (dummy=50), got {path!r}") from None
    return DummyPolicy(infer_ms=infer_ms, max_batch=options.max_batch or 32)
