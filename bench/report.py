"""The one way a benchmark hands back its report: JSON on stdout and, with ``--out``, in a file."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Sequence


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


def load_summary(before: Sequence[float], after: Sequence[float], during: Sequence[float]) -> dict[str, Any]:
    """A run's host load for its report: ``os.getloadavg()`` before and after, and the
    one-minute averages sampled during it (min / max / mean)."""
    return {
        "getloadavg_before": [round(x, 2) for x in before],
        "getloadavg_after": [round(x, 2) for x in after],
        "one_minute_during": {"min": round(min(during), 2), "max": round(max(during), 2),
                              "mean": round(sum(during) / len(during), 2)},
    }


def proc_stat(pid: int) -> tuple[float, int]:
    """A process's CPU seconds (utime + stime, all its threads) and minor page faults so far,
    from ``/proc/<pid>/stat`` (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])
