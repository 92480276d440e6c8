"""PiperTTS through the ModelAdapter seam: streaming, batching, rollback, release."""

import numpy as np
import pytest

from models.base import ModelError
from models.tts.base import DecodeWindow, SynthesizeSentence, WindowAudio
from models.tts.piper.resample import PolyphaseResampler
from models.tts.piper.stream import to_pcm16
from models.tts.piper.voice import LatentRequest

import piper_reference as plain
from tts_support import SENTENCE, SHORT, needs_tts

pytestmark = needs_tts


def _stream(tts, sid, text, rate=22050, speed=1.0, utt=0, k=0):
    answers = tts.run_batch([SynthesizeSentence(sid, utt, k, text, speed, rate)])
    while not answers[-1].done:
        answers += tts.run_batch([DecodeWindow(sid, utt, k)])
    return answers


def _pcm(answers):
    return np.frombuffer(b"".join(c.pcm for c in answers), "<i2").astype(np.int32)


@pytest.fixture(scope="module")
def reference(quiet_tts):
    """Whole-sentence float audio of SENTENCE and SHORT, noise off."""
    voice = quiet_tts.voice
    out = {}
    for text in (SENTENCE, SHORT):
        z = plain.latents(voice, [LatentRequest(quiet_tts.phonemize(text), 1.0, 0.0, 0.0)])[0]
        out[text] = plain.decode_whole(voice, z)
    return out


def test_describe(quiet_tts):
    assert quiet_tts.describe() == {
        "kind": "tts",
        "name": "piper-joe-medium",
        "voices": [{"name": "en_US-joe-medium", "language": "en_US", "quality": "medium", "sample_rate": 22050}],
        "sample_rates": [22050, 24000],
        "formats": ["pcm16"],
        "max_batch": 1,  # CPU: batching does not pay (see PiperTTS.__init__)
        "windows": {"first_frames": 12, "max_frames": 96, "context_frames": 11, "hop_samples": 256},
        "device": "cpu",
        "products": "float32",  # the fixture's voice pins it (conftest.py)
        "products_pick": None,
        "phonemizer": "piper",
    }
    assert quiet_tts.voices == ("en_US-joe-medium",)


def test_a_sentence_streams_in_growing_windows_and_matches_the_whole_decode(quiet_tts, reference):
    answers = _stream(quiet_tts, "a", SENTENCE)
    # Windows of 12, 24, 48, then 96 frames; 418 frames in all.
    assert [c.samples for c in answers] == [3072, 6144, 12288, 24576, 24576, 24576, 11776]
    assert [c.window_index for c in answers] == list(range(7))
    assert [c.done for c in answers] == [False] * 6 + [True]
    assert answers[-1].sentence_samples == 107008
    assert answers[0] == WindowAudio("a", 0, 0, 0, answers[0].pcm, 3072, 22050, False, 3072)
    whole = np.frombuffer(to_pcm16(reference[SENTENCE].numpy()), "<i2").astype(np.int32)
    # Windowed floats differ by ~1e-7, which can move a truncation by one step.
    assert int(np.abs(_pcm(answers) - whole).max()) <= 1


def test_24khz_stream_equals_resampling_the_whole_sentence(quiet_tts, reference):
    answers = _stream(quiet_tts, "b", SENTENCE, rate=24000)
    assert [c.sample_rate for c in answers] == [24000] * 7
    assert answers[-1].sentence_samples == sum(c.samples for c in answers) == 116472
    whole = plain.resample(PolyphaseResampler(22050, 24000), reference[SENTENCE])
    expected = np.frombuffer(to_pcm16(whole.numpy()), "<i2").astype(np.int32)
    assert int(np.abs(_pcm(answers) - expected).max()) <= 1


def test_batching_two_sessions_equals_running_each_alone(quiet_tts):
    other = "Good morning."
    alone_a = _stream(quiet_tts, "alone-a", SHORT, rate=24000)
    alone_b = _stream(quiet_tts, "alone-b", other)
    # B starts while A is a window in: the batches mix a SynthesizeSentence
    # with DecodeWindows of different lengths and sample rates.
    got_a = quiet_tts.run_batch([SynthesizeSentence("a2", 0, 0, SHORT, 1.0, 24000)])
    got_b: list[WindowAudio] = []
    while not (got_a[-1].done and got_b and got_b[-1].done):
        works = []
        if not got_a[-1].done:
            works.append(DecodeWindow("a2", 0, 0))
        if not got_b:
            works.append(SynthesizeSentence("b2", 0, 0, other))
        elif not got_b[-1].done:
            works.append(DecodeWindow("b2", 0, 0))
        for audio in quiet_tts.run_batch(works):
            (got_a if audio.session_id == "a2" else got_b).append(audio)
    assert [c.samples for c in got_a] == [c.samples for c in alone_a] == [3327, 6687, 13375, 24816]
    assert [c.samples for c in got_b] == [c.samples for c in alone_b]
    assert int(np.abs(_pcm(got_a) - _pcm(alone_a)).max()) <= 1
    assert int(np.abs(_pcm(got_b) - _pcm(alone_b)).max()) <= 1


def test_uncommitted_window_is_rewound_and_decoded_again(quiet_tts):
    quiet_tts.run_batch([SynthesizeSentence("r", 0, 0, SHORT)])
    quiet_tts.end_tick("r", committed=True)
    first = quiet_tts.run_batch([DecodeWindow("r", 0, 0)])[0]
    quiet_tts.end_tick("r", committed=False)
    again = quiet_tts.run_batch([DecodeWindow("r", 0, 0)])[0]
    assert (again.window_index, again.sentence_samples) == (first.window_index, first.sentence_samples) == (1, 9216)
    assert again.pcm == first.pcm


def test_stale_windows_come_back_empty(quiet_tts):
    (unknown,) = quiet_tts.run_batch([DecodeWindow("nobody", 0, 0)])
    assert unknown == WindowAudio("nobody", 0, 0, -1, b"", 0, 22050, True, 0, stale=True)
    quiet_tts.run_batch([SynthesizeSentence("c", 3, 1, SHORT)])
    (wrong,) = quiet_tts.run_batch([DecodeWindow("c", 3, 0)])
    assert wrong.stale and wrong.samples == 0
    quiet_tts.drop_session("c")
    quiet_tts.drop_session("c")  # idempotent
    (gone,) = quiet_tts.run_batch([DecodeWindow("c", 3, 1)])
    assert gone.stale and gone.done


def test_finished_sentence_is_dropped_on_commit(quiet_tts):
    answers = _stream(quiet_tts, "f", "Yes.")
    assert answers[-1].done and not answers[-1].stale
    quiet_tts.end_tick("f", committed=True)
    assert quiet_tts.run_batch([DecodeWindow("f", 0, 0)])[0].stale


def test_nothing_to_say_is_a_done_window_without_audio(quiet_tts):
    (audio,) = quiet_tts.run_batch([SynthesizeSentence("e", 0, 0, "   ")])
    assert audio == WindowAudio("e", 0, 0, -1, b"", 0, 22050, True, 0, stale=False)


def test_speed_shortens_the_sentence(quiet_tts):
    fast = _stream(quiet_tts, "fast", SHORT, speed=2.0)
    slow = _stream(quiet_tts, "slow", SHORT, speed=0.5)
    normal = _stream(quiet_tts, "normal", SHORT)
    # 112, 173 and 304 frames of 256 samples (durations are rounded up per phoneme).
    assert [c[-1].sentence_samples for c in (fast, normal, slow)] == [28672, 44288, 77824]


def test_bad_works(quiet_tts):
    with pytest.raises(ModelError):
        quiet_tts.run_batch([DecodeWindow("x", 0, 0), DecodeWindow("x", 0, 0)])
    with pytest.raises(ValueError):
        SynthesizeSentence("x", 0, 0, "hi", speed=0.0)
    with pytest.raises(ValueError):
        SynthesizeSentence("x", 0, 0, "hi", sample_rate=16000)
    with pytest.raises(ValueError):
        SynthesizeSentence("x", 0, 0, "a" * 2001)


def test_noise_on_is_reproducible_per_seed(voice, quiet_tts):
    from models.tts.piper.adapter import PiperTTS

    tts = PiperTTS(voice)  # the voice's own noise scales (0.667, 0.8)
    assert (tts.noise_scale, tts.noise_w) == (0.667, 0.8)
    a = b"".join(c.pcm for c in _stream(tts, "n1", SHORT))
    b = b"".join(c.pcm for c in _stream(tts, "n2", SHORT))
    quiet = b"".join(c.pcm for c in _stream(quiet_tts, "n3", SHORT))
    assert a == b and a != quiet
