"""torch (VitsModel + ResBlock2) vs ONNX Runtime on the same phoneme ids, noise off."""

import numpy as np
import pytest

import piper_reference as plain
from tts_support import SENTENCE, SHORT, needs_tts


@needs_tts
def test_torch_matches_onnx_runtime(voice):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime (a piper-tts dependency) is missing")

    from models.tts.piper.convert import find_joe_voice
    from models.tts.piper.phonemes import Phonemizer
    from models.tts.piper.voice import LatentRequest

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(find_joe_voice().onnx_path), options, providers=["CPUExecutionProvider"])
    phonemizer = Phonemizer(voice.spec.espeak_voice, voice.spec.phoneme_id_map)
    for text, length_scale, samples in ((SENTENCE, 1.0, 107008), (SHORT, 1.25, 50432)):
        ids = phonemizer.ids(text)
        ref = session.run(
            None,
            {
                "input": np.array([ids], np.int64),
                "input_lengths": np.array([len(ids)], np.int64),
                "scales": np.array([0.0, length_scale, 0.0], np.float32),
            },
        )[0].reshape(-1)
        ours = plain.synthesize(voice, LatentRequest(tuple(ids), length_scale, 0.0, 0.0)).numpy()
        assert ours.shape == ref.shape == (samples,)  # 418 and 197 frames of 256 samples
        assert float(np.abs(ours - ref).max()) <= 1e-4, text
