"""How a client's own values appear in error texts: quoted and clipped.

An error names what the client sent (``unknown endpoint 'rset'``), but the client
chooses its size: one key or one dtype string of an OpenPI body can be 64 MiB. Every
echo goes through ``shown`` (one value) or ``shown_all`` (a list of them), so an error
text, and the log line that records it, stays short whatever came in.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

# Characters of one echoed value; a longer one is cut and says how long it was.
MAX_SHOWN_CHARS = 64
# Values of a list echoed before "and N more".
MAX_SHOWN_ITEMS = 8


def shown(value: Any, limit: int = MAX_SHOWN_CHARS) -> str:
    """``repr(value)``, at most about ``limit`` characters (a str or bytes is cut before
    ``repr``, so a huge one is never copied whole)."""
    if isinstance(value, (str, bytes)) and len(value) > limit:
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}... ({len(value)} {unit})"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def clipped(text: str, limit: int = 4 * MAX_SHOWN_CHARS) -> str:
    """``text`` made of a client's values (a path of keys), unquoted, cut at ``limit``."""
    return text if len(text) <= limit else text[:limit] + "..."


def listed(names: Iterable[str], limit: int = MAX_SHOWN_ITEMS) -> str:
    """``a, b, c`` unquoted, each name cut at MAX_SHOWN_CHARS, the first ``limit`` of them
    and a count of the rest (field names in messages that list them bare)."""
    return _series(names, limit, lambda name: clipped(name, MAX_SHOWN_CHARS))


def shown_all(values: Iterable[Any], limit: int = MAX_SHOWN_ITEMS) -> str:
    """``[v1, v2, ...]`` of ``shown`` values, the first ``limit`` of them and a count of the rest."""
    return f"[{_series(values, limit, shown)}]"


def _series(values: Iterable[Any], limit: int, show: Callable[[Any], str]) -> str:
    items = list(values)
    rest = f", and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(show(v) for v in items[:limit]) + rest
