"""Builds the model adapters a server runs, from the config, through ``models.factory``.

No model is named here: every entry goes through the factory table. ``plan`` checks
every entry first (``factory.validate``: a name, kind or option the table refuses is a
``FactoryError`` before anything loads) and returns the builds in order; ``load`` runs
them, reporting each model's ``ModelLoad`` (state, stage, bytes read) as it goes. A model
that cannot load (``ModelUnavailable``: the TTS extra not installed, weights missing) is
listed as unavailable with its reason instead of stopping the server; any other
``FactoryError`` (a checkpoint the model refuses, a user policy that does not import)
propagates for the CLI to print.

``realtime serve`` loads in the background (realtime/server/loading.py) so the server
answers while it does; ``build_inventory`` is the same load, waited for.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, TypeVar

from models import factory
from models.base import ModelAdapter
from models.factory import BuildOptions, ModelUnavailable
from realtime.server.config import ServerConfig

log = logging.getLogger(__name__)

T = TypeVar("T")


class ModelState(enum.Enum):
    """A requested model's state in ``/v1/models`` and ``/healthz``."""

    LOADING = "loading"  # queued, being built, or built and waiting for the others
    READY = "ready"  # sessions are served
    UNAVAILABLE = "unavailable"  # it cannot load here (the reason says why)


@dataclass(frozen=True)
class ModelLoad:
    """One requested model while models load: replaced whole at each change, so a reader on
    another thread sees one consistent record."""

    name: str
    kind: str
    state: ModelState = ModelState.LOADING
    stage: str = "queued"
    done_bytes: int | None = None  # of the stage, where it reads a known amount
    total_bytes: int | None = None
    started: float | None = None  # time.monotonic() when its build began
    built: float | None = None  # ... and when it ended
    reason: str | None = None  # unavailable: why

    @property
    def building(self) -> bool:
        return self.state is ModelState.LOADING and self.started is not None and self.built is None

    def seconds(self, now: float) -> float:
        """How long its build took, or has taken so far."""
        return 0.0 if self.started is None else (self.built or now) - self.started

    def describe(self, now: float) -> str:
        """``reading checkpoint, 1.2 of 74.0 GB, 35 s`` (the log and ``/healthz``)."""
        parts = [self.stage]
        if self.done_bytes is not None:
            parts.append(_gb(self.done_bytes) + (f" of {_gb(self.total_bytes)}" if self.total_bytes else ""))
        if self.started is not None:
            parts.append(f"{self.seconds(now):.0f} s")
        return ", ".join(parts)

    def listing(self, now: float) -> dict[str, Any]:
        """The model's ``/v1/models`` entry while it is not served."""
        entry: dict[str, Any] = {"id": self.name, "name": self.name, "kind": self.kind, "available": False,
                                 "state": self.state.value}
        if self.state is ModelState.UNAVAILABLE:
            entry["reason"] = self.reason
        else:
            entry.update(stage=self.stage, done_bytes=self.done_bytes, total_bytes=self.total_bytes,
                         seconds=round(self.seconds(now), 1))
        return entry


# The stage of a model built while others still load.
BUILT = "built, waiting for the other models"


def _gb(n: int | None) -> str:
    return f"{(n or 0) / 1e9:.1f} GB"


@dataclass(frozen=True)
class Planned:
    """One model to build: the name and kind it is listed under while it loads, and its
    build, which takes the options' ``progress`` (``factory.Progress``)."""

    name: str
    kind: str
    build: Callable[[factory.Progress], ModelAdapter]


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
        self.unavailable[name] = {"name": name, "kind": kind, "available": False,
                                  "state": ModelState.UNAVAILABLE.value, "reason": reason}

    def listing(self) -> list[dict[str, Any]]:
        """``/v1/models``: the served models, then the unavailable ones. ``id`` as OpenAI-style
        model lists have it: the name a session's ``model`` field takes."""
        models = [{"id": name, **a.describe(), "available": True, "state": ModelState.READY.value}
                  for name, a in self.adapters.items()]
        return models + [{"id": name, **entry} for name, entry in self.unavailable.items()]


def plan(config: ServerConfig) -> tuple[list[Planned], Planned]:
    """The models ``config`` asks for in build order (worlds, the policy, the voice), every
    entry checked first, and the world served if none of the worlds loads."""
    device = config.engine.device
    world = config.world
    world_options = BuildOptions(device=device, max_batch=world.max_batch, frames_per_chunk=world.frames_per_chunk,
                                 steps=world.steps, gpu_memory_fraction=world.gpu_memory_fraction,
                                 kv_budget_bytes=world.kv_budget_bytes, host_budget_bytes=world.host_budget_bytes,
                                 trajectory_root=world.trajectory_root, cpu_format=config.engine.cpu_format)
    planned = [_planned(factory.validate(text, kind="world"), world_options) for text in world.models]
    if config.policy.policy:
        spec = config.policy.policy
        entry = factory.policy_entry(spec)
        options = BuildOptions(device=device, max_batch=config.policy.max_batch)
        # A user policy (module:factory) is listed under its spec until it is built.
        planned.append(Planned(entry.name if entry else spec, "policy",
                               lambda progress: factory.build_policy(spec, replace(options, progress=progress))))
    if config.tts.enabled:
        entry = factory.validate(config.tts.voice or factory.DEFAULTS["tts"], kind="tts")
        planned.append(_planned(entry, BuildOptions(device=device, max_batch=config.tts.max_batch,
                                                    cpu_format=config.engine.cpu_format)))
    return planned, _planned(factory.validate(factory.FALLBACK_WORLD, kind="world"), world_options)


def _planned(entry: factory.ModelEntry, options: BuildOptions) -> Planned:
    kind = factory.kind_of(entry.name)
    return Planned(entry.name, kind, lambda progress: factory.build(entry, replace(options, progress=progress),
                                                                     kind=kind))


def load(planned: list[Planned], fallback: Planned | None = None,
         report: Callable[[ModelLoad], None] = lambda _: None,
         stop: Callable[[], bool] = lambda: False) -> Inventory:
    """Build ``planned`` in order on this thread; ``fallback`` too if no world loaded.
    ``report`` gets every change of a model's ``ModelLoad`` (from this thread). ``stop`` is
    asked between models and at each stage a build reports (the server is shutting down:
    the build in progress ends there, what was built is closed, and the inventory returned
    is empty)."""
    for p in planned:
        report(ModelLoad(p.name, p.kind))
    inv = Inventory()
    try:
        for p in planned:
            if stop():
                break
            _load_one(inv, p, report, stop)
        if fallback is not None and not inv.names("world") and not stop():
            log.warning("no world model loaded; falling back to %r", fallback.name)
            report(ModelLoad(fallback.name, fallback.kind))
            _load_one(inv, fallback, report, stop)
    except LoadStopped:
        pass
    if stop():
        close_all(inv)
        return Inventory()
    return inv


class LoadStopped(Exception):
    """Raised out of a build's progress report once the load is to stop."""


def _load_one(inv: Inventory, p: Planned, report: Callable[[ModelLoad], None], stop: Callable[[], bool]) -> None:
    current = ModelLoad(p.name, p.kind, started=time.monotonic())

    def progress(stage: str, done: int | None = None, total: int | None = None) -> None:
        nonlocal current
        if stop():
            raise LoadStopped(p.name)
        current = replace(current, stage=stage, done_bytes=done, total_bytes=total)
        report(current)

    try:
        adapter = p.build(progress)
    except ModelUnavailable as exc:
        inv.skip(p.name, p.kind, str(exc))
        report(replace(current, state=ModelState.UNAVAILABLE, reason=str(exc)))
        return
    inv.add(adapter)
    # Still LOADING: its sessions are served once every model has loaded (app.py says why).
    current = replace(current, stage=BUILT, done_bytes=None, total_bytes=None, built=time.monotonic())
    report(current)


def close_all(inv: Inventory) -> None:
    for name, adapter in inv.adapters.items():
        try:
            adapter.close()
        except Exception as exc:  # noqa: BLE001 - the others still close
            log.warning("%s: close failed: %r", name, exc)


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
    thread = threading.Thread(target=target, name=LOADER_THREAD, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)  # in slices, so the main thread still takes KeyboardInterrupt
    if error:
        raise error[0]
    return result[0]


LOADER_THREAD = "model-loader"


def _build_inventory(config: ServerConfig) -> Inventory:
    return load(*plan(config))
