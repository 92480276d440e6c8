"""Which latent frames a block attends to, and which video frames' actions a latent frame sees.

Rolling cache (the reference's ``kv_cache`` of ``local_attn_size`` frames, ``sink_size`` of
them never evicted). After frames ``0..end-1`` are written the cache holds::

    end <= window:   [ 0 1 ... end-1 ]
    end  > window:   [ 0 .. sink-1 ][ end-(window-sink) .. end-1 ]

    e.g. window 6, sink 0, blocks of 3:  block at 6 attends [3 4 5 | 6 7 8]
         window 6, sink 1, blocks of 3:  block at 6 attends [0 | 4 5 | 6 7 8]

A block at ``start`` attends to ``kept_frames(start + 3, ...)``: the cached frames and itself.
What it leaves behind for the next block is the same list, so the committed cache of a
session is always ``kept_frames(next_start, sink, window)``. The action attentions keep their
own caches the same way with a sink of 0 (the reference hard-codes it).

Actions: the session sends one action per video frame; latent frame ``f`` sees the
``windows_size * 4 = 12`` video frames ``4f-12 .. 4f-1``, an index below 0 reading frame 0
(the reference pads the front with 12 copies of frame 0)::

    video frames:     0  1 2 3 4  5 6 7 8  ...
    latent frame 0:   [12 x frame 0]
    latent frame 1:   [12 x frame 0 ... ] -> frames -8..3, i.e. 9 x frame 0, then 1 2 3
    latent frame 3:   frames 0..11

(The reference's windows end one frame before the last video frame a latent frame covers;
kept as published.)
"""

from __future__ import annotations

import torch


def kept_frames(end: int, sink: int, window: int) -> list[int]:
    """Frames a rolling cache of ``window`` frames (``sink`` pinned) holds after frames ``0..end-1``."""
    if not 0 <= sink < window:
        raise ValueError(f"sink {sink} must be in 0..{window - 1}")
    if end <= window:
        return list(range(end))
    return list(range(sink)) + list(range(end - (window - sink), end))


def attended_frames(start: int, frames: int, sink: int, window: int) -> list[int]:
    """Frames a block of ``frames`` latent frames at ``start`` attends to (itself last)."""
    return kept_frames(start + frames, sink, window)


def visible(query_frame: int, key_frame: int, block: int, sink: int, window: int) -> bool:
    """Whether ``query_frame`` attends to ``key_frame`` in a block-causal windowed sequence:
    the key is among the frames the query's block attends to (the one-shot form of the cache)."""
    start = query_frame - query_frame % block
    return key_frame in kept_frames(start + block, sink, window)


def action_window(latent_frame: int, window_video_frames: int, stride: int) -> list[int]:
    """Video-frame indices of the actions latent frame ``f`` sees (below 0 clamped to 0)."""
    first = stride * latent_frame - window_video_frames
    return [max(0, i) for i in range(first, first + window_video_frames)]


def actions_needed(start: int, frames: int, stride: int) -> int:
    """Video frames of actions a block at ``start`` needs: ``1 + 4 * (start + frames - 1)``,
    the reference's condition length (its last frame is never read by a window)."""
    return 1 + stride * (start + frames - 1)


def block_windows(history: torch.Tensor, start: int, frames: int, window_video_frames: int,
                  stride: int) -> torch.Tensor:
    """``[frames, window, C]``: the action windows of a block at ``start`` from a session's
    per-video-frame history ``[N, C]`` (N at least ``stride * (start + frames - 1)``, the last
    frame a window reads, plus one)."""
    need = stride * (start + frames - 1)
    if history.ndim != 2 or history.shape[0] < need:
        raise ValueError(f"a block at latent frame {start} reads {need} video frames of actions, "
                         f"got history {tuple(history.shape)}")
    idx = [action_window(f, window_video_frames, stride) for f in range(start, start + frames)]
    return history[torch.tensor(idx, device=history.device)]


def windows_from(actions: torch.Tensor, first: int, start: int, frames: int, window_video_frames: int,
                 stride: int) -> torch.Tensor:
    """``block_windows`` of a history that holds only video frames ``first .. first + N - 1``
    (``actions [N, C]``): what a served session keeps, the tail of its past and the block's."""
    idx = [[i - first for i in action_window(f, window_video_frames, stride)]
           for f in range(start, start + frames)]
    lo, hi = min(min(w) for w in idx), max(max(w) for w in idx)
    if lo < 0 or hi >= actions.shape[0]:
        raise ValueError(f"a block at latent frame {start} reads video frames {lo + first}..{hi + first}, "
                         f"the history holds {first}..{first + actions.shape[0] - 1}")
    return actions[torch.tensor(idx, device=actions.device)]
