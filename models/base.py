"""The seam between the engine and every model.

The engine thread is the only caller of these methods. It groups ready work by
model, calls ``run_batch`` once per group, checks what comes back, and then tells
the adapter whether each session's tick was committed (``end_tick``). An adapter
keeps whatever per-session state it needs (attention KV, decoder context) keyed by
``session_id`` and drops it in ``drop_session``.

Everything that crosses this seam is a frozen dataclass or a numpy array, so the
asyncio side never touches a tensor.
"""

from __future__ import annotations

import abc
import sys
from typing import Any, Callable, Generic, Mapping, Sequence, TypeVar


class ModelError(Exception):
    """A failure confined to the sessions of one batch: the engine fails those
    sessions and keeps serving everyone else."""


class EngineDeadError(Exception):
    """A failure that leaves the engine unable to run anything (a dead CUDA
    context, say). The engine turns unhealthy and fails every session fast."""


def is_fatal(exc: BaseException) -> bool:
    """Whether ``exc`` leaves the engine unusable: an ``EngineDeadError``, or a CUDA
    error (torch raises ``torch.AcceleratorError`` for a failed kernel, a
    device-side assert, an illegal address: the context is gone for good). The one
    place CUDA errors are mapped; an out-of-memory error is not fatal."""
    if isinstance(exc, EngineDeadError):
        return True
    torch = sys.modules.get("torch")  # never imported here: a torch-free server has no CUDA errors
    fatal = getattr(torch, "AcceleratorError", None) if torch is not None else None
    return fatal is not None and isinstance(exc, fatal)


def failure_code(exc: BaseException) -> str:
    """A failed tick's cause as one of a few codes, for ``/metrics``: ``engine_dead``
    (``is_fatal``), ``out_of_memory`` (``torch.OutOfMemoryError``, also when an adapter
    re-raised it as a ``ModelError`` from it), ``model_error`` otherwise."""
    if is_fatal(exc):
        return "engine_dead"
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    seen: BaseException | None = exc
    while seen is not None:
        if oom is not None and isinstance(seen, oom):
            return "out_of_memory"
        seen = seen.__cause__
    return "model_error"


W = TypeVar("W")
R = TypeVar("R")


class ModelAdapter(abc.ABC, Generic[W, R]):
    """A model the engine drives. ``kind`` is "world", "policy" or "tts"."""

    kind: str
    name: str
    # The most work items run_batch takes at once; 1 means no batching.
    max_batch: int = 1
    # A forward that recently never took longer than this (seconds) may run on the
    # submitting thread when the engine is idle, instead of being handed to the engine
    # thread and back (realtime/engine/loop.py, "Inline forwards"). 0: always the engine thread.
    inline_forward_s: float = 0.0
    # A session's tick builds on its previous one (a world's KV): when one fails, the
    # session's ticks queued behind it are dropped before they run (realtime/engine/forward.py).
    chained_ticks: bool = False

    @abc.abstractmethod
    def describe(self) -> Mapping[str, Any]:
        """Plain-JSON facts for ``GET /v1/models``."""

    @abc.abstractmethod
    def run_batch(self, works: Sequence[W]) -> list[R]:
        """Run one forward for ``works`` (distinct sessions), one result each, in order."""

    def end_tick(self, session_id: str, committed: bool) -> None:
        """Keep (``committed``) or drop the state the last tick of ``session_id`` wrote."""

    def drop_session(self, session_id: str) -> None:
        """Drop every piece of state kept for ``session_id``. Idempotent."""

    def reset(self, session_id: str) -> None:
        """Start ``session_id`` over (default: the same as ``drop_session``)."""
        self.drop_session(session_id)

    def close(self) -> None:
        """Free what the model holds besides its tensors (a child process) at shutdown: the
        server calls it once, after the engine stopped (default: nothing)."""

    def set_drop_listener(self, listener: Callable[[str, str], None]) -> None:
        """The server calls this once. An adapter that drops a session's state on its
        own (LRU eviction) calls ``listener(session_id, reason)`` on the engine thread,
        and must then refuse that session's ticks until it is reset (chunk 0) or
        released, so that no world restarts silently. Adapters that never drop ignore it."""

    def set_launch_listener(self, listener: Callable[[], None]) -> None:
        """The engine calls this once. An adapter whose ``run_batch`` queues device work
        and then waits for it calls ``launched()`` (on the engine thread) as soon as the
        work is queued. Once it has, the server holds its bulk sends while the adapter's
        next batches are prepared, until their ``launched()``, so that they do not take
        the GIL from the preparation (realtime/engine/overlap.py). An adapter that never
        calls it (CPU work, which runs inside ``run_batch``) is never waited for."""
        self._launch_listener = listener

    def launched(self) -> None:
        """This batch's device work is queued (see ``set_launch_listener``); a no-op until
        the engine listens."""
        listener = getattr(self, "_launch_listener", None)
        if listener is not None:
            listener()
