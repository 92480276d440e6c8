"""Window index arithmetic and the decoder's receptive field (pure, no voice)."""

import pytest

from models.tts.piper.hifigan import ConvSpec, DecoderGeometry, UpsampleSpec, receptive_field
from models.tts.piper.windows import Window, WindowPlan, window_at

import piper_reference as plain


def _resblock2_level(kernels=(3, 5, 7), dilations=((1, 2), (2, 6), (3, 12))):
    return tuple(tuple(ConvSpec(k, d) for d in ds) for k, ds in zip(kernels, dilations))


# en_US-joe-medium: conv_pre k7, ups (8,16,4) (8,16,4) (4,8,2), resblock 2, conv_post k7.
JOE = DecoderGeometry(
    conv_pre=ConvSpec(7),
    upsamples=(UpsampleSpec(8, 16, 4), UpsampleSpec(8, 16, 4), UpsampleSpec(4, 8, 2)),
    resblocks=(_resblock2_level(),) * 3,
    conv_post=ConvSpec(7),
)


def test_receptive_field_of_joe_medium():
    assert JOE.hop == 256
    assert receptive_field(JOE) == (11, 11)


def test_level_spans_of_one_frame_and_of_a_core():
    from models.tts.piper.hifigan import level_spans

    # Samples of frame 0 read 48 samples around them at the audio rate, 58 at
    # 1/4 of it, 53 at 1/32, and 11 latent frames: the cropping bounds.
    assert level_spans(JOE, 0, 255) == ([(-53, 60), (-58, 121), (-48, 303)], (-11, 11))
    assert level_spans(JOE, 40 * 256, 52 * 256 - 1) == ([(267, 468), (2502, 3385), (10192, 13359)], (29, 62))


def test_receptive_field_of_a_bare_conv_stack():
    # No resblocks, one x2 upsampler with kernel 2: each output sample reads one
    # input frame; conv_pre k3 and conv_post k3 add one frame each side, the
    # post conv's reach of one sample rounds up to one frame.
    g = DecoderGeometry(ConvSpec(3), (UpsampleSpec(2, 2, 0),), ((),), ConvSpec(3))
    assert receptive_field(g) == (2, 2)


def test_core_sizes_double_up_to_the_cap():
    plan = WindowPlan(first_frames=12, max_frames=48, context_frames=11)
    assert [plan.core_frames(i) for i in range(5)] == [12, 24, 48, 48, 48]
    assert [WindowPlan(10, 35, 0).core_frames(i) for i in range(4)] == [10, 20, 35, 35]


def test_windows_cover_a_sentence_once_with_clipped_context():
    plan = WindowPlan(first_frames=12, max_frames=48, context_frames=11)
    assert plain.plan_windows(plan, 100) == [
        Window(0, 0, 12, 0, 23),
        Window(1, 12, 36, 1, 47),
        Window(2, 36, 84, 25, 95),
        Window(3, 84, 100, 73, 100),
    ]
    assert plain.plan_windows(plan, 5) == [Window(0, 0, 5, 0, 5)]


def test_core_offset_in_samples():
    assert Window(2, 36, 84, 25, 95).core_offset(256) == (11 * 256, 59 * 256)
    assert window_at(WindowPlan(), 0, 0, 418).core_offset(256) == (0, 12 * 256)


def test_bad_windows_are_rejected():
    with pytest.raises(ValueError):
        WindowPlan(first_frames=0)
    with pytest.raises(ValueError):
        WindowPlan(first_frames=20, max_frames=10)
    with pytest.raises(ValueError):
        window_at(WindowPlan(), 0, 10, 10)


def test_flow_runs_a_prefix_first_then_the_rest():
    from models.tts.piper.windows import FlowSpan, flow_span

    # First window reads [0, 23): only that prefix, reading 32 frames past it.
    assert flow_span(0, 23, 418, 32) == FlowSpan(0, 23, 0, 55)
    # The second window needs frame 46: the whole rest, in one go.
    assert flow_span(23, 47, 418, 32) == FlowSpan(23, 418, 0, 418)
    assert flow_span(100, 150, 418, 32) == FlowSpan(100, 418, 68, 418)
    assert flow_span(418, 418, 418, 32) is None
    assert flow_span(23, 23, 418, 32) is None
    # A short sentence is covered by the first span.
    assert flow_span(0, 20, 20, 32) == FlowSpan(0, 20, 0, 20)
    # Only a prefix of the prior known (80 frames): each span just what its window reads.
    assert flow_span(0, 23, 80, 32, whole=False) == FlowSpan(0, 23, 0, 55)
    assert flow_span(23, 47, 80, 32, whole=False) == FlowSpan(23, 47, 0, 79)
    assert flow_span(47, 47, 80, 32, whole=False) is None
