"""Sentence segmentation of a text stream, so speech can start before the text ends.

Text arrives in pieces (``push``); a sentence is handed out as soon as it is
known to be complete, and ``flush`` (``input.done``) hands out whatever is left.

A sentence ends at:

- ``. ! ? …`` (any run of them, optionally followed by closing quotes or
  brackets) once the next character is known to be whitespace. "3.14",
  "e.g.," and a "." at the very end of the buffered text are not ends yet: the
  next piece decides. A short list of English abbreviations ("Mr.", "Dr.",
  "e.g.") never ends a sentence.
- a line break (lists and paragraphs often have no final punctuation): LF, CR, CRLF,
  or U+2028 / U+2029 / NEL / VT / FF.

A clause that runs past the budget of ``max_chars`` without a sentence end is cut so the
voice is not kept waiting: at the last clause mark (``, ; : —`` followed by a space)
within the budget, else at the last space, else hard at the budget's end (moved back to
the start of a grapheme: a letter keeps its combining marks, a flag its two regional
indicators, an emoji its ZWJ sequence, modifiers and variation selector); a cut never
leaves a piece shorter than ``min_chars`` if a later cut point exists. The budget counts a
symbol (an emoji, a currency or math sign: ``SYMBOL_WEIGHT``) as 8 characters, a digit
as 4, and a letter of a script other than Latin (``SPELLED_WEIGHT``) as 16: the voice front
end reads "©" as "copyright", 22 phoneme ids, and "中" as "Chinese letter", 29, where a
letter makes about two, and a sentence's first audio waits for its text encoder over all
its ids (200 emoji in one sentence held the engine 7 s; 200 CJK characters made one of
5,227 ids, 12 s). The voice refuses a sentence past its own bound on ids
(``adapter.MAX_SENTENCE_IDS``), which the weights keep real text well within. Whitespace
runs inside a sentence become single spaces.

Pure Python, no state beyond the buffered text. Linear in the text: a search for the
next sentence end looks no further than the budget (an end beyond it would not be cut
at), and an abbreviation is recognised by the few letters before its dot. (A 4 KiB
``input.text`` of one long word and "Mr."s once took 23 s here, on the event loop.)
"""

from __future__ import annotations

import re
import unicodedata

from models.tts.graphemes import grapheme_start

# "etc." and "no." are left out: they end sentences as often as not.
ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "e.g", "i.e", "fig"})
_CLOSERS = "\"')]}\u201d\u2019\u00bb"
_STOPS = ".!?\u2026"
# A run of stops is matched from its first stop only (the lookbehind): tried from every
# stop of a long run, the match would backtrack over the rest of the run each time.
_LINE_BREAKS = "\n\r\u2028\u2029\x85\x0b\x0c"
_END = re.compile(r"(?<![" + _STOPS + r"])[" + _STOPS + r"]+[" + re.escape(_CLOSERS) + r"]*(?=\s)|["
                  + _LINE_BREAKS + "]")
# The first character that is not whitespace, a stop or a closer (a sentence's own text).
_WORDY = re.compile(r"[^\s" + _STOPS + re.escape(_CLOSERS) + r"]")
_ABBREVIATION_CHARS = max(map(len, ABBREVIATIONS))
_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.")
_CLAUSE = re.compile(r"[,;:\u2014\u2013](?=\s)")
_SPACE = re.compile(r"\s+")
_LEADING_SPACE = re.compile(r"\s*")
# What one character counts against the budget (see the module docstring).
SYMBOL_WEIGHT, DIGIT_WEIGHT, SPELLED_WEIGHT = 8, 4, 16
_SYMBOLS = frozenset({"So", "Sc", "Sm", "Sk"})
# The letters the voice reads in words: Latin (Basic to Extended-B) and the combining
# accents. A letter, mark or number of another script it spells by name ("Chinese letter",
# "Cyrillic small letter zhe"): 10 to 80 phoneme ids each, where a Latin letter makes ~2.5.
_LATIN_END = 0x250
_ACCENTS = range(0x300, 0x370)


def _weight(ch: str) -> int:
    if ch.isdigit():
        return DIGIT_WEIGHT
    category = unicodedata.category(ch)
    if category in _SYMBOLS:
        return SYMBOL_WEIGHT
    if category[0] in "LMN" and ord(ch) >= _LATIN_END and ord(ch) not in _ACCENTS:
        return SPELLED_WEIGHT
    return 1


def _normalise(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def _is_abbreviation(text: str, dot: int) -> bool:
    """Whether the '.' at ``dot`` closes a known abbreviation ("Mr." in "Mr. Smith"): the
    run of letters and dots before it is one (a run longer than any is not)."""
    if text[dot : dot + 1] != ".":
        return False
    start = dot
    while start > 0 and text[start - 1] in _WORD_CHARS:
        start -= 1
        if dot - start > _ABBREVIATION_CHARS:
            return False
    return text[start:dot].lower() in ABBREVIATIONS


class SentenceSegmenter:
    def __init__(self, max_chars: int = 200, min_chars: int | None = None) -> None:
        if max_chars < 2:
            raise ValueError("max_chars must be at least 2")
        self.max_chars = max_chars
        self.min_chars = max_chars // 4 if min_chars is None else min_chars
        self._buffer = ""

    @property
    def buffered(self) -> str:
        return self._buffer

    def push(self, text: str) -> list[str]:
        """Add text; return the sentences it completed, in order."""
        self._buffer += text
        out: list[str] = []
        while True:
            cut = self._next_cut()
            if cut is None:
                break
            piece, self._buffer = _normalise(self._buffer[:cut]), self._buffer[cut:]
            if piece:
                out.append(piece)
        return out

    def flush(self) -> list[str]:
        """Everything still buffered, as the last pieces (``input.done``)."""
        out = self.push("")
        # What push left has no sentence end and fits the budget.
        rest, self._buffer = _normalise(self._buffer), ""
        if rest:
            out.append(rest)
        return out

    def clear(self) -> None:
        """Drop buffered text (``response.cancel``)."""
        self._buffer = ""

    def restore(self, buffered: str) -> None:
        """Put back the buffer as ``buffered`` read before a ``push`` or ``flush`` whose
        pieces the caller refused (a message over a queue limit changes nothing)."""
        self._buffer = buffered

    def _next_cut(self) -> int | None:
        """Where the next piece ends: the first sentence end if it fits the budget,
        else a budget cut once the buffer outgrows ``max_chars``."""
        offset = _LEADING_SPACE.match(self._buffer).end()
        room, over = self._room(offset)
        end = self._sentence_end(offset, offset + room + 1)
        if end is not None and end - offset <= room:
            return end
        if over:
            head = self._buffer[offset:offset + room + 1]  # all that _cut_point reads
            return offset + _cut_point(head, room, self.min_chars * room // self.max_chars)
        return None

    def _room(self, offset: int) -> tuple[int, bool]:
        """How many characters from ``offset`` fit the budget, and whether the buffer holds
        more than that (at most ``max_chars`` + 1 characters read: each weighs 1 or more)."""
        budget, buffer, at = self.max_chars, self._buffer, offset
        while at < len(buffer):
            weight = _weight(buffer[at])
            if weight > budget:
                if at == offset:  # heavier than the whole budget: it goes alone
                    at += 1
                return at - offset, at < len(buffer)
            budget -= weight
            at += 1
        return at - offset, False

    def _sentence_end(self, start: int, within: int) -> int | None:
        """Index just past the first complete sentence in the buffer's characters from
        ``start`` (after its leading whitespace) up to ``within`` (the character after a
        stop must be among them)."""
        wordy = _WORDY.search(self._buffer, start, within)
        if wordy is None:
            return None  # punctuation alone ("..." between sentences) joins the next one
        for match in _END.finditer(self._buffer, start, within):
            if match.end() <= wordy.start():
                continue  # punctuation alone, as above
            if match.group() not in _LINE_BREAKS and _is_abbreviation(self._buffer, match.start()):
                continue
            return match.end()
        return None


def _cut_point(text: str, max_chars: int, min_chars: int) -> int:
    """Where to cut ``text`` (longer than ``max_chars``): just after the last clause
    mark, else the last space, inside [min_chars, max_chars]; else at max_chars."""
    head = text[: max_chars + 1]  # a mark at max_chars - 1 is followed by a space at max_chars
    clauses = [m.end() for m in _CLAUSE.finditer(head) if min_chars <= m.end() <= max_chars]
    if clauses:
        return clauses[-1]
    spaces = [m.start() for m in re.finditer(r"\s", head) if min_chars <= m.start() <= max_chars]
    if spaces:
        return spaces[-1]
    return grapheme_start(text, max_chars)
