"""Deep-frozen plain JSON values.

An accepted event sits in a queue until a tick snapshots it, and the snapshot is
read by another thread (the engine). Freezing at the door, as a copy, means the
client's objects can change later without reaching either, and that anything that
would not survive a trip through JSON (bytes, sets, NaN, arbitrary objects) is
refused where the error can still name the offending field.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, Union

from protocols.echo import clipped, shown
from sessions.errors import ErrorCode, SessionError

# Deeper nesting than any control schema needs; also stops self-referencing lists.
MAX_DEPTH = 32

Frozen = Union["FrozenDict", tuple, str, int, float, bool, None]


class FrozenDict(Mapping[str, Any]):
    """An immutable, hashable mapping that keeps insertion order.

    Compares equal to any mapping with the same items (a plain ``dict`` included).
    Constructing one directly freezes only the top level; :func:`deep_freeze` is the
    way to freeze a whole JSON value.
    """

    __slots__ = ("_items", "_hash")

    def __init__(self, items: Mapping[str, Any] | Any = ()) -> None:
        object.__setattr__(self, "_items", dict(items))
        object.__setattr__(self, "_hash", None)

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(frozenset(self._items.items())))
        return self._hash

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FrozenDict is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("FrozenDict is immutable")

    def __repr__(self) -> str:
        return f"FrozenDict({self._items!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (self._items,))


def deep_freeze(value: Any, path: str = "value") -> Frozen:
    """A frozen copy of a plain JSON value: dicts become :class:`FrozenDict`, lists
    and tuples become tuples, str/int/finite float/bool/None stay as they are.

    Only these exact types are accepted (no subclasses, no numpy scalars). Anything
    else raises ``SessionError(BAD_REQUEST)`` naming its location under ``path``,
    e.g. ``controls[0].data.held[2]``.
    """
    return _freeze(value, path, 0)


def _freeze(value: Any, path: str, depth: int) -> Frozen:
    kind = type(value)
    if value is None or kind is str or kind is bool or kind is int:
        return value
    if kind is float:
        if not math.isfinite(value):
            raise SessionError(ErrorCode.BAD_REQUEST, f"{clipped(path)}: {value!r} is not a finite number")
        return value
    if depth >= MAX_DEPTH:
        raise SessionError(ErrorCode.BAD_REQUEST, f"{clipped(path)}: nested deeper than {MAX_DEPTH} levels")
    if kind is dict or kind is FrozenDict:
        items = {}
        for key, item in value.items():
            if type(key) is not str:
                raise SessionError(
                    ErrorCode.BAD_REQUEST,
                    f"{clipped(path)}: object key {shown(key)} is a {type(key).__name__}, not a string",
                )
            items[key] = _freeze(item, f"{path}.{key}", depth + 1)
        return FrozenDict(items)
    if kind is list or kind is tuple:
        return tuple(_freeze(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
    raise SessionError(
        ErrorCode.BAD_REQUEST, f"{clipped(path)}: a {kind.__name__} is not a plain JSON value"
    )


def thaw(value: Any) -> Any:
    """Plain ``dict``/``list`` form of a frozen value, ready for ``json.dumps``."""
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return [thaw(item) for item in value]
    return value
