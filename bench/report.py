"""The one way a benchmark hands back its report: JSON on stdout and, with ``--out``, in a file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def emit(report: Any, out: str | Path | None, *, indent: int = 2, echo: bool = True,
         log: Callable[[str], None] | None = None) -> str:
    """Print ``report`` as JSON (unless ``echo`` is off) and write it to ``out`` when given
    (its folder is made if missing). Values JSON cannot encode are written as ``str``.
    Returns the JSON text."""
    text = json.dumps(report, indent=indent, default=str)
    if echo:
        print(text, flush=True)
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
        if log is not None:
            log(f"wrote {path}")
    return text
