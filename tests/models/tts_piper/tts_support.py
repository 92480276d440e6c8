"""Constants and marks shared by the Piper voice's tests (a uniquely named module, so
``from tts_support import ...`` cannot pick up another directory's conftest)."""

from __future__ import annotations

import pytest

from models.tts.piper.availability import INSTALL_HINT, missing_components

MISSING = missing_components()
SKIP_REASON = "tts extra missing (%s): %s" % (", ".join(MISSING), INSTALL_HINT)
needs_tts = pytest.mark.skipif(bool(MISSING), reason=SKIP_REASON)

# About five seconds of speech (418 frames = 4.85 s at 22,050 Hz).
SENTENCE = "The quick brown fox jumps over the lazy dog while the server streams audio in real time."
SHORT = "Hello there, how are you doing today?"
