"""Where a text may be cut without tearing a user-perceived character (a grapheme).

A cut never falls before a combining mark, a zero-width joiner or what follows one, a
variation selector, an emoji skin-tone modifier or a tag character, nor between the two
regional indicators of a flag. Not the whole of UAX #29, but every case the voice's
front end reads differently when torn (a torn flag shifts every later pair: espeak-ng
reads the halves as "symbol one F one F eight").
"""

from __future__ import annotations

import unicodedata


def _extends(ch: str) -> bool:
    """Whether ``ch`` belongs to the grapheme before it."""
    code = ord(ch)
    return (unicodedata.category(ch) in ("Mn", "Me", "Mc") or code == 0x200D or 0xFE00 <= code <= 0xFE0F
            or 0x1F3FB <= code <= 0x1F3FF or 0xE0020 <= code <= 0xE007F)


def _regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def grapheme_start(text: str, cut: int) -> int:
    """``cut`` (0 < cut < len(text)), moved back until it does not split a grapheme;
    ``cut`` itself when the grapheme reaches back to the start (a hostile run of marks is
    cut anyway)."""
    at = cut
    while at > 0:
        if _extends(text[at]) or text[at - 1] == "\u200d":
            at -= 1
            continue
        if _regional(text[at]) and _regional(text[at - 1]):
            run = at - 1
            while run > 0 and _regional(text[run - 1]):
                run -= 1
            if (at - run) % 2:  # text[at - 1] opens a pair that text[at] closes
                at -= 1
                continue
        return at
    return cut


def pieces(word: str, size: int) -> list[str]:
    """``word`` in pieces of at most ``size`` characters, each cut at a grapheme's start."""
    out: list[str] = []
    while len(word) > size:
        cut = grapheme_start(word, size)
        out.append(word[:cut])
        word = word[cut:]
    out.append(word)
    return out
