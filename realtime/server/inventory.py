"""Builds the model adapters a server runs, from the config, through ``models.factory``.

No model is named here: every entry goes through the factory table. A model that
cannot load (``ModelUnavailable``: the TTS extra not installed, weights missing)
is listed as unavailable with its reason instead of stopping the server; any other
``FactoryError`` (an unknown name, a user policy that does not import) propagates
for the CLI to print.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from models import factory
from models.base import ModelAdapter
from models.factory import BuildOptions, ModelEntry, ModelUnavailable
from realtime.server.config import ServerConfig

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class Inventory:
    adapters: dict[str, ModelAdapter] = field(default_factory=dict)
    unavailable: dict[str, dict[str, Any]] = field(default_factory=dict)

    def names(self, kind: str) -> list[str]:
        return [n for n, a in self.adapters.items() if a.kind == kind]

    def add(self, adapter: ModelAdapter) -> None:
        self.adapters[adapter.name] = adapter

    def skip(self, name: str, kind: str, reason: str) -> None:
        log.warning("model %s (%s) unavailable: %s", name, kind, reason)
        self.unavailable[name] = {"name": name, "kind": kind, "available": False, "reason": reason}


def build_inventory(config: ServerConfig) -> Inventory:
    """Every model the config asks for, built in order: worlds, the policy, the voice,
    on a thread of its own that ends when they are built (``on_spent_thread``)."""
    return on_spent_thread(_build_inventory, config)


def on_spent_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a new thread that exits when it returns; its result or exception.

    Why: torch's OpenMP runtime (libgomp) keeps a worker team per thread that ever ran a
    parallel op, for the thread's life. Models loaded on the main thread would leave its
    team behind, so once the engine thread made its own, libgomp would manage more threads
    than there are cores and cut its spin-wait to 100 iterations whatever
    ``GOMP_SPINCOUNT`` says: the engine's worker would sleep and be woken by a futex at
    nearly every parallel op, thousands of times per served sentence
    (``python -m bench.tts.bench_served`` records the voluntary context switches per utterance).
    A thread that exits frees its team, so the engine's is the only one and the spin count
    is the operator's to choose (``realtime.server.cli.openmp_defaults``), as it is in a
    single-threaded benchmark such as bench/tts/bench_tts.py.
    """
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            error.append(exc)

    # Daemon: Ctrl-C while models load interrupts the join below and the process exits.
    thread = threading.Thread(target=target, name="model-loader", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)  # in slices, so the main thread still takes KeyboardInterrupt
    if error:
        raise error[0]
    return result[0]


def _build_inventory(config: ServerConfig) -> Inventory:
    inv = Inventory()
    device = config.engine.device
    world = config.world
    world_options = BuildOptions(device=device, max_batch=world.max_batch, frames_per_chunk=world.frames_per_chunk,
                                 steps=world.steps, gpu_memory_fraction=world.gpu_memory_fraction,
                                 kv_budget_bytes=world.kv_budget_bytes, host_budget_bytes=world.host_budget_bytes,
                                 trajectory_root=world.trajectory_root, cpu_format=config.engine.cpu_format)
    for text in world.models:
        _try(inv, factory.parse_entry(text), world_options, "world")
    if not inv.names("world"):
        log.warning("no world model loaded; falling back to %r", factory.FALLBACK_WORLD)
        inv.add(factory.build(factory.FALLBACK_WORLD, world_options, kind="world"))
    if config.policy.policy:
        options = BuildOptions(device=device, max_batch=config.policy.max_batch)
        try:
            inv.add(factory.build_policy(config.policy.policy, options))
        except ModelUnavailable as exc:
            inv.skip(config.policy.policy, "policy", str(exc))
    if config.tts.enabled:
        entry = factory.parse_entry(config.tts.voice or factory.DEFAULTS["tts"])
        options = BuildOptions(device=device, max_batch=config.tts.max_batch, cpu_format=config.engine.cpu_format)
        _try(inv, entry, options, "tts")
    return inv


def _try(inv: Inventory, entry: ModelEntry, options: BuildOptions, kind: str) -> None:
    try:
        inv.add(factory.build(entry, options, kind=kind))
    except ModelUnavailable as exc:
        inv.skip(entry.name, kind, str(exc))
