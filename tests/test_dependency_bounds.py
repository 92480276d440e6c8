"""The dependencies whose internals realtime/server/transport.py reaches into, and Starlette, are bounded
on both sides, and their lower bounds, read from pyproject.toml, really work.

transport.py subclasses uvicorn's h11 and sans-I/O WebSocket protocols, h11's ``Connection``
(reading its ``_receive_buffer``) and reads the state of websockets' sans-I/O ``ServerProtocol``:
any 0.x minor of them may move what it touches. The slow test installs each lower bound with
``--no-deps`` into a folder put first on PYTHONPATH, so they shadow the environment's releases
while everything else comes from it, then imports the server and runs the transport tests and two
endpoints' tests against them (their server subprocesses inherit PYTHONPATH).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
BOUNDED = ("uvicorn", "websockets", "h11", "starlette")
# What transport.py does with each release (~45 s), and two endpoints through Starlette (~20 s).
TESTS = (
    "tests/e2e/test_handshake.py", "tests/e2e/test_bad_requests.py", "tests/e2e/test_stalled_and_refused.py",
    "tests/realtime/test_transport_pause.py", "tests/realtime/test_transport_replies.py",
    "tests/realtime/test_transport_heads.py", "tests/e2e/test_world.py", "tests/e2e/test_openpi_ws.py",
)
# Where each import must come from, and as which release: a bound that pip did not install, or that
# something else on the path shadowed, would pass without testing anything.
IMPORT_CHECK = (
    "import json, sys, realtime.server.server, realtime.server.app\n"
    "mods = [__import__(name) for name in sys.argv[1:]]\n"
    "print(json.dumps({m.__name__: [m.__version__, m.__file__] for m in mods}))\n"
)


def requirements() -> dict[str, Requirement]:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {canonicalize_name(r.name): r for r in map(Requirement, dependencies)}


def bounds(requirement: Requirement) -> tuple[str, str]:
    """(lower, upper) of a ``>=X,<Y`` requirement; ValueError for any other form."""
    operators = {s.operator: s.version for s in requirement.specifier}
    if sorted(operators) != ["<", ">="] or len(requirement.specifier) != 2:
        raise ValueError(f"{requirement}: want exactly '>=LOW,<HIGH'")
    return operators[">="], operators["<"]


def test_each_dependency_whose_internals_we_touch_is_bounded_on_both_sides():
    found = requirements()
    for name in BOUNDED:
        lower, upper = bounds(found[name])
        assert Version(lower) < Version(upper), found[name]


def test_bounds_refuses_an_open_range():
    with pytest.raises(ValueError):
        bounds(Requirement("uvicorn>=0.30"))
    with pytest.raises(ValueError):
        bounds(Requirement("uvicorn>=0.30,<0.56,!=0.40"))
    assert bounds(Requirement("uvicorn[standard]>=0.55,<0.56")) == ("0.55", "0.56")


def _index_unreachable() -> str | None:
    """Why the package index cannot be reached, or None when it answers."""
    url = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/").rstrip("/") + "/pip/"
    try:
        with urllib.request.urlopen(url, timeout=10):
            return None
    except OSError as exc:
        return f"{url} cannot be reached ({exc})"


@pytest.mark.slow
def test_the_lower_bounds_install_import_and_pass_the_transport_tests(tmp_path):
    lower = {name: bounds(requirements()[name])[0] for name in BOUNDED}
    target = tmp_path / "lower-bounds"
    try:
        _install_and_run(lower, target)
    finally:
        shutil.rmtree(target, ignore_errors=True)  # a few MB of packages: pytest would keep three runs of them


def _install_and_run(lower: dict[str, str], target: Path) -> None:
    # Few retries and a short timeout: offline, pip's defaults would retry for minutes.
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-cache-dir", "--only-binary=:all:",
         "--disable-pip-version-check", "--retries", "1", "--timeout", "15", "--target", str(target),
         *(f"{name}=={version}" for name, version in lower.items())],
        capture_output=True, text=True, timeout=180)
    if install.returncode != 0:
        reason = _index_unreachable()
        if reason is not None:
            pytest.skip(f"the lower bounds cannot be installed: {reason}")
        pytest.fail(f"pip could not install {lower}:\n{install.stdout[-3000:]}{install.stderr[-3000:]}")

    path = [str(target), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    imported = subprocess.run([sys.executable, "-c", IMPORT_CHECK, *BOUNDED], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0, imported.stderr[-3000:]
    for name, (version, file) in json.loads(imported.stdout.splitlines()[-1]).items():
        assert Version(version) == Version(lower[name]), (name, version)
        assert Path(file).is_relative_to(target), (name, file)

    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert tests.returncode == 0, f"with {lower}:\n{tests.stdout[-6000:]}{tests.stderr[-2000:]}"
