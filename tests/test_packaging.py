"""The wheel holds what the server runs and none of the training and evaluation code.

Training and evaluation, with their logs, live in ``training`` packages (``models/maze/training/``,
``models/world/maze/training/``, ``models/policy/maze/training/``) that pyproject's packages.find
excludes: they run from a clone. The wheel is built once here, offline (``pip wheel
--no-build-isolation --no-index``, a few seconds), from a copy of the repository's files so that the
build leaves nothing in the tree, and checked both ways: it is exactly the package folders' files
less ``training/``; every import in it, lazy ones too, resolves inside it; and the server's
models build from it alone, weights included.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The top-level packages the wheel takes (pyproject's packages.find include, "realtime*" -> "realtime").
PACKAGES = frozenset(p.rstrip("*") for p in
                     tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"])


def _in_training(path: str) -> bool:
    return "training" in path.split("/")[:-1]


def _module_of(path: str) -> str:
    """``models/maze/sim.py`` -> ``models.maze.sim``; a package's ``__init__.py`` -> the package."""
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports(source: str, module: str, is_package: bool) -> set[str]:
    """The project modules (top level in PACKAGES) that ``source``, the text of ``module``, imports
    anywhere (function bodies too). ``from a.b import c`` names ``a.b`` and ``a.b.c``: the caller
    keeps ``a.b.c`` only where it is a module."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {name for name in found if name.split(".")[0] in PACKAGES}


@pytest.fixture(scope="module")
def repository_files() -> tuple[str, ...]:
    """The repository's files: tracked, or new and not ignored (what a commit would hold)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=ROOT, capture_output=True, check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git clone: the repository's files cannot be listed")
    return tuple(name for name in listed.split("\0") if name and (ROOT / name).is_file())


@pytest.fixture(scope="module")
def package_files(repository_files) -> frozenset[str]:
    """The repository's files under the wheel's package folders."""
    return frozenset(name for name in repository_files if name.split("/")[0] in PACKAGES)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, repository_files) -> tuple[frozenset[str], Path]:
    """The wheel's files (less its .dist-info) and the folder it is unpacked into, as installed."""
    pytest.importorskip("setuptools")
    src, out, site = (tmp_path_factory.mktemp(name) for name in ("src", "dist", "site"))
    for name in repository_files:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(out), str(src)], check=True, capture_output=True, timeout=120)
    (built,) = out.glob("*.whl")
    with zipfile.ZipFile(built) as archive:
        archive.extractall(site)
        names = frozenset(n for n in archive.namelist() if ".dist-info/" not in n)
    return names, site


def test_the_wheel_is_the_package_folders_less_training(package_files, wheel):
    names, _ = wheel
    training = {name for name in package_files if _in_training(name)}
    # The training packages are where this check looks for them.
    assert {"models/maze/training/scripted.py", "models/world/maze/training/train.py",
            "models/world/maze/training/evaluate.py", "models/policy/maze/training/train.py",
            "models/policy/maze/training/evaluate.py"} <= training
    assert sorted(name for name in names if _in_training(name) or "train_log" in name) == []
    # The container and cluster recipes build from a clone too (docs/deploy.md).
    recipes = {name for name in package_files if name == "deploy/Dockerfile" or name.startswith("deploy/kubernetes/")}
    assert "deploy/kubernetes/kustomization.yaml" in recipes and not recipes & names
    # Everything else ships: modules, weights, model cards, the page's files.
    assert names == package_files - training - recipes
    assert {"models/world/maze/weights/maze.safetensors", "models/policy/maze/weights/maze_policy.safetensors",
            "clients/web/index.html"} <= names


def test_every_import_in_the_wheel_resolves_inside_it(package_files, wheel):
    names, site = wheel
    shipped = {_module_of(name) for name in names if name.endswith(".py")}
    known = {_module_of(name) for name in package_files if name.endswith(".py")} | shipped
    unresolved = []
    for name in sorted(n for n in names if n.endswith(".py")):
        imports = project_imports((site / name).read_text(), _module_of(name), name.endswith("/__init__.py"))
        # ``from pkg import attr``: pkg.attr is checked only where the repository has it as a module.
        unresolved += [f"{name}: {module}" for module in sorted(imports & known - shipped)]
    assert unresolved == []


# Run from the unpacked wheel: the CLI, every factory row, and the server's default models built
# on CPU (their weights read from the wheel); then list any project module loaded from elsewhere.
# The TTS default is imported, not built: loading the voice takes longer than this whole test.
_SERVE_FROM_WHEEL = """
import importlib, json, sys
from pathlib import Path

site = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(site))
import realtime.server.cli
from models import factory

for name, (kind, target) in factory.FACTORIES.items():
    module, _, attr = target.partition(":")
    getattr(importlib.import_module(module), attr)
options = factory.BuildOptions(device="cpu", max_batch=2, kv_budget_bytes=64 << 20, cpu_format="float32")
built = {name: type(factory.build(name, options)).__name__
         for name in (*factory.DEFAULT_WORLDS, factory.DEFAULTS["policy"])}
tops = set(sys.argv[2].split(","))
elsewhere = sorted(n for n, m in sys.modules.items() if n.split(".")[0] in tops
                   and getattr(m, "__file__", None) and not Path(m.__file__).resolve().is_relative_to(site))
print(json.dumps({"built": built, "elsewhere": elsewhere}))
"""


def test_the_server_runs_from_the_wheel_alone(wheel):
    _, site = wheel
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", _SERVE_FROM_WHEEL, str(site), ",".join(sorted(PACKAGES))],
                          cwd=site, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report == {"built": {"maze": "MazeWorld", "maze-sim": "MazeSimWorld", "tiny": "TinyWorld",
                                "maze-policy": "MazePolicy"}, "elsewhere": []}


def test_project_imports_sees_lazy_relative_and_from_imports():
    source = ("import models.maze.sim\nfrom models.world.maze import training\n"
              "def f():\n    from models.policy.maze.training.train import main\n"
              "from . import goals\nfrom .training import scripted\nimport torch\n")
    assert project_imports(source, "models.maze", is_package=True) == {
        "models.maze.sim", "models.world.maze", "models.world.maze.training", "models.policy.maze.training.train",
        "models.policy.maze.training.train.main", "models.maze", "models.maze.goals", "models.maze.training",
        "models.maze.training.scripted"}
