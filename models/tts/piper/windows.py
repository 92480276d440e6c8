"""Which latent frames each HiFi-GAN window decodes: pure index arithmetic.

A sentence's latents (T frames, ``hop`` samples each) are decoded in windows.
Window k emits the *core* frames [start, end) and reads ``context`` more frames
on each side where the sentence has them::

    frames   0                                                         T
             |---------------------------------------------------------|
    core                      [start ========== end)
    decoded         [lo ..... start ========== end ..... hi)
                     <context>                  <context>
    emitted samples           [start*hop ..... end*hop)   (of the sentence)

    lo = max(0, start - context)     hi = min(T, end + context)

The reverse flow that turns the sampled prior into those latents is local too
(``flow_context`` frames each side), so it is not run over the whole sentence
before the first window either. ``flow_span`` asks for just what the first
window reads, then everything else in one go when the second window needs it::

    prior z_p   |=========================================================|
    flow #1     [0 ........ hi0)                    reads [0, hi0 + fctx)
    flow #2                 [hi0 ............................... T)
                                                    reads [hi0 - fctx, T)
    window 0    decodes [0, hi0) of z     window 1 needs [lo1, hi1), hi1 > hi0

Two calls keep the flow's extra context work small (about 4 * fctx frames in
all) while the first audio waits only for a short prefix. While the prior is
known only for a prefix of the sentence (``prior.py``), each window's flow span
covers just what it reads, so the second window can be served from the prefix
too and the rest of the prior waits for the third.

Core sizes grow from a short first window (fast first audio) to ``max_frames``
(fewer, more efficient forwards): first, 2*first, 4*first, ... capped at max,
and the last window takes whatever is left. With ``context`` at least the
decoder's receptive field (``hifigan.receptive_field``), the emitted samples
equal the whole-sentence decode's samples up to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WindowPlan:
    first_frames: int = 12  # 12 * 256 / 22050 = 139 ms of audio
    max_frames: int = 96  # 96 + 2 * 11 frames decode fastest per frame on CPU
    context_frames: int = 11  # joe-medium's receptive field is 11 frames each side

    def __post_init__(self) -> None:
        if self.first_frames < 1 or self.max_frames < self.first_frames or self.context_frames < 0:
            raise ValueError("bad window plan %r" % (self,))

    def core_frames(self, index: int) -> int:
        """Core size of window ``index`` before the sentence end clips it."""
        size = self.first_frames
        for _ in range(index):
            if size >= self.max_frames:
                break
            size *= 2
        return min(size, self.max_frames)


@dataclass(frozen=True)
class Window:
    index: int
    start: int  # core frames [start, end)
    end: int
    lo: int  # decoded frames [lo, hi) including context
    hi: int

    def core_offset(self, hop: int) -> tuple[int, int]:
        """Sample range of the core inside this window's decoded audio."""
        return (self.start - self.lo) * hop, (self.end - self.lo) * hop


def window_at(plan: WindowPlan, index: int, start: int, total: int) -> Window:
    """Window ``index`` whose core begins at frame ``start`` of a ``total``-frame sentence."""
    if not 0 <= start < total:
        raise ValueError("window start %d outside a %d-frame sentence" % (start, total))
    end = min(total, start + plan.core_frames(index))
    return Window(index, start, end, max(0, start - plan.context_frames), min(total, end + plan.context_frames))


@dataclass(frozen=True)
class FlowSpan:
    """One run of the reverse flow: the frames it outputs and the prior frames it reads."""

    start: int  # flow output frames [start, end) to compute
    end: int
    lo: int  # prior frames [lo, hi) it reads
    hi: int


def flow_span(done: int, need: int, total: int, context: int, whole: bool = True) -> FlowSpan | None:
    """The flow work before a window that reads latents up to ``need``, when the
    frames [0, done) are already computed: None if nothing is missing; the
    first call covers [0, need), any later one the whole rest [done, total).
    ``whole=False``: ``total`` is only the prior known so far (``prior.py``), so
    every call covers just [done, need) (and reads past it what ``total`` allows;
    the caller checks that the context is there)."""
    if need <= done:
        return None
    end = need if done == 0 or not whole else total
    return FlowSpan(done, end, max(0, done - context), min(total, end + context))
