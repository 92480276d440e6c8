"""Text -> phoneme ids, the way Piper does it.

The voice was trained on espeak-ng IPA output, grouped and numbered by Piper's
rules, so the same rules are reproduced here:

1. espeak-ng turns the text into clauses ``(phonemes, terminator, end_of_sentence)``;
   language-switch flags like ``(fr)`` are removed, the clause's punctuation is
   kept as a phoneme (plus a space after ``, : ;``), and everything is split into
   NFD code points (so combining marks become their own phonemes).
2. ``phonemes_to_ids``: ``BOS PAD`` then ``id PAD`` for each phoneme, then ``EOS``,
   using the voice JSON's ``phoneme_id_map``; unknown phonemes are skipped.

Two espeak-ng back ends, in order of preference:

- ``piper``: the espeak-ng bridge and data bundled in ``piper-tts``; this is the
  exact front end the voice was trained with.
- ``system``: Debian's ``libespeak-ng`` through ctypes. Its
  ``espeak_TextToPhonemes`` has no terminator output, so the clause punctuation
  is recovered from the text the call consumed. Its older data (1.51 on Debian
  12) differs from Piper's in a few phonemes (e.g. no ``ʲ`` glides), so speech
  is close but not identical; it is a fallback, not a substitute.

Either back end runs in a child process (``espeak_process.py``): some short texts
crash espeak-ng, which must not take the server with it. espeak-ng keeps global
state, so every call holds one module lock.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import re
import threading
import unicodedata
from typing import Mapping, Sequence

from models.tts.graphemes import pieces
from models.tts.piper.availability import TTSUnavailable, has_piper_espeak, has_system_espeak
from models.tts.piper.espeak_process import EspeakProcess

logger = logging.getLogger(__name__)

PAD, BOS, EOS = "_", "^", "$"
_LANG_FLAG = re.compile(r"\([^)]+\)")
_ESPEAK_LOCK = threading.Lock()
_CLAUSE_PUNCT = ".,?!:;"
# espeak-ng drops most of a long run without spaces, and says nothing of it: 200 emoji in a
# row come back as one "grinning face", 60 digits as about 40. Runs up to 32 characters come
# back whole (a 32-emoji run is 447 phonemes), so a run longer than this is spoken as words
# of at most this many characters, cut at grapheme starts. English words stay whole. (A
# clause past about 1,540 phonemes is cut too: the segmenter's budget, which counts a
# symbol as 8 characters, keeps a sentence far below that.)
MAX_WORD_CHARS = 24
_LONG_WORD = re.compile(r"\S{%d,}" % (MAX_WORD_CHARS + 1))


def _break_long_words(text: str) -> str:
    return _LONG_WORD.sub(lambda m: " ".join(pieces(m.group(), MAX_WORD_CHARS)), text)


def phonemes_to_ids(phonemes: Sequence[str], id_map: Mapping[str, Sequence[int]]) -> list[int]:
    """Piper's interleaving: ``^ _ p1 _ p2 _ ... pn _ $`` mapped through ``id_map``."""
    ids: list[int] = [*id_map[BOS], *id_map[PAD]]
    for phoneme in phonemes:
        mapped = id_map.get(phoneme)
        if mapped is None:
            logger.debug("phoneme %r is not in the voice's id map; skipped", phoneme)
            continue
        ids.extend(mapped)
        ids.extend(id_map[PAD])
    ids.extend(id_map[EOS])
    return ids


def clauses_to_sentences(clauses: Sequence[tuple[str, str, bool]]) -> list[list[str]]:
    """espeak-ng clauses -> phonemes per sentence (Piper's ``EspeakPhonemizer`` rules)."""
    sentences: list[list[str]] = []
    current: list[str] = []
    for phonemes, terminator, end_of_sentence in clauses:
        text = _LANG_FLAG.sub("", phonemes) + terminator
        if terminator in (",", ":", ";"):
            text += " "
        current.extend(unicodedata.normalize("NFD", text))
        if end_of_sentence:
            sentences.append(current)
            current = []
    if current:
        sentences.append(current)
    return sentences


class _PiperBridge:
    """piper-tts's bundled espeak-ng (``piper.espeakbridge``)."""

    name = "piper"

    def __init__(self) -> None:
        from piper import espeakbridge
        from piper.phonemize_espeak import ESPEAK_DATA_DIR

        self._bridge = espeakbridge
        espeakbridge.initialize(str(ESPEAK_DATA_DIR))

    def clauses(self, voice: str, text: str) -> list[tuple[str, str, bool]]:
        self._bridge.set_voice(voice)
        return list(self._bridge.get_phonemes(text))


class _SystemEspeak:
    """The system libespeak-ng through ctypes."""

    name = "system"
    _SYNCHRONOUS = 0x02
    _DONT_EXIT = 0x8000
    _UTF8 = 1
    _IPA = 0x02

    def __init__(self) -> None:
        path = ctypes.util.find_library("espeak-ng")
        if path is None:
            raise TTSUnavailable(["espeak-ng"])
        lib = ctypes.CDLL(path)
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        if lib.espeak_Initialize(self._SYNCHRONOUS, 0, None, self._DONT_EXIT) <= 0:
            raise TTSUnavailable(["espeak-ng (libespeak-ng failed to initialise)"])
        self._lib = lib

    def clauses(self, voice: str, text: str) -> list[tuple[str, str, bool]]:
        if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ValueError("espeak-ng has no voice %r" % voice)
        data = text.encode("utf-8")
        buf = ctypes.create_string_buffer(data)
        base = ctypes.addressof(buf)
        ptr = ctypes.c_void_p(base)
        out: list[tuple[str, str, bool]] = []
        while ptr.value is not None:
            start = ptr.value - base
            phonemes = self._lib.espeak_TextToPhonemes(ctypes.byref(ptr), self._UTF8, self._IPA)
            end = len(data) if ptr.value is None else ptr.value - base
            terminator = _clause_terminator(data[start:end].decode("utf-8", "ignore"), ptr.value is None)
            out.append(((phonemes or b"").decode("utf-8"), terminator, ptr.value is None or terminator in ".?!"))
        return out


def _clause_terminator(consumed: str, at_end: bool) -> str:
    """The punctuation that ended a clause, from the text espeak consumed for it.

    espeak reads one character past the clause ("Hello, w"), so trailing
    non-space characters are dropped unless the text ended there.
    """
    if not at_end:
        consumed = re.sub(r"\S+$", "", consumed)
    stripped = consumed.rstrip().rstrip("\"')]}\u201d\u2019")
    return stripped[-1] if stripped and stripped[-1] in _CLAUSE_PUNCT else ""


_BACKENDS: dict[str, EspeakProcess] = {}


def in_process_backend(name: str) -> _PiperBridge | _SystemEspeak:
    """The back end ``name`` in this process: what ``espeak_process``'s child runs."""
    return _PiperBridge() if name == "piper" else _SystemEspeak()


def _backend(name: str | None) -> EspeakProcess:
    """The back end ``name`` (None: piper's if installed, else the system's), in a child
    process shared by every ``Phonemizer`` (espeak_process.py says why)."""
    if name is None:
        name = "piper" if has_piper_espeak() else "system" if has_system_espeak() else None
        if name is None:
            raise TTSUnavailable(["piper-tts (espeak-ng)"])
    if name not in _BACKENDS:
        _BACKENDS[name] = EspeakProcess(name)
    return _BACKENDS[name]


def close_backends() -> None:
    """End every espeak-ng child (the server's shutdown; a later call starts one again)."""
    with _ESPEAK_LOCK:
        while _BACKENDS:
            _BACKENDS.popitem()[1].close()


class Phonemizer:
    """Text -> phoneme ids for one voice (its espeak voice and id map)."""

    def __init__(self, espeak_voice: str, id_map: Mapping[str, Sequence[int]], backend: str | None = None) -> None:
        self.espeak_voice = espeak_voice
        self.id_map = id_map
        with _ESPEAK_LOCK:
            self._backend = _backend(backend)
        self.backend = self._backend.name

    def sentences(self, text: str) -> list[list[str]]:
        """Phonemes per sentence, as espeak-ng splits ``text`` (its words longer than
        ``MAX_WORD_CHARS`` broken up first, see there)."""
        text = _break_long_words(text)
        with _ESPEAK_LOCK:
            clauses = self._backend.clauses(self.espeak_voice, text)
        return [s for s in clauses_to_sentences(clauses) if s]

    def ids(self, text: str) -> list[int]:
        """One id sequence for all of ``text``. Piper would synthesize each
        espeak sentence separately ("Mr." ends one); our segmenter already cut
        the stream into sentences, so espeak's splits are joined with a space
        and spoken in one pass. Empty when espeak finds nothing to say."""
        sentences = self.sentences(text)
        if not sentences:
            return []
        joined: list[str] = []
        for i, sentence in enumerate(sentences):
            if i:
                joined.append(" ")
            joined.extend(sentence)
        return phonemes_to_ids(joined, self.id_map)


class PhonemeTable:
    """Phoneme ids computed earlier by a ``Phonemizer``, looked up by text.

    For machines without espeak-ng (the GPU benchmark box): the ids are made
    where the extra is installed, shipped as JSON, and read back here. Unknown
    text is an error, not a guess.
    """

    backend = "table"

    def __init__(self, table: Mapping[str, Sequence[int]]) -> None:
        self._table = {text: list(ids) for text, ids in table.items()}

    def ids(self, text: str) -> list[int]:
        try:
            return list(self._table[text])
        except KeyError:
            raise KeyError("no precomputed phonemes for %r" % text) from None
