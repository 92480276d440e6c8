"""Which latent frames one policy call writes and denoises: upstream's window, as pure arithmetic.

A session's K/V hold latent frames from the window's first frame on. Each call after the
first writes the previous chunk's frames again from the robot's real observation (a
``t = 0`` pass: the closed loop), then denoises the next chunk. With DROID's sizes
(chunks of 2 frames, ``local_attn_size`` 9)::

    call   start   writes (t = 0)          denoises   next start
    0      0       frame 0 (first image)   1 2        3
    1      3       1 2                     3 4        5
    2      5       3 4                     5 6        7
    3      7       5 6                     7 8        9
    4      9 >= 9: restart the window: frame 0 = the newest observed frame, denoise 1 2 -> 3
                                                      (every max_chunk_size = 4 calls)

so a chunk attends at most ``local_attn_size`` frames (the cache and itself), and the
cache never needs cutting. A new prompt, or a call carrying a single frame, restarts the
window too (upstream's ``lazy_joint_video_action``); those are the session's to decide.

``condition`` is the slice of the I2V condition ``y`` (mask + first-frame latents, one
latent per frame of the window, ``config.condition_latents`` of them) each pass takes:
the frames' own, or the last ones when the window is longer than the condition.
"""

from __future__ import annotations

from dataclasses import dataclass

from models.policy.dreamzero.config import DreamZeroConfig


@dataclass(frozen=True)
class CallPlan:
    restart: bool                 # the window starts again: fresh K/V, frame 0 written first
    write: range                  # latent frames written by the t = 0 pass
    write_condition: slice        # their slice of y
    denoise: range                # latent frames denoised with the actions
    denoise_condition: slice
    next_start: int               # the start frame of the next call


def _condition(frames: range, latents: int) -> slice:
    if frames.stop <= latents:
        return slice(frames.start, frames.stop)
    return slice(latents - len(frames), latents)


def plan_call(start: int, cfg: DreamZeroConfig, *, restart: bool = False) -> CallPlan:
    """The plan of a call made at window position ``start`` (0 for a session's first call);
    ``restart`` forces a new window (a new prompt, a single-frame call)."""
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    n, latents = cfg.num_frame_per_block, cfg.condition_latents
    if restart or start == 0 or start >= cfg.local_attn_size:
        write, denoise = range(0, 1), range(1, 1 + n)
        return CallPlan(True, write, _condition(write, latents), denoise, _condition(denoise, latents), 1 + n)
    if (start - 1) % n:
        raise ValueError(f"start {start} is not 1 + a whole number of {n}-frame chunks")
    write, denoise = range(start - n, start), range(start, start + n)
    return CallPlan(False, write, _condition(write, latents), denoise, _condition(denoise, latents), start + n)
