"""Rank 0's calls on a sequence-parallel model, run again on every worker rank (group.py).

On rank 0 a sequence-parallel adapter (a world, or a policy such as DreamZero) is served as
``Mirrored(adapter, group)``: every call that changes the model's state (``MIRRORED``: a
forward, the end of a tick, a reset, a drop, an admission, a policy session's ``detach``) is
first sent to the workers, then run here. Each worker's ``follow`` loop runs the same call on
its own copy of the model, so every rank holds the same sessions in the same state, each with
its share of their K/V, and meets the others in the same forward's collectives. The ranks compute the same thing from the same inputs (a session's
noise is a function of its seed and position), so a worker's call fails exactly when rank
0's does; only rank 0's result is used.

What crosses: the call's arguments, pickled (a world's ticks, with their first image, less
their frame sinks: frames leave from rank 0 only; a policy's works, observations and all).
Everything else about the model (``describe``, ``tick``, ``geometry``, listeners) is rank 0's
own, reached through the wrapper.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Mapping

from models.base import ModelAdapter, is_fatal
from realtime.engine.group import EXIT_GROUP_FAILED, Group, GroupFailed, init_group, rank_device

log = logging.getLogger(__name__)

MIRRORED = ("run_batch", "end_tick", "drop_session", "reset", "admit", "detach")


def parallel(adapter: ModelAdapter) -> bool:
    """Whether ``adapter`` runs split over the group's ranks (it says so: ``sequence_parallel``
    > 1), so that its calls must be mirrored; any other model runs on rank 0 alone."""
    return getattr(adapter, "sequence_parallel", 1) > 1


def portable(work: Any) -> Any:
    """``work`` as it is sent to the workers: a dataclass's callables (a frame sink) left out."""
    if not dataclasses.is_dataclass(work) or isinstance(work, type):
        return work
    drop = {f.name: None for f in dataclasses.fields(work) if callable(getattr(work, f.name))}
    return dataclasses.replace(work, **drop) if drop else work


class Mirrored:
    """``adapter`` on rank 0, each state-changing call sent to the workers first."""

    def __init__(self, adapter: ModelAdapter, group: Group) -> None:
        object.__setattr__(self, "_adapter", adapter)
        object.__setattr__(self, "_group", group)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._adapter, name)
        if name not in MIRRORED:
            return attr

        def mirrored(*args: Any) -> Any:
            sent = [list(map(portable, a)) if isinstance(a, (list, tuple)) else
                    dict(a) if isinstance(a, Mapping) else a for a in args]
            self._group.send(("call", self._adapter.name, name, sent))
            return attr(*args)

        return mirrored

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._adapter, name, value)  # device_jpeg and the like are the model's own

    def close(self) -> None:
        self._adapter.close()


def follow(group: Group, adapters: Mapping[str, ModelAdapter]) -> int:
    """A worker rank: run rank 0's calls on ``adapters`` until it says stop (0) or the group
    fails (``GroupFailed``). A call that raises raised on rank 0 too and is not fatal here;
    a fatal one (a collective that failed, a dead device) ends the worker with it."""
    while True:
        command = group.receive()
        if command[0] == "stop":
            log.info("sequence parallel: rank %d stopping", group.rank)
            return 0
        _, model, method, args = command
        try:
            getattr(adapters[model], method)(*args)
        except Exception as exc:  # noqa: BLE001 - rank 0 got the same
            if is_fatal(exc):
                raise GroupFailed(f"rank {group.rank}: {model}.{method}: {exc!r}") from exc
            log.debug("rank %d: %s.%s raised %r (as rank 0's did)", group.rank, model, method, exc)


def serve_worker(device: str, build: Callable[[str], Mapping[str, ModelAdapter]]) -> int:
    """A worker rank's whole life: join the group, ``build`` the models on this rank's device
    (rank 0's worlds, in its order: a collective inside one build meets rank 0's), follow rank
    0's calls on the sequence-parallel ones. Returns the process's exit status."""
    group = init_group(device)
    adapters = build(rank_device(device))
    try:
        return follow(group, {name: a for name, a in adapters.items() if parallel(a)})
    except GroupFailed as exc:
        log.error("sequence parallel: rank %d: %s", group.rank, exc)
        return EXIT_GROUP_FAILED
    finally:
        for adapter in adapters.values():
            adapter.close()
