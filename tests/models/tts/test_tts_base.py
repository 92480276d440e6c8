"""models/tts/base.py: a voice's answers must match their works (no voice needed)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pytest

from models.base import ModelError
from models.tts.base import DecodeWindow, SynthesizeSentence, TTSAdapter, TTSWork, WindowAudio
from protocols import tts_v1


class Beeps(TTSAdapter):
    name = "beeps"
    voices = ("beep",)

    def __init__(self, fault: str = "") -> None:
        self.fault = fault

    def describe(self) -> Mapping[str, Any]:
        return {"kind": self.kind, "name": self.name}

    def synthesize_batch(self, works: Sequence[TTSWork]) -> list[WindowAudio]:
        out = []
        for w in works:
            sentence = w.sentence_index + (1 if self.fault == "sentence" else 0)
            pcm = b"\x01\x00" * 4
            samples = 5 if self.fault == "samples" else 4
            rate = 8000 if self.fault == "rate" else 22050
            out.append(WindowAudio(w.session_id, w.utterance_index, sentence, 0, pcm, samples, rate, True, 4))
        return out


def test_good_answers_pass():
    works = [SynthesizeSentence("a", 0, 0, "Hi."), DecodeWindow("b", 2, 1)]
    assert [(c.session_id, c.sentence_index) for c in Beeps().run_batch(works)] == [("a", 0), ("b", 1)]


@pytest.mark.parametrize("fault, text", [
    ("sentence", "answered ('a', 0, 1) for work ('a', 0, 0)"),
    ("samples", "5 samples need 10 PCM16 bytes"),
    ("rate", "sample rate 8000 not in [22050, 24000]"),
])
def test_audio_for_another_sentence_fails_the_batch(fault, text):
    with pytest.raises(ModelError) as info:
        Beeps(fault).run_batch([SynthesizeSentence("a", 0, 0, "Hi.")])
    assert text in str(info.value)


def test_speed_bounds_are_the_wires():
    SynthesizeSentence("a", 0, 0, "x", speed=tts_v1.MIN_SPEED)
    SynthesizeSentence("a", 0, 0, "x", speed=tts_v1.MAX_SPEED)
    for speed in (tts_v1.MIN_SPEED / 2, tts_v1.MAX_SPEED * 2):
        with pytest.raises(ValueError, match="outside"):
            SynthesizeSentence("a", 0, 0, "x", speed=speed)


def test_each_session_gets_its_own_segmenter():
    voice = Beeps()
    one, two = voice.segmenter(), voice.segmenter()
    assert one is not two and one.push("Hello there. Bye") == ["Hello there."]
