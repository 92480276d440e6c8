"""realtime/ never imports a concrete model: only the kind bases and the factory table.

A new model is a package plus a row in ``models/factory.py``; if an endpoint or the
registry imported a model package, adding one would mean editing realtime/ again.
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
