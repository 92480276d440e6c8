"""Sink + sliding-window retention, as pure index arithmetic on frame numbers.

A session has committed frames ``[0, n)``. It keeps the first ``sink`` frames for
its whole life and the most recent window; everything between is released when a
chunk commits. Release happens in whole *spans* of ``span`` frames, aligned to
multiples of ``span``: a frame goes only when its whole span lies before the
window, so the window is in effect rounded up to whole spans. Ticks commit whole
spans (``frames_per_tick`` is a multiple of ``span``), so ``n`` is always a
multiple of ``span``.

Example: sink=2, window=4, span=2, after n=12 committed frames::

    frame:    0  1  2  3  4  5  6  7  8  9 10 11 | 12 13  (next tick, in flight)
              [sink]|<-- released -->|[ window  ] | [chunk]
              kept     null blocks      kept        scratch

    window_start(12) = max(sink, span * floor((n - window) / span))
                     = max(2, 2 * floor(8 / 2)) = 8

With window=3 (not a multiple of span=2) the window still starts at a span
boundary: ``2 * floor((12 - 3) / 2) = 8``, so 4 frames are kept, never fewer
than ``window``. With window=1 < span=2 the last whole span ``[10, 12)`` stays.

Frames in ``[sink, window_start(n))`` point at the null block in the session's
positional block table; frames ``>= n`` do not exist yet.
"""

from __future__ import annotations


def _ceil_to(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def window_start(n: int, sink: int, window: int, span: int) -> int:
    """First kept frame of the window after ``n`` committed frames.

    Frames ``[sink, window_start)`` are released; when ``sink >= n`` the result
    is ``sink`` (nothing released, the sink is still filling).
    """
    if n < 0 or sink < 0 or window < 0 or span < 1:
        raise ValueError(f"bad retention arguments n={n} sink={sink} window={window} span={span}")
    return max(sink, span * ((n - window) // span))


def kept_frames(n: int, sink: int, window: int, span: int) -> list[int]:
    """Committed frames still held after ``n`` frames were committed, in order."""
    start = window_start(n, sink, window, span)
    return list(range(min(sink, n))) + list(range(start, n))


def freed_on_commit(n_before: int, n_after: int, sink: int, window: int,
                       span: int) -> range:
    """Frames released when the committed count goes from ``n_before`` to ``n_after``.

    These are the frames that were held after ``n_before`` (or were just
    committed) and fall before the new window start. Newly committed frames that
    are already outside the window (a window smaller than one tick) are included.
    """
    if n_after < n_before:
        raise ValueError(f"commit cannot shrink: {n_before} -> {n_after}")
    lo = window_start(n_before, sink, window, span)
    hi = window_start(n_after, sink, window, span)
    return range(lo, max(lo, min(hi, n_after)))


def max_window_frames(window: int, span: int) -> int:
    """Most window frames ever held between ticks: the window rounded up to spans."""
    return _ceil_to(window, span)


def max_retained_frames(sink: int, window: int, span: int) -> int:
    """Most committed frames a session ever holds between ticks (sink + window).

    For the LingBot and tiny geometries (span 1) this is exactly
    ``sink + window``, the term used by the capacity formula.
    """
    return sink + max_window_frames(window, span)
