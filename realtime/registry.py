"""Builds the model adapters a server runs, from the config.

A model that cannot load (the TTS extra not installed, maze weights missing) is
listed as unavailable with its reason instead of stopping the server.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from models.base import ModelAdapter
from realtime.config import ServerConfig

log = logging.getLogger(__name__)


@dataclass
class Inventory:
    adapters: dict[str, ModelAdapter] = field(default_factory=dict)
    unavailable: dict[str, dict[str, Any]] = field(default_factory=dict)

    def names(self, kind: str) -> list[str]:
        return [n for n, a in self.adapters.items() if a.kind == kind]

    def skip(self, name: str, kind: str, reason: str) -> None:
        log.warning("model %s (%s) unavailable: %s", name, kind, reason)
        self.unavailable[name] = {"name": name, "kind": kind, "available": False, "reason": reason}


def build_inventory(config: ServerConfig) -> Inventory:
    inv = Inventory()
    _add_worlds(inv, config)
    _add_policy(inv, config)
    _add_tts(inv, config)
    return inv


def _add_worlds(inv: Inventory, config: ServerConfig) -> None:
    world, device = config.world, config.engine.device
    for name in world.models:
        try:
            if name == "tiny":
                from models.world.tiny import TinyWorld

                adapter: ModelAdapter = TinyWorld(
                    frames_per_chunk=world.frames_per_chunk, max_batch=world.max_batch, device=device
                )
            elif name == "maze":
                from models.world.maze.adapter import MazeWorld

                kwargs: dict[str, Any] = {"device": device, "frames_per_chunk": world.frames_per_chunk,
                                          "max_batch": world.max_batch}
                if world.steps is not None:
                    kwargs["steps"] = world.steps
                adapter = MazeWorld(**kwargs)
            else:
                inv.skip(name, "world", f"unknown world model {name!r}")
                continue
        except (ImportError, FileNotFoundError, OSError) as exc:
            inv.skip(name, "world", f"{type(exc).__name__}: {exc}")
            continue
        inv.adapters[adapter.name] = adapter
    if not inv.names("world"):
        from models.world.tiny import TinyWorld

        log.warning("no world model loaded; falling back to the tiny random-weight world")
        fallback = TinyWorld(frames_per_chunk=world.frames_per_chunk, max_batch=world.max_batch, device=device)
        inv.adapters[fallback.name] = fallback


def _add_policy(inv: Inventory, config: ServerConfig) -> None:
    spec = config.policy.policy
    if not spec:
        return
    try:
        from models.policy import build_policy
    except ImportError as exc:
        inv.skip("policy", "policy", f"{type(exc).__name__}: {exc}")
        return
    try:
        adapter = build_policy(spec, device=config.engine.device, max_batch=config.policy.max_batch)
    except (ImportError, AttributeError, ValueError, TypeError) as exc:
        raise SystemExit(f"cannot load policy {spec!r}: {exc}") from exc
    inv.adapters[adapter.name] = adapter


def _add_tts(inv: Inventory, config: ServerConfig) -> None:
    if not config.tts.enabled:
        return
    try:
        from models.tts.adapter import PiperTTS
    except ImportError as exc:
        inv.skip("piper-joe-medium", "tts", f"{type(exc).__name__}: {exc}")
        return
    try:
        kwargs = {} if config.tts.max_batch is None else {"max_batch": config.tts.max_batch}
        adapter = PiperTTS.load(device=config.engine.device, **kwargs)
    except Exception as exc:  # noqa: BLE001 - TTSUnavailable and friends: serve without TTS
        inv.skip("piper-joe-medium", "tts", f"TTS unavailable: {exc}")
        return
    inv.adapters[adapter.name] = adapter
