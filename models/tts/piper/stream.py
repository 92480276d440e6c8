"""One sentence being streamed: its latents, the next window, and the PCM it has sent.

The adapter keeps one ``SentenceStream`` per session. It holds the sentence's
sampled prior (``prior.SentencePrior``: before the first window only the frames
of its first ids, ``needs_prior`` says when the rest is due) and fills in the
flow's output as windows need it (``windows.flow_span``). Each decoder window moves
the cursor over the sentence's latent frames (``windows.window_at``), turns the
window's core audio into PCM16 at the client's rate, and remembers the state
before the window so an uncommitted tick can be rolled back (``rewind``).

PCM16 follows Piper: ``clip(x * 32767, -32767, 32767)`` truncated to int16,
little-endian. Piper also peak-normalises each whole sentence by default; a
stream cannot know the peak before it has sent the audio, so no normalisation
is applied (the voice's output is already within [-1, 1]; tanh).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from models.tts.piper.prior import SentencePrior
from models.tts.piper.resample import PolyphaseResampler, ResamplerState
from models.tts.piper.windows import FlowSpan, Window, WindowPlan, flow_span, window_at

MAX_PCM = 32767.0


def to_pcm16(audio: np.ndarray) -> bytes:
    """Float samples in [-1, 1] -> PCM16 little-endian bytes (Piper's rule)."""
    return np.clip(audio * MAX_PCM, -MAX_PCM, MAX_PCM).astype("<i2").tobytes()


@dataclass(frozen=True)
class _Cursor:
    """Everything a window advances; immutable so the previous one is a snapshot."""

    frame: int = 0  # next core frame
    window_index: int = 0
    samples: int = 0  # output samples emitted for this sentence
    resampler: ResamplerState | None = None


class SentenceStream:
    """Latents of one sentence and how far they have been decoded."""

    def __init__(
        self,
        utterance_index: int,
        sentence_index: int,
        prior: SentencePrior,
        plan: WindowPlan,
        hop: int,
        sample_rate: int,
        resampler: PolyphaseResampler | None,
        flow_context: int,
    ) -> None:
        self.utterance_index = utterance_index
        self.sentence_index = sentence_index
        self.prior = prior
        # Decoder input [C, flow_done], grown by the flow as windows need it (flow_span).
        self.latents = prior.z_p[:, :0]
        self.flow_done = 0
        self.flow_context = flow_context
        self.plan = plan
        self.hop = hop
        self.sample_rate = sample_rate
        self._resampler = resampler
        self._cursor = _Cursor(resampler=resampler.start() if resampler else None)
        self._before: _Cursor | None = None

    @property
    def frames(self) -> int:
        """The sentence's latent frames known so far (all of them once the prior is complete)."""
        return self.prior.frames

    @property
    def done(self) -> bool:
        return self.prior.complete and self._cursor.frame >= self.frames

    def needs_prior(self, window: Window) -> bool:
        """Whether ``window`` (from ``next_window``) needs the rest of the prior
        first: when its flow span, context included, reaches past the frames
        known so far (then the window's own bounds may be clipped there too)."""
        if self.prior.complete:
            return False
        span = self.flow_needed(window)  # None: its latents are there (a rewound window)
        return span is not None and span.end + self.flow_context > self.frames

    @property
    def samples(self) -> int:
        return self._cursor.samples

    @property
    def window_index(self) -> int:
        return self._cursor.window_index

    def next_window(self) -> Window:
        return window_at(self.plan, self._cursor.window_index, self._cursor.frame, self.frames)

    def flow_needed(self, window: Window) -> FlowSpan | None:
        """The flow work to run before ``window`` can be decoded, if any."""
        return flow_span(self.flow_done, window.hi, self.frames, self.flow_context, self.prior.complete)

    def flow_input(self, span: FlowSpan) -> torch.Tensor:
        return self.prior.z_p[:, span.lo : span.hi]

    def accept_flow(self, span: FlowSpan, z: torch.Tensor) -> None:
        """Store the flow output of ``span`` (z covers its [start, end) frames)."""
        if span.start != self.flow_done:
            raise ValueError("flow span starts at %d, flow done to %d" % (span.start, self.flow_done))
        if z.shape[-1] != span.end - span.start:
            raise ValueError("flow output has %d frames, span %d" % (z.shape[-1], span.end - span.start))
        self.latents = torch.cat([self.latents, z], dim=1) if self.flow_done else z
        self.flow_done = span.end

    def window_latents(self, window: Window) -> torch.Tensor:
        if window.hi > self.flow_done:
            raise ValueError("window reads frames to %d, flow done to %d" % (window.hi, self.flow_done))
        return self.latents[:, window.lo : window.hi]

    def accept(self, window: Window, core: torch.Tensor) -> bytes:
        """Take the decoded core audio of ``window`` (CPU), advance, and return
        the PCM16 to send. The last window also flushes the resampler."""
        if window.start != self._cursor.frame:
            raise ValueError("window starts at %d, cursor at %d" % (window.start, self._cursor.frame))
        if core.numel() != (window.end - window.start) * self.hop:
            raise ValueError("window core has %d samples, expected %d" % (core.numel(), (window.end - window.start) * self.hop))
        state = self._cursor.resampler
        last = self.prior.complete and window.end >= self.frames
        if self._resampler is not None:
            out, state = self._resampler.push(state, core)
            if last:
                tail, state = self._resampler.finish(state)
                out = torch.cat([out, tail])
        else:
            out = core
        pcm = to_pcm16(out.numpy())
        self._before = self._cursor
        self._cursor = _Cursor(window.end, window.index + 1, self._cursor.samples + out.numel(), state)
        return pcm

    def commit(self) -> None:
        self._before = None

    def rewind(self) -> bool:
        """Undo the last ``accept`` (its tick was not committed). False if there is
        nothing to undo."""
        if self._before is None:
            return False
        self._cursor, self._before = self._before, None
        return True
