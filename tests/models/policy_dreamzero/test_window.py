"""The window walk of upstream's lazy_joint_video_action, call by call."""

from __future__ import annotations

import pytest

from models.policy.dreamzero.config import DROID
from models.policy.dreamzero.window import plan_call


def test_droid_calls_restart_every_four():
    start, seen = 0, []
    for _ in range(9):
        p = plan_call(start, DROID)
        seen.append((start, p.restart, tuple(p.write), tuple(p.denoise), p.next_start))
        start = p.next_start
    assert seen == [
        (0, True, (0,), (1, 2), 3),
        (3, False, (1, 2), (3, 4), 5),
        (5, False, (3, 4), (5, 6), 7),
        (7, False, (5, 6), (7, 8), 9),
        (9, True, (0,), (1, 2), 3),
        (3, False, (1, 2), (3, 4), 5),
        (5, False, (3, 4), (5, 6), 7),
        (7, False, (5, 6), (7, 8), 9),
        (9, True, (0,), (1, 2), 3),
    ]


def test_conditions_are_the_frames_own():
    p = plan_call(7, DROID)
    assert (p.write_condition, p.denoise_condition) == (slice(5, 7), slice(7, 9))
    p = plan_call(0, DROID)
    assert (p.write_condition, p.denoise_condition) == (slice(0, 1), slice(1, 3))


def test_forced_restart_and_bad_starts():
    assert plan_call(5, DROID, restart=True).restart and plan_call(5, DROID, restart=True).next_start == 3
    with pytest.raises(ValueError, match="whole number"):
        plan_call(4, DROID)
    with pytest.raises(ValueError, match=">= 0"):
        plan_call(-1, DROID)


def test_a_window_longer_than_the_condition_takes_its_last_latents():
    from models.policy.dreamzero.config import TINY   # 3 condition latents, a window of 5

    p = plan_call(3, TINY)
    assert tuple(p.denoise) == (3, 4) and p.denoise_condition == slice(1, 3)
    assert tuple(p.write) == (1, 2) and p.write_condition == slice(1, 3)
