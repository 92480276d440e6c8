"""What is running: ``realtime --version`` and ``GET /version``.

Cheap on purpose: a probe or a deploy script may ask often, so nothing heavy is imported
here (torch's version is reported only once something else has loaded it).
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
import sys
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

DISTRIBUTION = "realtime-sessions"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def package_version() -> str:
    """The installed distribution's version; in a source checkout that was never installed,
    the one pyproject.toml declares, marked as such; ``unknown`` if neither is there."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        found = re.search(r'^version\s*=\s*"([^"]+)"', PYPROJECT.read_text(), re.MULTILINE)
    except OSError:
        found = None
    return f"{found.group(1)}+source" if found else "unknown"


def versions() -> dict[str, str | None]:
    """The server's, Python's and torch's versions (torch: None until something imported it)."""
    torch = sys.modules.get("torch")
    return {"version": package_version(), "python": platform.python_version(),
            "torch": str(torch.__version__) if torch is not None else None}


async def version(request: Request) -> Response:
    """``GET /version``."""
    return JSONResponse(versions())
