"""A sentence's phoneme ids are bounded: the segmenter weighs what espeak-ng spells out by
name, and the voice refuses a sentence past ``MAX_SENTENCE_IDS`` before its text encoder.

espeak-ng's English voice reads a letter it has no rules for by its name: "中" is "Chinese
letter" (29 ids), a Myanmar letter up to 80, where a Latin letter in a word makes ~2.5.
Counted as one character each, 200 CJK characters made one sentence of 5,227 ids (first
audio 12 s), and a 558-byte ``input.text`` of Myanmar letters and commas one of 14,421
ids, whose text encoder took 3.3 GB and 26 s with the engine held for every session.
"""

from __future__ import annotations

import time

import pytest

from models.base import ModelError
from models.tts.base import SynthesizeSentence
from models.tts.piper.adapter import MAX_SENTENCE_IDS
from models.tts.segmenter import SPELLED_WEIGHT, SentenceSegmenter

from tts_support import SHORT, needs_tts


def _pieces(text: str) -> list[int]:
    seg = SentenceSegmenter(max_chars=200)
    return [len(p) for p in seg.push(text) + seg.flush()]


@pytest.mark.parametrize("letter", ["\u4e2d", "\u1007", "\u0436", "\u1ec7", "\u0283", "\u2163"])
def test_a_letter_of_another_script_weighs_16(letter):
    # CJK, Myanmar, Cyrillic, Vietnamese's precomposed e, IPA esh, a Roman numeral.
    assert SPELLED_WEIGHT == 16
    assert _pieces(letter * 100) == [12] * 8 + [4]


@pytest.mark.parametrize("text", ["\u00e9" * 300, "\u0161" * 300, "\u01ce" * 300, "a\u0301" * 150])
def test_latin_letters_and_combining_accents_still_weigh_1(text):
    # Latin-1, Extended-A and -B, and a letter with a combining acute.
    assert _pieces(text) == [200, 100]


# "The weather is fine today, let's walk in the park." in Chinese.
CHINESE = "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u5427\u3002"


def test_real_text_of_another_script_is_cut_into_short_sentences():
    seg = SentenceSegmenter(max_chars=200)
    pieces = seg.push(CHINESE * 4)
    pieces += seg.flush()
    # Each phrase: 15 CJK characters (16 each) and two marks (1 each). A piece holds 12 CJK
    # characters and the marks among them; nothing is lost.
    assert [len(p) for p in pieces] == [13, 14, 14, 14, 9]
    assert "".join(pieces) == CHINESE * 4


@needs_tts
def test_a_sentence_past_the_bound_is_refused_before_its_text_encoder(quiet_tts):
    text = "w" * 200  # espeak-ng spells each w, "double-u": 3,219 ids
    started = time.perf_counter()
    with pytest.raises(ModelError) as info:
        quiet_tts.synthesize_batch([SynthesizeSentence("s", 0, 2, text)])
    assert str(info.value) == ("session s: sentence 2 was not spoken: it makes 3219 phoneme ids, at most 2048 "
                               "(espeak-ng spells out by name what it cannot read)")
    assert time.perf_counter() - started < 1.0  # phonemes only (~1 ms); the encoder took seconds
    assert MAX_SENTENCE_IDS == 2048
    (audio,) = quiet_tts.synthesize_batch([SynthesizeSentence("s", 0, 3, SHORT)])
    assert audio.samples > 0
    quiet_tts.drop_session("s")


@needs_tts
def test_the_segmenter_keeps_spelled_out_text_within_the_bound(quiet_tts):
    # The 558-byte text that made 14,421 ids in one sentence: now 12-character sentences.
    seg = SentenceSegmenter()
    pieces = seg.push(("\u1007" * 20 + ", ") * 9) + seg.flush()
    ids = [len(quiet_tts.phonemize(p)) for p in pieces]
    assert max(ids) <= MAX_SENTENCE_IDS and len(pieces) == 18
