"""``PiperTTS``: the joe voice behind the TTS seam (``models/tts/base.py``).

Work items (frozen dataclasses of the seam, one per session per engine step):

- ``SynthesizeSentence``: phonemize a complete sentence, run its text encoder
  and the durations of its first ids only (``models.tts.piper.prior``), the flow
  over just the frames the first window reads, and decode that first, short
  window. Replaces any unfinished sentence of that session.
- ``DecodeWindow``: decode the next window of the session's current sentence
  (the first window that reads past the prior's prefix, the third of a 5 s
  sentence, first completes the prior: the text encoder's last layer and the
  durations of the other ids).

Both return a ``WindowAudio``: the window's PCM16 little-endian mono at the
sentence's ``sample_rate``, ``done`` on the sentence's last window (which also
flushes the resampler) and the running sample count for ``audio.done``. A
``DecodeWindow`` that names a sentence the adapter no longer holds (released,
replaced, or already finished) is answered ``stale``, with no audio, instead of
failing the batch.

``run_batch`` runs the prior (text encoder, durations) of all its
``SynthesizeSentence`` items in one padded batch; then the rest of the prior
for every item whose next window needs it (durations in one padded batch);
then the reverse flow for every item whose next window needs more latents
(what the window reads while the prior is a prefix, then the rest of the
sentence), in one padded batch; then every
item's window (first windows and later ones, of different lengths) in **one**
HiFi-GAN forward, padded to the longest window and trimmed after. Padding does
not change anyone's samples (``hifigan.decode_padded``; the flow's convs mask
their inputs).

The engine drives it through ``models/tts/base.py`` (``TTSAdapter.run_batch``
checks every answer against its work); ``realtime/endpoints/tts.py`` documents the wire.

``end_tick(sid, committed=False)`` rewinds the last window so the same window
can be decoded again; ``committed=True`` makes it final.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from models.base import ModelError
from models.cpu_format import format_name
from models.tts.base import DecodeWindow, SynthesizeSentence, TTSAdapter, TTSWork, WindowAudio
from models.tts.piper.espeak_process import EspeakFailed
from models.tts.piper.phonemes import PhonemeTable, Phonemizer, close_backends
from models.tts.piper.prior import PREFIX_IDS
from models.tts.piper.resample import PolyphaseResampler
from models.tts.piper.stream import SentenceStream
from models.tts.piper.voice import LatentRequest, TorchVoice
from models.tts.piper.windows import WindowPlan
from protocols.tts_v1 import SAMPLE_RATES

logger = logging.getLogger(__name__)

# The rates every voice here offers (the resampler makes what the voice lacks).
SUPPORTED_RATES = SAMPLE_RATES
# Phoneme ids of one sentence. Its first audio waits for the text encoder over all of
# them, whose attention grows with their square: 14,421 ids (a 558-byte input.text of
# Myanmar letters and commas, which espeak-ng spells out by name) took 3.3 GB and 26 s, the
# engine held for every session. The segmenter's budget keeps real text well within (a
# Latin sentence of 200 characters makes ~500 ids, 25 emoji ~700, 12 CJK characters ~360).
MAX_SENTENCE_IDS = 2048


class PiperTTS(TTSAdapter):
    """The joe voice (Piper, VITS + HiFi-GAN) streamed a decoder window at a time."""

    def __init__(
        self,
        voice: TorchVoice,
        *,
        plan: WindowPlan | None = None,
        noise_scale: float | None = None,
        noise_w: float | None = None,
        max_batch: int | None = None,
        phonemizer: Phonemizer | PhonemeTable | None = None,
        name: str = "piper-joe-medium",
        prefix_ids: int | None = PREFIX_IDS,
    ) -> None:
        """``prefix_ids``: ids whose durations the first window waits for
        (``models.tts.piper.prior``); None: the whole sentence's, as one-shot synthesis."""
        self.voice = voice
        if prefix_ids is not None and prefix_ids < 1:
            raise ValueError("prefix_ids must be >= 1 or None, got %r" % (prefix_ids,))
        self.prefix_ids = prefix_ids
        self.name = name
        # On a GPU one padded forward for many sessions costs about what one
        # costs. On a CPU the decoder's last stage (32 channels at the audio
        # rate) already spills the caches for one 118-frame window; four in one
        # forward took twice as long as four forwards (2 threads), and padding
        # a first window to a long one adds more. So on CPU: one at a time.
        self.max_batch = max_batch if max_batch is not None else (32 if voice.device.type == "cuda" else 1)
        spec = voice.spec
        self.plan = plan or WindowPlan(context_frames=max(voice.context_left, voice.context_right))
        if self.plan.context_frames < max(voice.context_left, voice.context_right):
            logger.warning(
                "window context %d < receptive field %d: windows will not match a whole decode",
                self.plan.context_frames,
                max(voice.context_left, voice.context_right),
            )
        self.noise_scale = spec.noise_scale if noise_scale is None else noise_scale
        self.noise_w = spec.noise_w if noise_w is None else noise_w
        self._phonemizer = phonemizer  # made on first use: espeak starts only when needed
        self.voices: tuple[str, ...] = (spec.name,)
        self.sample_rates: tuple[int, ...] = SUPPORTED_RATES
        self._resamplers = {r: PolyphaseResampler(spec.sample_rate, r) for r in SUPPORTED_RATES if r != spec.sample_rate}
        self._streams: dict[str, SentenceStream] = {}

    @classmethod
    def load(
        cls,
        device: str | torch.device = "cpu",
        cache_root: Path | None = None,
        products: torch.dtype | None = None,
        **kwargs: Any,
    ) -> "PiperTTS":
        """Convert (first time) or load the cached voice; raises ``TTSUnavailable``
        without the ``tts`` extra. ``products``: ``TorchVoice``'s number format."""
        from models.tts.piper.availability import require_tts

        require_tts()
        return cls(TorchVoice.load(device=device, cache_root=cache_root, products=products), **kwargs)

    def describe(self) -> Mapping[str, Any]:
        spec = self.voice.spec
        return {
            "kind": self.kind,
            "name": self.name,
            "voices": [
                {"name": spec.name, "language": spec.language, "quality": spec.quality, "sample_rate": spec.sample_rate}
            ],
            "sample_rates": list(self.sample_rates),
            "formats": ["pcm16"],
            "max_batch": self.max_batch,
            "windows": {
                "first_frames": self.plan.first_frames,
                "max_frames": self.plan.max_frames,
                "context_frames": self.plan.context_frames,
                "hop_samples": self.voice.hop,
            },
            "device": str(self.voice.device),
            "products": format_name(self.voice.products),
            "products_pick": self.voice.products_pick,
            "phonemizer": self.phonemizer.backend,
        }

    @property
    def phonemizer(self) -> Phonemizer | PhonemeTable:
        if self._phonemizer is None:
            spec = self.voice.spec
            self._phonemizer = Phonemizer(spec.espeak_voice, spec.phoneme_id_map)
        return self._phonemizer

    def phonemize(self, text: str) -> tuple[int, ...]:
        return tuple(self.phonemizer.ids(text))

    # --- the engine seam --------------------------------------------------------------

    def synthesize_batch(self, works: Sequence[TTSWork]) -> list[WindowAudio]:
        sessions = [w.session_id for w in works]
        if len(set(sessions)) != len(sessions):
            raise ModelError("a tts batch holds two works of one session: %s" % sessions)
        self._start_sentences([w for w in works if isinstance(w, SynthesizeSentence)])

        results: list[WindowAudio | None] = [None] * len(works)
        jobs = []
        for i, work in enumerate(works):
            stream = self._streams.get(work.session_id)
            if stream is None or (stream.utterance_index, stream.sentence_index) != (
                work.utterance_index,
                work.sentence_index,
            ):
                logger.debug("session %s: window for %s is stale", work.session_id, work)
                results[i] = self._audio(work, stream=None, pcm=b"", stale=True)
            elif stream.done:
                # An empty sentence (nothing to say) or one already finished.
                results[i] = self._audio(work, stream, b"", stale=isinstance(work, DecodeWindow))
            else:
                window = stream.next_window()
                jobs.append((i, work, stream, window))

        if jobs:
            rest = [j for j in jobs if j[2].needs_prior(j[3])]
            if rest:
                self.voice.prior_rest([stream.prior for _, _, stream, _ in rest])
                jobs = [(i, work, stream, stream.next_window()) for i, work, stream, _ in jobs]
            flows = [(stream, span) for _, _, stream, window in jobs if (span := stream.flow_needed(window))]
            if flows:
                outs = self.voice.flow(
                    [stream.flow_input(span) for stream, span in flows],
                    keep=[(span.start - span.lo, span.end - span.lo) for _, span in flows],
                )
                for (stream, span), z in zip(flows, outs):
                    stream.accept_flow(span, z)
            audio = self.voice.decode(
                [stream.window_latents(window) for _, _, stream, window in jobs],
                cores=[window.core_offset(self.voice.hop) for _, _, _, window in jobs],
            )
            sizes = [a.numel() for a in audio]
            host = torch.cat(audio).cpu().split(sizes)  # one device->host copy for the batch
            for (i, work, stream, window), samples in zip(jobs, host):
                pcm = stream.accept(window, samples)
                results[i] = self._audio(work, stream, pcm, window_index=window.index)
        return results  # type: ignore[return-value]

    def end_tick(self, session_id: str, committed: bool) -> None:
        stream = self._streams.get(session_id)
        if stream is None:
            return
        if committed:
            stream.commit()
            if stream.done:
                del self._streams[session_id]
        elif stream.rewind():
            logger.debug("session %s: window %d rewound", session_id, stream.window_index)

    def close(self) -> None:
        close_backends()  # espeak-ng's child: a server that exits at once leaves none behind

    def drop_session(self, session_id: str) -> None:
        if self._streams.pop(session_id, None) is not None:
            logger.debug("session %s: sentence state released", session_id)

    # --- helpers ----------------------------------------------------------------------

    def _start_sentences(self, starts: Sequence[SynthesizeSentence]) -> None:
        if not starts:
            return
        ids = []
        for w in starts:
            try:
                ids.append(self.phonemize(w.text))
            except EspeakFailed as exc:  # its child is gone, the engine and the voice are fine
                raise ModelError("session %s: sentence %d was not spoken: %s"
                                 % (w.session_id, w.sentence_index, exc)) from None
            if len(ids[-1]) > MAX_SENTENCE_IDS:
                raise ModelError("session %s: sentence %d was not spoken: it makes %d phoneme ids, at most %d "
                                 "(espeak-ng spells out by name what it cannot read)"
                                 % (w.session_id, w.sentence_index, len(ids[-1]), MAX_SENTENCE_IDS))
        spoken = [(w, i) for w, i in zip(starts, ids) if i]
        priors = self.voice.prior_prefix(
            [LatentRequest(i, 1.0 / w.speed, self.noise_scale, self.noise_w, w.seed) for w, i in spoken],
            self.prefix_ids,
        )
        by_session = {w.session_id: z for (w, _), z in zip(spoken, priors)}
        for w in starts:
            z = by_session.get(w.session_id)
            if z is None:
                logger.info("session %s: sentence %d has nothing to say: %r", w.session_id, w.sentence_index, w.text)
                z = self.voice.silence()
            if self._streams.get(w.session_id) is not None and not self._streams[w.session_id].done:
                logger.debug("session %s: sentence %d replaces an unfinished one", w.session_id, w.sentence_index)
            self._streams[w.session_id] = SentenceStream(
                w.utterance_index,
                w.sentence_index,
                z,
                self.plan,
                self.voice.hop,
                w.sample_rate,
                self._resamplers.get(w.sample_rate),
                self.voice.flow_context,
            )
            logger.debug(
                "session %s: sentence %d has %d ids, %d frames known", w.session_id, w.sentence_index, z.length, z.frames
            )

    def _audio(
        self, work: TTSWork, stream: SentenceStream | None, pcm: bytes, stale: bool = False, window_index: int = -1
    ) -> WindowAudio:
        rate = stream.sample_rate if stream is not None else getattr(work, "sample_rate", self.voice.spec.sample_rate)
        return WindowAudio(
            session_id=work.session_id,
            utterance_index=work.utterance_index,
            sentence_index=work.sentence_index,
            window_index=window_index,
            pcm=pcm,
            samples=len(pcm) // 2,
            sample_rate=rate,
            done=True if stream is None else stream.done,
            sentence_samples=0 if stream is None else stream.samples,
            stale=stale,
        )

