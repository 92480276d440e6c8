"""The TTS seam: what the engine hands a streaming voice and what it must give back.

A TTS adapter is a ``ModelAdapter`` of kind "tts" that declares what the wire
needs and implements one method:

* ``voices`` and ``sample_rates``: what ``session.update`` may choose;
* ``segmenter()``: a fresh sentence segmenter for one session's text stream
  (speech starts per complete sentence);
* ``synthesize_batch(works)``: one step for works of distinct sessions, one
  ``WindowAudio`` (a decoder window's audio) each, in order.

The work is a sentence at a time, a decoder window at a time::

    SynthesizeSentence(sid, utt, k, text, speed, rate) -> its first window
    DecodeWindow(sid, utt, k)                          -> the next window, until done

``run_batch`` (the engine thread) wraps ``synthesize_batch`` and checks the
postconditions for every voice: each answer echoes its work's ``session_id``,
``utterance_index`` and ``sentence_index``, and its PCM holds ``samples`` 16-bit
samples at a supported rate. So the tick-commit rule holds for TTS too: audio
that answers another sentence fails its batch before the engine commits the
window (``end_tick(committed=False)`` rewinds it).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Sequence, Union

from models.base import ModelAdapter, ModelError
from models.tts.segmenter import SentenceSegmenter
from protocols.tts_v1 import DEFAULT_SAMPLE_RATE, MAX_SPEED, MIN_SPEED, SAMPLE_RATES

# The segmenter cuts at 200; this only bounds a voice's text encoder (O(n^2) attention).
MAX_SENTENCE_CHARS = 2000


@dataclass(frozen=True)
class SynthesizeSentence:
    """Start a sentence; the result is its first window."""

    session_id: str
    utterance_index: int
    sentence_index: int
    text: str
    speed: float = 1.0  # length_scale = 1 / speed
    sample_rate: int = DEFAULT_SAMPLE_RATE
    seed: int = 0  # noise seed; the same seed and text give the same audio

    def __post_init__(self) -> None:
        # The wire's bounds (protocols/tts_v1.py) are the only ones.
        if not MIN_SPEED <= self.speed <= MAX_SPEED:
            raise ValueError("speed %r outside [%s, %s]" % (self.speed, MIN_SPEED, MAX_SPEED))
        if self.sample_rate not in SAMPLE_RATES:
            raise ValueError("sample_rate %r not in %s" % (self.sample_rate, SAMPLE_RATES))
        if len(self.text) > MAX_SENTENCE_CHARS:
            raise ValueError("sentence of %d characters; the limit is %d" % (len(self.text), MAX_SENTENCE_CHARS))


@dataclass(frozen=True)
class DecodeWindow:
    """Decode the next window of the named sentence."""

    session_id: str
    utterance_index: int
    sentence_index: int


TTSWork = Union[SynthesizeSentence, DecodeWindow]


@dataclass(frozen=True)
class WindowAudio:
    """One decoder window's audio, the answer to one work."""

    session_id: str
    utterance_index: int
    sentence_index: int
    window_index: int  # -1 when nothing was decoded (stale, or nothing to say)
    pcm: bytes = field(repr=False)  # PCM16 LE mono at sample_rate
    samples: int  # samples in pcm
    sample_rate: int
    done: bool  # the sentence's last window
    sentence_samples: int  # samples sent for this sentence, this window's included
    stale: bool = False  # the sentence is not held any more; nothing was decoded


class TTSAdapter(ModelAdapter[TTSWork, WindowAudio]):
    """Base of every streaming voice the engine runs."""

    kind = "tts"
    voices: tuple[str, ...]
    sample_rates: tuple[int, ...] = SAMPLE_RATES

    @abc.abstractmethod
    def synthesize_batch(self, works: Sequence[TTSWork]) -> list[WindowAudio]:
        """One step for ``works`` (distinct sessions): one window's audio each, in order."""

    def segmenter(self) -> SentenceSegmenter:
        """A fresh segmenter for one session's text stream."""
        return SentenceSegmenter()

    def run_batch(self, works: Sequence[TTSWork]) -> list[WindowAudio]:
        answers = self.synthesize_batch(works)
        if len(answers) != len(works):
            raise ModelError(f"tts {self.name} returned {len(answers)} answers for {len(works)} works")
        for work, audio in zip(works, answers):
            check_audio(work, audio, self.sample_rates, self.name)
        return list(answers)


def check_audio(work: TTSWork, audio: Any, rates: Sequence[int], name: str) -> None:
    """``audio`` answers ``work`` with well-formed PCM16, or a ``ModelError``."""
    if not isinstance(audio, WindowAudio):
        raise ModelError(f"tts {name} returned {type(audio).__name__}, not a WindowAudio")
    echoed = (audio.session_id, audio.utterance_index, audio.sentence_index)
    expected = (work.session_id, work.utterance_index, work.sentence_index)
    if echoed != expected:
        raise ModelError(f"tts {name} answered {echoed} for work {expected}")
    if not isinstance(audio.pcm, bytes) or len(audio.pcm) != 2 * audio.samples:
        raise ModelError(f"tts {name}: {audio.samples} samples need {2 * audio.samples} PCM16 bytes")
    if audio.sample_rate not in rates:
        raise ModelError(f"tts {name}: sample rate {audio.sample_rate} not in {list(rates)}")
