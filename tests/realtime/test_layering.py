"""realtime/ never imports a concrete model: only the kind bases and the factory table.

A new model is a package plus a row in ``models/factory.py``; if an endpoint or the
registry imported a model package, adding one would mean editing realtime/ again.
The endpoints use the engine through ``realtime.engine``'s exports only, and no module
under realtime/ grows past a few hundred lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

REALTIME = Path(__file__).resolve().parents[2] / "realtime"
ALLOWED = {"models", "models.base", "models.factory", "models.world.base", "models.tts.base", "models.policy.base"}


def imported_models(source: str) -> set[str]:
    """Every ``models...`` module a source file imports, at any depth (lazy imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "models")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "models":
            found.add(node.module)
            if node.module == "models":  # from models import factory -> models.factory
                found.update(f"models.{a.name}" for a in node.names)
    return found


def test_realtime_imports_only_kind_bases_and_the_factory():
    offenders = {}
    for path in sorted(REALTIME.rglob("*.py")):
        bad = imported_models(path.read_text()) - ALLOWED
        if bad:
            offenders[path.name] = sorted(bad)
    assert offenders == {}


def test_the_check_sees_every_import_form():
    source = ("import models.world.tiny\nfrom models.tts.piper.adapter import PiperTTS\nfrom models import factory, policy\n"
              "def f():\n    from models.world.maze.adapter import MazeWorld\n")
    assert imported_models(source) - ALLOWED == {
        "models.world.tiny", "models.tts.piper.adapter", "models.policy", "models.world.maze.adapter"}


def test_no_model_name_in_realtime():
    from models.factory import FACTORIES

    for path in sorted(REALTIME.rglob("*.py")):
        text = path.read_text()
        for name in FACTORIES:
            assert f'"{name}"' not in text and f"'{name}'" not in text, (path.name, name)


MAX_MODULE_LINES = 400


def test_no_module_in_realtime_is_over_400_lines():
    """One concept per module, a few hundred lines each (STYLE.md 1)."""
    sizes = {str(path.relative_to(REALTIME)): len(path.read_text().splitlines()) for path in REALTIME.rglob("*.py")}
    assert {name: n for name, n in sorted(sizes.items()) if n > MAX_MODULE_LINES} == {}


def engine_imports(source: str) -> set[str]:
    """Every engine module a source file imports, as ``realtime.engine[.sub]`` (a name taken from
    ``realtime.engine`` that is not one of its exports counts as its submodule)."""
    import realtime.engine

    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("realtime.engine"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("realtime.engine"):
            found.add(node.module)
            if node.module == "realtime.engine":
                found.update(f"realtime.engine.{a.name}" for a in node.names if a.name not in realtime.engine.__all__)
    return found


def test_endpoints_use_the_engine_through_its_exports_only():
    """realtime/engine/'s modules are its own: the endpoints import ``realtime.engine`` alone."""
    offenders = {}
    for path in sorted((REALTIME / "endpoints").rglob("*.py")):
        bad = engine_imports(path.read_text()) - {"realtime.engine"}
        if bad:
            offenders[path.name] = sorted(bad)
    assert offenders == {}


def test_the_engine_import_check_sees_every_form():
    source = ("import realtime.engine.loop\nfrom realtime.engine.scheduler import Tick\n"
              "from realtime.engine import Engine, overlap\n"
              "def f():\n    from realtime.engine.stats import Buckets\n")
    assert engine_imports(source) - {"realtime.engine"} == {
        "realtime.engine.loop", "realtime.engine.scheduler", "realtime.engine.overlap", "realtime.engine.stats"}
    assert engine_imports("from realtime.engine import NOT_RUN, Engine\n") == {"realtime.engine"}
