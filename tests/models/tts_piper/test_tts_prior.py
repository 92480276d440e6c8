"""The prior in two steps (``prior.py``, ``TorchVoice.prior_prefix`` / ``prior_rest``)
against the whole-sentence prior, noise on; and the streamed audio against the one-shot synthesis."""

import numpy as np
import pytest
import torch

from models.tts.piper.prior import NOISE_BLOCK, PREFIX_IDS, Segment, prefix_segment, rest_segment

import piper_reference as plain
from tts_support import SENTENCE, SHORT, needs_tts


def test_segments_carry_the_reach_or_the_sentence_edge():
    #  ids 0 ............................ 215
    #  prefix [0, 40) + 52 of context -> reads [0, 92), keeps [0, 40)
    #  rest   reads [40 - 52 -> 0, 215), keeps [40, 215)
    assert prefix_segment(215, 40, 52) == Segment(0, 92, 0, 40)
    assert rest_segment(215, 40, 52) == Segment(0, 215, 40, 215)
    assert rest_segment(215, 100, 52) == Segment(48, 215, 100, 215)
    # A sentence the prefix and its context already reach the end of: all at once.
    assert prefix_segment(92, 40, 52) == Segment(0, 92, 0, 92)
    assert prefix_segment(50, 40, 52) == Segment(0, 50, 0, 50)
    for done in (0, 215):
        with pytest.raises(ValueError, match="rest of ids"):
            rest_segment(215, done, 52)


@needs_tts
def test_the_reach_read_off_the_model(voice):
    # 3 dilated convs (kernel 3, dilations 1, 3, 9) = 13 ids, in the conditioning
    # and in each of the 3 conv flows run in reverse.
    assert voice.duration_reach == 52


@pytest.fixture(scope="module")
def requests(voice):
    from models.tts.piper.phonemes import Phonemizer
    from models.tts.piper.voice import LatentRequest

    ph = Phonemizer(voice.spec.espeak_voice, voice.spec.phoneme_id_map)
    return [LatentRequest(tuple(ph.ids(t)), 1.0, 0.667, 0.8, seed=s) for t, s in ((SENTENCE, 7), (SHORT, 8))]


@needs_tts
def test_prefix_then_rest_equals_the_whole_prior_padded(voice, requests):
    whole = plain.prior(voice, requests)
    # Both sentences in one padded batch, then both rests in one padded batch.
    parts = voice.prior_prefix(requests)
    long, short = parts
    assert len(requests[0].phoneme_ids) > PREFIX_IDS + voice.duration_reach
    assert not long.complete and long.ids_done == PREFIX_IDS
    # The encoder's last layer ran over the prefix segment's ids only.
    assert long.hidden.shape[0] == PREFIX_IDS + voice.duration_reach and long.last_input is not None
    assert short.last_input is None
    # The prefix's frames are the whole prior's first frames, noise included.
    assert long.frames >= 55 and long.noise.shape[0] % NOISE_BLOCK == 0
    assert float((long.z_p - whole[0][:, : long.frames]).abs().max()) <= 1e-6
    voice.prior_rest(parts)
    assert long.complete and short.complete
    for p, ref in zip(parts, whole):
        assert p.z_p.shape == ref.shape
        # Same durations (so the same frames) and the same noise: rounding only.
        assert float((p.z_p - ref).abs().max()) <= 1e-6
    assert long.frames == sum(int(d.sum()) for d in long.durations)


@needs_tts
def test_the_prior_does_not_depend_on_the_batch(voice, requests):
    (alone,) = plain.prior(voice, requests[1:])
    (_, padded) = plain.prior(voice, requests)
    assert alone.shape == padded.shape
    assert float((alone - padded).abs().max()) <= 1e-5


@needs_tts
def test_streamed_audio_equals_the_one_shot_synthesis_with_noise(voice):
    from models.tts.base import DecodeWindow, SynthesizeSentence
    from models.tts.piper.adapter import PiperTTS
    from models.tts.piper.stream import to_pcm16
    from models.tts.piper.voice import LatentRequest

    tts = PiperTTS(voice)
    ids = tts.phonemize(SENTENCE)
    answers = tts.run_batch([SynthesizeSentence("n", 0, 0, SENTENCE, 1.0, 22050, 11)])
    prior = tts._streams["n"].prior
    known = prior.frames
    assert not prior.complete and known >= PREFIX_IDS
    answers += tts.run_batch([DecodeWindow("n", 0, 0)])
    # The second window (core [12, 36), decoded to 47, its flow reading 32 more)
    # comes from the prefix when the prefix has those frames.
    assert prior.complete == (known < 36 + 11 + 32)
    while not answers[-1].done:
        answers += tts.run_batch([DecodeWindow("n", 0, 0)])
    got = np.frombuffer(b"".join(c.pcm for c in answers), "<i2").astype(np.int32)
    one_shot = plain.synthesize(voice, LatentRequest(ids, 1.0, tts.noise_scale, tts.noise_w, 11))
    want = np.frombuffer(to_pcm16(one_shot.numpy()), "<i2").astype(np.int32)
    assert got.size == want.size
    # Windowed floats differ by ~1e-6 (cropped flow and decoder), which can move a truncation.
    assert int(np.abs(got - want).max()) <= 3
    assert int(np.abs(want).max()) > 10000  # not silence
