"""Bounded JSON decoding for the text protocols (world.v1 and tts.v1).

``json.loads`` recurses once per nesting level, so about a thousand ``[`` raise
``RecursionError`` (not a ``ValueError``) and take the connection down with them.
It also accepts ``NaN`` and ``Infinity`` (not JSON, RFC 8259), turns ``1e400``
into ``inf`` and parses integer literals of thousands of digits (quadratic work,
and values that overflow the first ``float()`` they meet). ``loads`` bounds all of
that before or while decoding and raises ``JSONRejected``, a ``ValueError``, so a
protocol answers it like any other malformed message and keeps the session.

Limits (documented in docs/protocols.md and docs/protocols_tts.md):

* nesting: at most ``MAX_DEPTH`` arrays/objects deep, checked on the raw text
  before decoding (string contents are skipped, so ``"[[["`` in a prompt is fine);
* numbers: a literal of at most ``MAX_NUMBER_CHARS`` characters; floats must be
  finite doubles; the constants ``NaN``, ``Infinity`` and ``-Infinity`` are refused.

Size limits are each protocol's own (``over_size``); this module only measures.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

# Deeper than any message of either protocol needs (world controls are ~4 levels).
MAX_DEPTH = 32
# A 64-bit integer has at most 20 characters, a double's shortest repr 24; this
# leaves room for needlessly long but legal spellings and bounds int() to linear work.
MAX_NUMBER_CHARS = 100

# A JSON string literal, or an unterminated one running to the end of the text. The
# optional closing quote matters: a pattern that must end in a quote fails on every
# quote of '"\\"\\"\\"...' after scanning to the end, which is quadratic (seconds for
# 10 KB); this one matches each string once, left to right, exactly where a JSON
# parser sees strings up to its first syntax error (beyond which it never recurses).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class JSONRejected(ValueError):
    """Text that is not acceptable JSON under this module's limits."""


def over_size(text: str, max_bytes: int) -> bool:
    """Whether ``text`` takes more than ``max_bytes`` bytes as UTF-8.

    UTF-8 never has fewer bytes than characters, so most frames are decided
    without encoding; ``surrogatepass`` keeps a lone surrogate from raising here.
    """
    if len(text) > max_bytes:
        return True
    if len(text) * 4 <= max_bytes:
        return False
    return len(text.encode("utf-8", "surrogatepass")) > max_bytes


def nesting_depth(text: str) -> int:
    """The deepest array/object nesting of ``text``, string literals skipped (linear time)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if not brackets:
        return 0
    return max(0, max(accumulate(1 if c in "[{" else -1 for c in brackets)))


def loads(text: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Decode ``text`` like ``json.loads`` within the limits above, or raise ``JSONRejected``."""
    # Counting brackets is cheap C work; only text that could be deep is scanned.
    if text.count("[") + text.count("{") > max_depth and nesting_depth(text) > max_depth:
        raise JSONRejected(f"nested deeper than {max_depth} levels")
    try:
        return json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except JSONRejected:
        raise
    except ValueError as exc:  # json.JSONDecodeError and int()'s own digit limit
        raise JSONRejected(f"malformed JSON: {exc}") from None


def _parse_int(literal: str) -> int:
    if len(literal) > MAX_NUMBER_CHARS:
        raise JSONRejected(f"a number literal of {len(literal)} characters (at most {MAX_NUMBER_CHARS})")
    return int(literal)


def _parse_float(literal: str) -> float:
    if len(literal) > MAX_NUMBER_CHARS:
        raise JSONRejected(f"a number literal of {len(literal)} characters (at most {MAX_NUMBER_CHARS})")
    value = float(literal)  # never raises for a JSON number literal; overflows to inf
    if not math.isfinite(value):
        raise JSONRejected(f"number {literal} is out of the double range")
    return value


def _parse_constant(name: str) -> Any:
    raise JSONRejected(f"{name} is not a JSON number")
