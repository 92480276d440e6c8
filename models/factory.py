"""The factory table: how a model name on the command line becomes an adapter.

Every model the server can run is one row of ``FACTORIES``: its name (what
``--models`` and ``--policy`` take), its kind ("world", "policy", "tts") and the
``"module.path:function"`` that builds it. The module is imported only when the
model is asked for, so a server without the ``tts`` extra (or without torch for a
model it does not load) still starts. Adding a model is a package plus one row.

A factory is ``build(path: str | None, options: BuildOptions) -> ModelAdapter``.
``path`` is what followed ``=`` in the entry (``lingbot=/ckpt``: a checkpoint, a
weights file, a cache folder; each factory documents its own), or None. A model in
``TAKES_OPTIONS`` also takes options of its own after the path, as a URL query
(``'lingbot=/ckpt?steps=2&fp8=ffn'``, quoted for the shell): they reach its factory
as ``BuildOptions.model_options``, and the factory refuses one it does not know.

A factory raises ``ModelUnavailable`` when something the model needs is missing
(an extra not installed, weights not found): the server then lists the model as
unavailable with the reason and serves the rest. Any other problem with an entry
(an unknown name, a malformed entry, a user policy that does not import) is a
``FactoryError``, which the CLI prints as one line.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol

from models.base import ModelAdapter

log = logging.getLogger(__name__)

KINDS: tuple[str, ...] = ("world", "policy", "tts")

# name -> (kind, "module.path:function"). Keep the module paths stable: bench scripts
# and user configs name these models.
FACTORIES: dict[str, tuple[str, str]] = {
    "maze": ("world", "models.world.maze.adapter:build"),
    "maze-sim": ("world", "models.maze.sim_world:build"),
    "tiny": ("world", "models.world.tiny:build"),
    "cfg-tiny": ("world", "models.world.cfg.adapter:build"),
    "lingbot": ("world", "models.world.lingbot:build"),
    "matrix-game": ("world", "models.world.matrix_game:build"),
    "flow": ("policy", "models.policy.flow:build"),
    "dummy": ("policy", "models.policy.dummy:build"),
    "maze-policy": ("policy", "models.policy.maze:build"),
    "pi0": ("policy", "models.policy.pi0:build"),
    "dreamzero": ("policy", "models.policy.dreamzero:build"),
    "piper-joe-medium": ("tts", "models.tts.piper:build"),
}

# Models whose entries take ``?key=value&...`` options after the path (each factory
# documents its own; lingbot: models/world/lingbot/options.py). Others refuse any.
TAKES_OPTIONS: frozenset[str] = frozenset({"lingbot", "maze-sim", "dreamzero", "matrix-game"})
# name -> "module.path:function" that checks an entry's options without loading anything
# (a ValueError names the bad one): ``validate`` runs it before a server starts to load.
OPTION_CHECKS: dict[str, str] = {"lingbot": "models.world.lingbot.options:parse_options",
                                  "maze-sim": "models.maze.sim_world:parse_options",
                                  "dreamzero": "models.policy.dreamzero.options:parse_options",
                                  "matrix-game": "models.world.matrix_game.options:parse_options"}

# The worlds served by default, in order (the first is a session's default world).
# maze-sim (the simulator the maze world learned) is what the page's robot panel drives.
DEFAULT_WORLDS: tuple[str, ...] = ("maze", "maze-sim", "tiny")
# What a kind gets when the command line does not name one of its models
# (``--policy default``; the voice unless ``--no-tts``).
DEFAULTS: dict[str, str] = {"policy": "maze-policy", "tts": "piper-joe-medium"}
# The world served when none of the requested ones loads (it needs no weights).
FALLBACK_WORLD = "tiny"


# The number formats a CPU model may pick between (models.cpu_format), by name: the values of
# BuildOptions.cpu_format and ``realtime serve --cpu-format`` (this module imports no torch).
CPU_FORMATS = ("float32", "bfloat16")


class Progress(Protocol):
    """How far a model's build has got, for the server's readiness and log: ``stage`` in a
    few words ("reading checkpoint"), and bytes ``done`` of ``total`` where a stage knows them."""

    def __call__(self, stage: str, done: int | None = None, total: int | None = None) -> None: ...


@dataclass(frozen=True)
class BuildOptions:
    """Server-wide facts a factory may use; a factory ignores what does not apply."""

    device: str = "cpu"
    max_batch: int | None = None  # None: the model's own default
    frames_per_chunk: int | None = None  # world models; None: the model's own
    steps: int | None = None  # denoising steps (world models that denoise)
    # A CPU model's number format by name (CPU_FORMATS) for models that pick
    # one; None: their pick (float32, or bfloat16 where this CPU is faster at it).
    cpu_format: str | None = None
    # World models size their KV pool from gpu_memory_fraction of the device's free memory
    # (kv.capacity.kv_budget); kv_budget_bytes replaces that with a fixed budget (any device).
    gpu_memory_fraction: float = 0.9
    kv_budget_bytes: int | None = None
    host_budget_bytes: int | None = None  # host memory for swapped-out sessions (None: the model's default)
    # World models with named camera trajectories: the trusted folder they are read from.
    trajectory_root: str | None = None
    # World frame size (models with a choice of resolution); None: the model's default.
    height: int | None = None
    width: int | None = None
    # The entry's own options (``name=path?key=value&...``), in order; set by ``build``.
    model_options: tuple[tuple[str, str], ...] = ()
    # Told each stage of the build (``build`` says "importing" and "building"; a factory that
    # reads a large checkpoint may say more); None: nobody asks.
    progress: Progress | None = None


@dataclass(frozen=True)
class ModelEntry:
    """One ``name``, ``name=path`` or ``name=path?key=value&...`` entry of ``--models``."""

    name: str
    path: str | None = None
    options: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        text = self.name if self.path is None else f"{self.name}={self.path}"
        return text + ("?" + "&".join(f"{k}={v}" for k, v in self.options) if self.options else "")


class FactoryError(Exception):
    """An entry that names no model, or a model that cannot be built as asked."""


class ModelUnavailable(FactoryError):
    """The model exists but cannot load here (missing extra, missing weights)."""


def parse_entry(text: str) -> ModelEntry:
    """``"maze"``, ``"lingbot=/path"``, ``"lingbot=/path?steps=2&fp8=ffn"`` or a model without a
    path with options, ``"maze-sim?size=480x832"`` -> ``ModelEntry`` (the name is not looked up;
    the options are checked by the model's factory)."""
    head, query_sep, query = text.strip().partition("?")
    name, sep, path = head.partition("=")
    name = name.strip()
    if not name or (sep and not path.strip()):
        raise FactoryError(f"model entry {text!r}: expected 'name' or 'name=path' "
                           "(with options: 'name=path?key=value&...')")
    options: list[tuple[str, str]] = []
    if query_sep:
        for item in query.split("&"):
            key, eq, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not key or not eq or not value:
                raise FactoryError(f"model entry {text!r}: option {item!r} is not key=value")
            if any(k == key for k, _ in options):
                raise FactoryError(f"model entry {text!r}: option {key!r} given twice")
            options.append((key, value))
    return ModelEntry(name, path.strip() if sep else None, tuple(options))


def parse_entries(text: str) -> tuple[ModelEntry, ...]:
    """A comma-separated ``--models`` value -> its entries, in order (empty items skipped)."""
    return tuple(parse_entry(item) for item in text.split(",") if item.strip())


def kind_of(name: str) -> str:
    """The kind of a table model; ``FactoryError`` for a name not in the table."""
    try:
        return FACTORIES[name][0]
    except KeyError:
        raise FactoryError(f"unknown model {name!r}; known: {', '.join(sorted(FACTORIES))}") from None


def validate(entry: ModelEntry | str, *, kind: str | None = None) -> ModelEntry:
    """What can be checked of an entry before anything loads (a server answers while models
    load, so an entry it could never build is refused first): the name, the kind (with
    ``kind``), whether it takes options, and the options (``OPTION_CHECKS``). ``FactoryError``
    as ``build`` would raise it; returns the parsed entry."""
    if isinstance(entry, str):
        entry = parse_entry(entry)
    model_kind = kind_of(entry.name)
    if kind is not None and model_kind != kind:
        raise FactoryError(f"model {entry.name!r} is a {model_kind} model, not a {kind} model")
    if entry.options and entry.name not in TAKES_OPTIONS:
        raise FactoryError(f"{entry}: model {entry.name!r} takes no options")
    if entry.name in OPTION_CHECKS:
        try:
            _load(OPTION_CHECKS[entry.name])(entry.options)
        except ValueError as exc:
            raise FactoryError(f"{entry}: {exc}") from exc
    return entry


def build(entry: ModelEntry | str, options: BuildOptions = BuildOptions(), *, kind: str | None = None) -> ModelAdapter:
    """Build the adapter of a table entry. With ``kind``, refuse a model of another kind."""
    entry = validate(entry, kind=kind)
    model_kind = kind_of(entry.name)
    if entry.options or options.model_options:
        options = replace(options, model_options=entry.options)
    progress = options.progress or _quiet
    try:
        progress("importing")
        factory = _load(FACTORIES[entry.name][1])
        progress("building")
        adapter = factory(entry.path, options)
    except ModelUnavailable:
        raise
    except (ImportError, FileNotFoundError) as exc:
        # A missing optional dependency or weights file: serve without this model.
        raise ModelUnavailable(f"{type(exc).__name__}: {exc}") from exc
    except ValueError as exc:
        # A checkpoint or option the model refuses (each says which file or field): one line.
        raise FactoryError(f"{entry}: {exc}") from exc
    if adapter.kind != model_kind:
        raise FactoryError(f"factory of {entry.name!r} built a {adapter.kind} model, the table says {model_kind}")
    log.info("built %s model %s as %r", model_kind, entry, adapter.name)
    return adapter


def _quiet(stage: str, done: int | None = None, total: int | None = None) -> None:
    pass


def build_policy(spec: str, options: BuildOptions = BuildOptions()) -> ModelAdapter:
    """``--policy``: ``default``, a table policy (``dummy``, ``pi0=/ckpt``), or a user
    policy ``package.module:factory`` (docs/policies.md). ``dummy:50`` is the old
    spelling of ``dummy=50``."""
    entry = policy_entry(spec)
    if entry is not None:
        return build(entry, options, kind="policy")
    from models.policy.user import load_user_policy

    try:
        return load_user_policy(spec, max_batch=options.max_batch)
    except (ImportError, AttributeError, ValueError, TypeError) as exc:
        raise FactoryError(f"cannot load policy {spec!r}: {exc}") from exc


def policy_entry(spec: str) -> ModelEntry | None:
    """The table entry a ``--policy`` spec names (checked by ``validate``), or None for a user
    policy ``module:factory``, which only its import can check."""
    if spec == "default":
        return validate(DEFAULTS["policy"], kind="policy")
    name, colon, rest = spec.partition(":")
    if colon and "=" not in spec:
        return validate(ModelEntry(name, rest or None), kind="policy") if name in FACTORIES else None
    return validate(spec, kind="policy")


def _load(target: str) -> Callable[..., Any]:
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)  # ImportError: the caller reports it
    return getattr(module, attr)
