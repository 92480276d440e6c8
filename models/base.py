"""The seam between the engine and every model.

The engine thread is the only caller of these methods. It groups ready work by
model, calls ``run_batch`` once per group, checks what comes back, and then tells
the adapter whether each session's tick was committed (``end_tick``). An adapter
keeps whatever per-session state it needs (attention KV, decoder context) keyed by
``session_id`` and drops it in ``release``.

Everything that crosses this seam is a frozen dataclass or a numpy array, so the
asyncio side never touches a tensor.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Mapping, Sequence, TypeVar

import numpy as np

# Key names of the keys.v1 control schema, in action-bit order.
ACTION_KEYS: tuple[str, ...] = ("w", "a", "s", "d", "i", "j", "k", "l")


class ModelError(Exception):
    """A failure confined to the sessions of one batch: the engine fails those
    sessions and keeps serving everyone else."""


class EngineDeadError(Exception):
    """A failure that leaves the engine unable to run anything (a dead CUDA
    context, say). The engine turns unhealthy and fails every session fast."""


@dataclass(frozen=True)
class WorldGeometry:
    """What a world model declares about its output and its attention cache."""

    height: int
    width: int
    frames_per_chunk: int
    fps: float
    # Attention-cache geometry, used by kv/ capacity planning.
    num_layers: int
    kv_heads: int
    head_dim: int
    tokens_per_frame: int
    sink_frames: int
    window_frames: int
    dtype_bytes: int = 4


@dataclass(frozen=True)
class WorldTick:
    """One session's tick as the model sees it."""

    session_id: str
    request_id: str
    chunk_index: int
    applied_event_ids: tuple[int, ...]
    prompt: str | None
    # One entry per generated frame: the keys held during that frame.
    actions: tuple[frozenset[str], ...]
    seed: int = 0


@dataclass(frozen=True)
class WorldChunk:
    """What the model returns for one tick: the echoed identities and the frames."""

    session_id: str
    request_id: str
    chunk_index: int
    applied_event_ids: tuple[int, ...]
    frames: np.ndarray = field(repr=False)  # [F, H, W, 3] uint8


W = TypeVar("W")
R = TypeVar("R")


class ModelAdapter(abc.ABC, Generic[W, R]):
    """A model the engine drives. ``kind`` is "world", "policy" or "tts"."""

    kind: str
    name: str
    # The most work items run_batch takes at once; 1 means no batching.
    max_batch: int = 1

    @abc.abstractmethod
    def describe(self) -> Mapping[str, Any]:
        """Plain-JSON facts for ``GET /v1/models``."""

    @abc.abstractmethod
    def run_batch(self, works: Sequence[W]) -> list[R]:
        """Run one forward for ``works`` (distinct sessions), one result each, in order."""

    def end_tick(self, session_id: str, committed: bool) -> None:
        """Keep (``committed``) or drop the state the last tick of ``session_id`` wrote."""

    def release(self, session_id: str) -> None:
        """Forget every piece of state kept for ``session_id``. Idempotent."""

    def set_drop_listener(self, listener: Callable[[str, str], None]) -> None:
        """The server calls this once. An adapter that drops a session's state on its
        own (LRU eviction) calls ``listener(session_id, reason)`` on the engine thread,
        and must then refuse that session's ticks until it is reset (chunk 0) or
        released, so that no world restarts silently. Adapters that never drop ignore it."""
