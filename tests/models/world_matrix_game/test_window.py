import pytest
import torch

from models.world.matrix_game.window import (action_window, actions_needed, attended_frames, block_windows,
                                             kept_frames, visible)


def test_kept_frames_roll_with_and_without_sink():
    assert kept_frames(3, 0, 6) == [0, 1, 2]
    assert kept_frames(6, 0, 6) == [0, 1, 2, 3, 4, 5]
    assert kept_frames(9, 0, 6) == [3, 4, 5, 6, 7, 8]
    assert kept_frames(12, 0, 4) == [8, 9, 10, 11]
    assert kept_frames(9, 1, 6) == [0, 4, 5, 6, 7, 8]
    assert attended_frames(6, 3, 0, 6) == [3, 4, 5, 6, 7, 8]


def test_visible_is_the_block_causal_window():
    # frame 7 (block 6..8) sees 3..8; frame 2 (block 0..2) sees 0..2, its block-mates included
    assert [k for k in range(12) if visible(7, k, 3, 0, 6)] == [3, 4, 5, 6, 7, 8]
    assert [k for k in range(12) if visible(2, k, 3, 0, 6)] == [0, 1, 2]
    assert [k for k in range(12) if visible(10, k, 3, 1, 6)] == [0, 7, 8, 9, 10, 11]


def test_action_windows_pad_with_frame_zero_and_stop_before_the_last_frame():
    assert action_window(0, 12, 4) == [0] * 12
    assert action_window(1, 12, 4) == [0] * 9 + [1, 2, 3]
    assert action_window(3, 12, 4) == list(range(12))
    assert action_window(5, 12, 4) == list(range(8, 20))
    assert actions_needed(0, 3, 4) == 9 and actions_needed(3, 3, 4) == 21


def test_block_windows_gather_a_history_and_refuse_a_short_one():
    history = torch.arange(21.0)[:, None]                  # frame i holds the value i
    w = block_windows(history, 3, 3, 12, 4)
    assert w.shape == (3, 12, 1)
    assert w[:, :, 0].tolist() == [list(range(0, 12)), list(range(4, 16)), list(range(8, 20))]
    with pytest.raises(ValueError, match="reads 20 video frames"):
        block_windows(history[:19], 3, 3, 12, 4)
